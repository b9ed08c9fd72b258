"""The fidelity bench at the deep test size (what CI runs of it): every row's tokens equal alone,
batched and in ChatTTS's own decode, alone vs batched bit-identical, in int8 and float32; its
report files written."""

from __future__ import annotations

import json

import pytest

from bench.__main__ import main


@pytest.mark.timeout(600)
def test_fidelity_at_the_deep_test_size_passes_every_row(tmp_path):
    rc = main(["fidelity", "--sizes", "random-deep", "--rows", "3", "--tokens", "12", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0 and report["passed"], report["results"]
    paths = {(x["precision"], x["path"]) for x in report["results"]}
    assert paths == {
        (p, x) for p in ("int8", "float32") for x in ("alone vs batched", "ChatTTS vs alone", "ChatTTS vs batched")
    }
    assert all(x["rows"] == 3 for x in report["results"])
    assert (tmp_path / "report.md").read_text().count("| random-deep | cpu |") == 6
    assert (tmp_path / "report.png").stat().st_size > 0
