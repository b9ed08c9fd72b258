"""``python -m bench fidelity`` end to end on the tiny model in the shipped CPU precision: rows alone,
batched and in ChatTTS's own decode (bench/lib/reference.py), the verdict and the report's files.
(The decode loop's invariance itself, at the model's real depth and in both CPU precisions, is
tests/unit/test_batch_invariance.py's.)"""

from __future__ import annotations

import json

from bench.__main__ import main


def test_fidelity_passes_every_row_and_writes_its_report(tmp_path):
    argv = ["--sizes", "random-tiny", "--precisions", "int8", "--rows", "3", "--tokens", "12", "--out", str(tmp_path)]
    rc = main(["fidelity", *argv])
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0 and report["passed"], report["results"]
    assert [(x["precision"], x["path"], x["rows"]) for x in report["results"]] == [
        ("int8", path, 3) for path in ("alone vs batched", "ChatTTS vs alone", "ChatTTS vs batched")
    ]
    assert all(x["tokens_equal"] == 3 and x["min_cosine"] > 0.99 for x in report["results"])
    assert (tmp_path / "report.md").read_text().count("| random-tiny | cpu | int8 |") == 3
    assert (tmp_path / "report.png").stat().st_size > 0
