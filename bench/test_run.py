"""Unit tests of the subcommands' own logic (no model, no Ray): the command line, the run's
config overrides and report, and every committed report rendered again from its JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.__main__ import SUBCOMMANDS, main
from bench.lib.report import get
from bench.run_report import KIND, check_targets, compute_ratios, load_key

RESULTS = Path(__file__).parent / "results"
ABSOLUTE = re.compile(r"/(work|root|tmp|home)/[A-Za-z._-]+/")


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_parses_its_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert f"python -m bench {name}" in capsys.readouterr().out


def test_run_overrides_reach_the_config_and_the_report():
    import argparse

    from bench.run import add_arguments, serve_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(
        [
            "--acoustic-threads",
            "1",
            "--vocoder-replicas",
            "2",
            "--max-rows",
            "8",
            "--acoustic-cpus",
            "0.5",
            "--set",
            "applications.chattts.deployments.Vocoder.max_ongoing_requests=64",
        ]
    )
    cfg, shown = serve_config(a, port=20001)
    dep = "applications.chattts.deployments"
    assert get(cfg, "http_options", "port") == 20001
    assert get_path_(cfg, f"{dep}.Acoustic.ray_actor_options.runtime_env.env_vars.OMP_NUM_THREADS") == "1"
    assert get_path_(cfg, f"{dep}.Vocoder.autoscaling_config") == {
        "min_replicas": 2,
        "max_replicas": 2,
        "initial_replicas": 2,
    }
    assert get_path_(cfg, "applications.chattts.args.acoustic.max_rows") == 8
    assert get_path_(cfg, f"{dep}.Vocoder.max_ongoing_requests") == 64
    assert list(shown) == [
        f"{dep}.Vocoder.max_ongoing_requests",
        "Acoustic.ray_actor_options.num_cpus",
        "Acoustic.threads",
        "Vocoder.replicas",
        "acoustic.max_rows",
    ]


def get_path_(cfg, dotted):
    from bench.lib.serve import get_path

    return get_path(cfg, dotted)


def test_ratios_and_targets():
    report = {
        "ceiling": {
            "ceiling": {"1": 0.5, "8": 1.4},
            "methods": {"engine": {"8": {"audio_s_per_s": 1.4, "decode_audio_s_per_s": 2.0}}},
            "first_chunk": {"raw_s": 0.5},
        },
        "baseline": {"closed": {"8": {"audio_s_per_s": 0.4, "latency_s": {"p99": 80.0}}}},
        "serve": {
            "closed": {"1": {"ttfb_s": {"p50": 0.6}}, "8": {"audio_s_per_s": 1.3, "latency_s": {"p99": 30.0}}},
            "open": {
                "continuous": {load_key(0.7): {"latency_s": {"mean": 10.0}}},
                "window": {load_key(0.7): {"latency_s": {"mean": 20.0}}},
            },
        },
    }
    r = compute_ratios(report)
    assert r["serve_vs_baseline_c8"] == pytest.approx(3.25)
    assert r["serve_vs_ceiling_c8"] == pytest.approx(1.3 / 1.4, abs=1e-4)
    assert r["ttfb_vs_first_chunk"] == pytest.approx(1.2)
    assert r["p99_vs_baseline_c8"] == pytest.approx(0.375)
    assert r["continuous_vs_window_mean_latency_70"] == pytest.approx(2.0)
    assert r["serve_vs_decode_ceiling_c8"] == pytest.approx(0.65)
    t = check_targets(r)
    assert t["serve_vs_baseline_c8"]["met"] is False and t["p99_vs_baseline_c8"]["met"] is True
    report["ratios"], report["targets"] = r, t
    assert "serve_vs_ceiling_c8" in KIND.markdown(report)
    report["serve"]["pinned"] = {"acoustic_cpus": [0], "rest_cpus": [1]}
    md = KIND.markdown(report)
    assert "engine's decode alone" in md and "the Acoustic replica on CPUs [0]" in md


def committed_reports() -> list[Path]:
    return sorted(
        {p.parent for pattern in ("*/report.json", "*/*/report.json", "*/realtime.json") for p in RESULTS.glob(pattern)}
    )


def test_committed_results_carry_no_absolute_path():
    for path in RESULTS.rglob("*"):
        if path.is_file() and path.suffix != ".png":
            assert not ABSOLUTE.search(path.read_text(errors="replace")), path


@pytest.mark.parametrize("d", committed_reports(), ids=lambda d: d.relative_to(RESULTS).as_posix())
def test_committed_reports_render_again(d, tmp_path):
    """``python -m bench report``: the renderers read every committed report; a run's ratios
    computed again from its numbers are the ones it recorded, and its tables are the committed ones."""
    assert main(["report", str(d), "--to", str(tmp_path)]) == 0
    out = tmp_path / d.name
    rendered = {p.name for p in out.iterdir()}
    assert rendered & {"report.md", "timeline.png"}, rendered
    report = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else None
    if report is not None and "ratios" in report and "steps" not in report:
        assert compute_ratios(report) == report["ratios"]
        assert (out / "report.md").read_text() == (d / "report.md").read_text()
