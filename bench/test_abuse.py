"""The abuse bench's pure parts (no Ray, no app): ``pytest bench/test_abuse.py``."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import abuse
from bench import abuse_attackers as att


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
