"""The dialogue bench's pure parts (no model, no Ray): ``pytest bench/test_dialogue.py``."""

from __future__ import annotations

import pytest

from bench.lib.corpus import SAMPLE_RATE
from bench.studies import dialogue


def test_the_turns_are_ten_two_voices_taking_turns_about_thirty_seconds():
    plan = dialogue.planned()
    assert len(plan) == 10
    assert [p["voice"] for p in plan] == ["alloy", "echo"] * 5
    assert 27 <= sum(p["audio_s"] for p in plan) <= 33
    assert any(p["input"].isascii() for p in plan) and any(not p["input"].isascii() for p in plan)


def test_turn_seeds_give_each_segment_the_seed_the_dialogue_gives_it():
    from serve_app.engine.planner import segment_seed

    counts = [1, 2, 1, 3]
    seeds = dialogue.turn_seeds(7, counts)
    script = [segment_seed(7, i) for i in range(sum(counts))]  # the dialogue: seeded by place in the script
    alone = [segment_seed(s, j) for s, n in zip(seeds, counts) for j in range(n)]  # each turn's own request
    assert alone == script
    assert seeds[0] == 7


def test_segments_per_turn_counts_a_timed_answer():
    segs = [{"turn": 0}, {"turn": 1}, {"turn": 1}, {"turn": 3}]
    assert dialogue.segments_per_turn(segs, 4) == [1, 2, 0, 1]


def test_the_dialogue_is_the_turns_with_a_pause_between():
    pcm = [b"\x01\x00" * 3, b"\x02\x00" * 2]
    joined = dialogue.as_dialogue(pcm, 0.001)  # 24 samples
    assert joined == pcm[0] + b"\x00\x00" * 24 + pcm[1]
    plan = [{"tokens": [10]}, {"tokens": [5, 6]}]
    exp = dialogue.expected_samples(plan, 0.4)
    assert exp["dialogue"] - exp["sequential"] == round(0.4 * SAMPLE_RATE)


def _way(wall, samples, steps, row_steps):
    counters = dict.fromkeys(dialogue.COUNTERS, 0) | {
        "steps": steps,
        "row_steps": row_steps,
        "decode_seconds": steps * 0.01,
    }
    return {"wall_s": wall, "first_audio_s": 0.2, "samples": samples, "counters": counters}


def test_summarize_takes_p50s_ratios_rows_per_step_and_checks_the_audio():
    pause = dialogue.pause_samples(0.4) * (len(dialogue.TURNS) - 1)
    rounds = [
        {"dialogue": _way(d, 1000 + pause, 100, 1000), "sequential": _way(s, 1000, 1000, 1200), "identical_pcm": True}
        for d, s in ((10.0, 30.0), (12.0, 31.0), (11.0, 27.5))
    ]
    s = dialogue.summarize(rounds, 0.4)
    assert s["dialogue"]["wall_s_p50"] == 11.0 and s["sequential"]["wall_s_p50"] == 30.0
    assert s["ratio_p50"] == pytest.approx(30 / 11, abs=1e-3)
    assert s["ratio_per_round"] == [3.0, pytest.approx(2.583, abs=1e-3), 2.5]
    assert s["dialogue"]["engine"]["mean_rows_per_step"] == 10.0
    assert s["sequential"]["engine"]["mean_rows_per_step"] == 1.2
    assert s["dialogue"]["engine"]["steps"] == 300 and s["dialogue"]["engine"]["ms_per_decode_step"] == 10.0
    assert s["audio_match"] and s["identical_pcm_rounds"] == "3 of 3"
    rounds[1]["sequential"]["samples"] = 999  # one turn came back short
    assert not dialogue.summarize(rounds, 0.4)["audio_match"]
    assert not dialogue.summarize(rounds[:1], 0.4, {"dialogue": 1, "sequential": 1})["audio_match"]


def test_counters_without_stats_are_left_out():
    assert dialogue.counter_delta(None, {"steps": 1}) is None
    assert dialogue.engine_summary(None) == {}
    d = dialogue.counter_delta({"steps": 2, "row_steps": 4}, {"steps": 5, "row_steps": 13})
    assert d["steps"] == 3 and d["row_steps"] == 9 and d["decode_seconds"] == 0


def test_timeline_keeps_a_point_per_interval_and_the_last():
    chunks = [(0.1, 4800), (0.15, 4800), (0.5, 4800), (0.55, 4800)]
    assert dialogue.timeline(chunks) == [[0.1, 0.1], [0.5, 0.3], [0.55, 0.4]]


def test_the_report_renders_from_a_partial_report(tmp_path):
    rounds = [
        {
            "round": 0,
            "dialogue": {**_way(10.0, 5, 1, 1), "timeline": [[1.0, 2.0]]},
            "sequential": {**_way(30.0, 5, 1, 1), "timeline": [[3.0, 2.0]], "turn_wall_s": [3.0] * 10},
        }
    ]
    report = {
        "meta": {
            "started": "t",
            "command": "python -m bench dialogue",
            "weights": "random-tiny",
            "git": "x",
            "cpus": 2,
            "rounds": 1,
            "seed": 7,
            "pause_s": 0.0,
            "loadavg_start": [0.1],
        },
        "turns": dialogue.planned(),
        "rounds": rounds,
        "summary": dialogue.summarize(rounds, 0.0),
        "warnings": [],
    }
    dialogue.KIND.write(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "sequential / dialogue (p50): 3.00" in md and (tmp_path / "report.png").stat().st_size > 0
