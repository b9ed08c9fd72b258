"""The runners' own logic, without a model or Ray: the command line, ``run``'s config overrides,
ratios and report, every committed report rendered again from its JSON, the GPU check's Serve
configs, the abuse bench's attackers and report, the first-audio breakdown."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import abuse
from bench import abuse_attackers as att
from bench.__main__ import RUNNERS, main
from bench.gpu import SERVE_VARIANTS, GpuPlan, serve_config
from bench.lib import first_audio
from bench.lib.config import args_path, deployment_path, get_path, load_config
from bench.lib.report import get
from bench.report import renderer
from bench.run_report import KIND, check_targets, compute_ratios, load_key

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
ABSOLUTE = re.compile(r"/(work|root|tmp|home)/[A-Za-z._-]+/")
# Written by an earlier renderer of their runner (its tables have changed since): rendered, not equal.
EARLIER_RENDERER = {
    "abuse-2026-12-01",
    "abuse-2026-12-01-guard",
    "abuse-2026-12-01-guard/parts/costly-only",
    "abuse-2026-12-01-guard/parts/flood-only",
    "abuse-2026-12-01-guard/parts/floods-only",
    "abuse-2026-12-01-guard/parts/idle-only",
    "abuse-2026-12-01-guard/parts/slow-only",
    "abuse-2026-12-01-guard/rerun",
    "batch-2026-12-03",
    "batch-2026-12-06-groups",
}
# The studies' (bench/README.md, "Studies"): rendered by their code at its revision.
STUDIES = ("autoscale-", "dialogue-", "jobs-", "memory-", "step-", "vocoder-")


@pytest.mark.parametrize("name", RUNNERS)
def test_every_runner_parses_its_help(name, capsys):
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
    from bench.lib.config import get_path

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
    """Every committed output directory (one with a report's JSON)."""
    names = ("report.json", "realtime.json", "abuse.json", "batch.json", "*.json")
    return sorted({p.parent for name in names for p in RESULTS.rglob(name) if p.parent.name != "logs"})


def test_committed_results_carry_no_absolute_path():
    for path in RESULTS.rglob("*"):
        if path.is_file() and path.suffix != ".png":
            assert not ABSOLUTE.search(path.read_text(errors="replace")), path


@pytest.mark.parametrize("d", committed_reports(), ids=lambda d: d.relative_to(RESULTS).as_posix())
def test_committed_reports_render_again(d):
    """``python -m bench report``'s renderers read every committed report of a runner and give its
    committed report.md again (a run's ratios too, computed again from its numbers); a study's
    report is refused with where its code is."""
    name = d.relative_to(RESULTS).as_posix()
    if name.startswith(STUDIES):
        with pytest.raises(ValueError, match="Studies"):
            renderer(d)
        return
    path, kind = renderer(d)
    report = json.loads(path.read_text())
    if "ratios" in report:
        assert compute_ratios(report) == report["ratios"]
    if name not in EARLIER_RENDERER:
        assert kind.markdown(report) == (d / "report.md").read_text()
    else:
        assert kind.markdown(report).startswith("# ")


@pytest.mark.parametrize("d", ["quick-2026-12-07-b", "fidelity-2026-12-05", "realtime-2026-12-02", "abuse-2026-12-04"])
def test_report_renders_a_directory_again_elsewhere(d, tmp_path):
    assert main(["report", str(RESULTS / d), "--to", str(tmp_path)]) == 0
    out = tmp_path / d
    assert (out / "report.md").read_text() == (RESULTS / d / "report.md").read_text()
    assert not (RESULTS / d / "report.png").exists() or (out / "report.png").stat().st_size > 10000


def test_report_compares_runs_and_refuses_a_studys_report(capsys):
    assert main(["report", str(RESULTS / "step-2026-12-02")]) == 1
    assert "Studies" in capsys.readouterr().err
    runs = [RESULTS / "quick-2026-12-07-b", RESULTS / "pin-2026-12-07" / "pinned"]
    assert main(["report", "--compare", *map(str, runs)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| run | overrides | c8 audio s/s |") and len(table) == 4
    assert table[2].startswith("| quick-2026-12-07-b | (config defaults) | 2.")


# ------------------------------------------------------------------ gpu: the Serve variants' configs


def test_each_variant_asks_for_its_gpu_share_and_one_replica_gets_the_slots_of_two():
    base = load_config(GpuPlan().config)
    args, acoustic = args_path(base), deployment_path(base, "Acoustic")
    cfgs = {v: serve_config(GpuPlan(), v, port=20001)[0] for v in SERVE_VARIANTS}
    for variant, (replicas, num_gpus) in SERVE_VARIANTS.items():
        cfg = cfgs[variant]
        assert get_path(cfg, f"{acoustic}.ray_actor_options.num_gpus") == num_gpus
        auto = get_path(cfg, f"{acoustic}.autoscaling_config")
        assert auto["min_replicas"] == auto["max_replicas"] == replicas
        assert get_path(cfg, f"{args}.model.device") == "cuda"
        assert get_path(cfg, f"{args}.model.weights.source") == "random"
    one, two = cfgs["serve_1x1"], cfgs["serve_2x0.5"]
    for key in ("max_rows", "token_budget"):
        assert get_path(one, f"{args}.acoustic.{key}") == 2 * get_path(two, f"{args}.acoustic.{key}")
    assert get_path(one, f"{acoustic}.max_ongoing_requests") == 2 * get_path(two, f"{acoustic}.max_ongoing_requests")


def test_a_dry_run_reserves_no_gpu_and_decodes_on_cpu():
    cfg, shown = serve_config(GpuPlan.dry(), "serve_1x1", port=20001)
    acoustic = deployment_path(cfg, "Acoustic")
    assert get_path(cfg, f"{acoustic}.ray_actor_options.num_gpus") == 0
    assert shown["args.model.device"] == "cpu" and shown["model.weights.source"] == "random-tiny"


# ------------------------------------------------------------------ abuse: the attackers and the report


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    abuse.add_arguments(p)
    return p.parse_args(list(argv))


def test_every_attacker_is_on_by_default_and_only_turns_the_others_off():
    a = _args()
    assert all(getattr(a, dest) > 0 for _, dest, _, _ in att.ATTACKERS.values())
    a = _args("--only", "dot-jobs,public-page-keys")
    att.apply_only(a)
    on = {name for name, (_, dest, _, _) in att.ATTACKERS.items() if getattr(a, dest)}
    assert on == {"dot-jobs", "public-page-keys"}
    with pytest.raises(SystemExit):
        att.apply_only(_args("--only", "nobody"))


def test_dot_job_texts_are_full_stops_and_twelve_digit_numbers_of_the_asked_length():
    texts = att.dot_job_texts(200_000)
    assert {len(t) for t in texts.values()} == {200_000}
    assert set(texts["dots"]) == {"."}
    numbers = texts["numbers"].split()
    assert all(len(n) == 12 and n.isdigit() for n in numbers[:-1])
    mixed = texts["dots+numbers"]
    assert set(mixed[:100_000]) == {"."} and set(mixed[100_000:]) <= set("0123456789 ")


def test_silence_turns_pass_the_length_limit_and_exceed_the_script_silence():
    from serve_app.protocol import DialogueRequest

    turns = att.silence_turns()
    req = DialogueRequest.model_validate({"turns": turns})
    assert len(req.input) <= 4096  # ingress.max_input_chars: refused for its silence, not its length
    breaks_s = sum(t["input"].count('time="10s"') * 10 for t in turns)
    assert breaks_s > 480  # segments.max_silence_seconds


def test_a_tally_keeps_each_outcomes_slowest_answer_and_the_report_shows_it():
    t = att.Tally()
    t.add("401", 0.2)
    t.add("401", 1.5)
    t.add("429 too_many_refusals")
    assert t.outcomes == {"401": 2, "429 too_many_refusals": 1} and t.slowest_s == {"401": 1.5}
    report = {
        "meta": {"started": "now", "command": "python -m bench abuse", "weights": "random-tiny"},
        "attackers": {"unkeyed-slow-bodies": dict(t.outcomes)},
        "attackers_slowest_s": {"unkeyed-slow-bodies": t.slowest_s},
        "ingress_loop_stall_ms": {"alone": {"longest_ms": 30.0}, "attacked": {"longest_ms": 80.0}},
    }
    md = abuse.KIND.markdown(json.loads(json.dumps(report)))
    assert "401: 2 (1.5 s)" in md and "429 too_many_refusals: 1," not in md
    assert "| late wake | 30.0 | 80.0 |" in md


# ------------------------------------------------------------------ the first-audio breakdown


LINE = {
    "event": "speech",
    "request_id": "r1",
    "ttfb_s": 0.5,
    "first_audio": {
        "ingress_checks": 4.0,
        "plan_call": 7.0,
        "normalizer": 1.0,
        "vocoder_call": 480.0,
        "ingress_opened": 492.0,
        "vocoder_total": 470.0,
        "acoustic_call": 440.0,
        "acoustic_total": 425.0,
        "admit_window": 0.5,
        "queue_prefill": 100.0,
        "first_chunk": 320.0,
        "acoustic_handover": 0.4,
        "vocoder_feed": 28.0,
        "ingress_http": 3.0,
    },
}


def test_hops_add_up_to_the_client_ttfb_and_split_the_proxy():
    h = first_audio.hops_of(0.52, LINE, proxy=510.0)
    assert h["proxy"] == 20.0 and h["client_http"] == 10.0 and h["proxy_ingress"] == 7.0 and h["ingress_http"] == 3.0
    assert h["plan_handle"] == 6.0 and h["vocoder_handle"] == 10.0 and h["acoustic_handle"] == 15.0
    assert h["model"] == 448.0 and round(h["service"], 6) == 72.0
    parts = [n for n, _ in first_audio.HOPS if n not in ("client_http", "proxy_ingress", "ingress_http")] + [
        "ingress_other"
    ]
    assert abs(sum(h[n] for n in parts) - h["ttfb"]) < 1e-6


def test_a_line_without_the_stages_part_is_left_out(tmp_path):
    logs = tmp_path / "logs" / "serve"
    logs.mkdir(parents=True)
    hit = {**LINE, "request_id": "r2", "first_audio": {"ingress_checks": 1.0}}
    text = "".join(f"INFO x chattts_Ingress abc -- {json.dumps(x)}\n" for x in (LINE, hit)) + "INFO not json\n"
    (logs / "replica_chattts_Ingress_abc.log").write_text(text)
    lines = first_audio.read_ingress_log(str(tmp_path))
    assert set(lines) == {"r1", "r2"}
    recs = [
        SimpleNamespace(request_id="r1", ttfb=0.52, server_timing="proxy;dur=510.0"),
        SimpleNamespace(request_id="r2", ttfb=0.1, server_timing=None),
        SimpleNamespace(request_id="r3", ttfb=0.1, server_timing=None),
    ]
    b = first_audio.breakdown(recs, lines)
    assert b["joined"] == 1 and b["hops_ms"]["service"]["p50"] == 72.0
    assert first_audio.proxy_ms("cache;dur=1, proxy;dur=2.5") == 2.5 and first_audio.proxy_ms(None) is None
    report = {"serve": {"closed": {"1": {"first_audio": b}}}}
    assert any(line.startswith("| service | 72.0 |") for line in first_audio.markdown(report))


def test_streams_counts_what_listeners_heard_and_holds_the_deadline_to_its_targets():
    from bench import streams

    def served(stall: float, start: float, audio: float = 4.0) -> dict:
        return {
            "status": 200,
            "first_audio_s": 0.3,
            "audio_s": audio,
            "stall_s": stall,
            "started": start,
            "playing": (start + 0.8, start + 0.8 + audio + stall),
            "download_s": 1.0,
        }

    refused = {"status": 503, "code": "capacity_exhausted", "answered_s": 0.8, "retry_after": "2"}
    failed = {"status": 500, "code": "synthesis_failed", "answered_s": 0.1, "retry_after": None}
    lv = streams.summarise([served(0.0, 0.0), served(0.2, 1.0), served(3.0, 2.0), refused, failed], 4, 0.0, 10.0)
    assert (lv["streams"], lv["smooth"], lv["refused"], lv["other_errors"], lv["server_errors"]) == (3, 2, 1, 1, 1)
    assert lv["stall_s"] == {"total": 3.2, "worst": 3.0}
    assert lv["smooth_at_once"] == pytest.approx(0.82)  # (4 + 4.2) s of smooth playing in 10 s
    assert lv["goodput"] == pytest.approx(0.8)  # only smooth streams' audio
    fair = {**lv, "smooth": 1}
    report = {
        "capacity_audio_s_per_s": 2.5,
        "schedulings": {"fair": {"loads": {"1.5": fair}}, "deadline": {"loads": {"0.5": lv, "1.5": lv}}},
    }
    t = streams.targets(report)
    assert t["deadline 0.5x: streams smooth (of 3)"]["met"] is False  # one stream stalled 3 s
    assert t["1.5x: smooth streams deadline / fair"]["met"] is True  # 2 against 1
    assert t["deadline 1.5x: 5xx other than capacity_exhausted"]["met"] is False
    report["meta"] = {
        "started": "now",
        "command": "python -m bench streams",
        "weights": "random-tiny",
        "prebuffer_s": 0.5,
        "duration_s": 10,
        "probe_clients": 4,
        "loadavg_start": 0.1,
    }
    report["targets"] = t
    md = streams.KIND.markdown(report)
    assert "deadline 1.5x" in md and "2 / 3" in md
