"""Fair admission between clients (serve_app/engine/decode/scheduler.py) and the per-client queue
cap, first on the scheduler alone (no model), then on the engine with random-tiny weights: a
polite client beside a heavy one gets a slot at the next step. What that does to its first
chunk's latency is measured by ``python -m bench fairness``."""

from __future__ import annotations

import pytest
from support.engine import drain, seg

from serve_app.engine.config import AcousticConfig
from serve_app.engine.decode.row import Row
from serve_app.engine.decode.scheduler import AGING_SECONDS, PRESENCE_SECONDS, Scheduler, prompt_len_estimate
from serve_app.engine.decode.streams import RowStream
from serve_app.engine.errors import ClientQueueFull, EngineOverloaded, RequestTooLarge
from serve_app.engine.types import INTERNAL_CLIENT, SegmentRequest
from serve_app.engine.voices import OPENAI_VOICES, SpeakerSampler
from serve_app.errors import to_api_error

# ============================================================================== scheduler alone

_seq = iter(range(10**9))


def row(client: str, priority: int = 0, max_new: int = 10, submitted_at: float = 0.0, after=None) -> Row:
    seq = next(_seq)
    req = SegmentRequest(text="abc", spk_emb=None, seed=seq, max_new_tokens=max_new, priority=priority, client=client)
    stream = RowStream(seq, None)
    stream.submitted_at = submitted_at
    return Row(req=req, stream=stream, after=after)


def queue(*rows: Row, per_client: int | None = None) -> Scheduler:
    s = Scheduler()
    for r in rows:
        s.push(r, r.stream.row_id, max_queued=10_000, max_per_client=per_client)
    return s


def clients(rows: list[Row]) -> str:
    return "".join(r.req.client for r in rows)


def waiting_for(s, client: str) -> int:
    """Rows of ``client`` still queued (read from the queues, not from the scheduler's own count)."""
    return sum(1 for w in s._all() if w.row.req.client == client)


def running(*owners: str) -> list[Row]:
    rows = [row(c) for c in owners]
    for r in rows:
        r.prompt_len = 1
    return rows


def test_round_robin_between_a_heavy_and_a_light_client():
    """200 rows of A queued first, then one of B: B's row is the second admitted, not the 201st."""
    s = queue(*[row("A") for _ in range(200)], row("B"))
    assert (
        clients(s.pop_admissible([], AcousticConfig(max_rows=4, max_running_rows_per_client=None), now=0.0)) == "ABAA"
    )
    assert waiting_for(s, "A") == 197 and waiting_for(s, "B") == 0


def test_turns_alternate_and_each_clients_rows_keep_their_order():
    a = [row("A") for _ in range(3)]
    b = [row("B") for _ in range(3)]
    s = queue(*a, *b)
    got = s.pop_admissible([], AcousticConfig(max_rows=6, max_running_rows_per_client=None), now=0.0)
    assert clients(got) == "ABABAB"
    assert [r for r in got if r.req.client == "A"] == a and [r for r in got if r.req.client == "B"] == b


def test_a_client_served_last_goes_behind_one_that_has_waited():
    """Round robin across steps too: the client that got the last slot comes after the others."""
    s = queue(*[row("A") for _ in range(5)], *[row("B") for _ in range(5)])
    cfg = AcousticConfig(max_rows=1, reserved_rows=0)
    order = ""
    for t in range(6):
        order += clients(s.pop_admissible([], cfg, now=float(t) / 10))
    assert order == "ABABAB"


def test_freed_slots_go_to_clients_under_their_fair_share():
    """A holds 3 of 4 slots, B 1: B's next row takes the freed slot even though A's turn is older."""
    s = queue(row("A", submitted_at=0.0), row("B", submitted_at=1.0))
    got = s.pop_admissible(running("A", "A", "B"), AcousticConfig(max_rows=4, reserved_rows=0), now=2.0)
    assert clients(got) == "B"


def test_a_reserved_slot_takes_a_new_clients_first_row_at_once():
    """A fills every slot; B (nothing running) gets one of the reserved slots beyond max_rows, A
    does not, and neither does B's second row (a client never holds more than max_rows)."""
    cfg = AcousticConfig(max_rows=4, reserved_rows=1)
    s = queue(row("A"), row("B"), row("B"), row("C"))
    assert clients(s.pop_admissible(running(*"AAAA"), cfg, now=0.0)) == "B"
    # The reserve is taken: C waits for a slot to free; when A's row leaves, the fair share
    # (4 slots / 3 clients) sends it to C, then B, before A.
    assert s.pop_admissible(running(*"AAAAB"), cfg, now=0.0) == []
    assert clients(s.pop_admissible(running(*"AAAB"), cfg, now=0.0)) == "C"
    assert clients(s.pop_admissible(running(*"AAB"), cfg, now=0.0)) == "B"
    # No reserve: B waits like everyone.
    s = queue(row("B"))
    assert s.pop_admissible(running(*"AAAA"), AcousticConfig(max_rows=4, reserved_rows=0), now=0.0) == []


def test_a_lone_client_still_gets_every_slot():
    s = queue(*[row("A") for _ in range(20)])
    assert clients(s.pop_admissible([], AcousticConfig(max_rows=16), now=0.0)) == "A" * 16


def test_max_running_rows_per_client_caps_each_client_while_another_is_present():
    cfg = AcousticConfig(max_rows=8, max_running_rows_per_client=2)
    s = queue(*[row("A") for _ in range(5)], *[row("B") for _ in range(5)])
    assert clients(s.pop_admissible(running("A"), cfg, now=0.0)) == "ABB"  # two each at most
    # B's rows leave; A is alone again once B has been gone PRESENCE_SECONDS: every slot is A's.
    s = queue(*[row("A") for _ in range(10)])
    s.pop_admissible(running("B"), cfg, now=0.0)  # B was here at t=0
    assert clients(s.pop_admissible(running("A", "A"), cfg, now=1.0)) == ""
    assert clients(s.pop_admissible(running("A", "A"), cfg, now=PRESENCE_SECONDS + 1)) == "AAAAAA"


def test_the_services_own_rows_never_cap_a_client():
    """A replica's warm-up (``INTERNAL_CLIENT``) running now, or a moment ago, is nobody present:
    the one client of the moment still takes every slot (its start does not cap everyone's rows)."""
    cfg = AcousticConfig(max_rows=8, max_running_rows_per_client=2)
    s = queue(*[row("A") for _ in range(10)])
    assert clients(s.pop_admissible(running(INTERNAL_CLIENT), cfg, now=0.0)) == "A" * 7  # beside a running warm-up
    s = Scheduler()
    s.pop_admissible(running(INTERNAL_CLIENT), cfg, now=0.0)  # a warm-up a moment ago
    for r in [row("A") for _ in range(10)]:
        s.push(r, r.stream.row_id, max_queued=10_000, max_per_client=None)
    assert clients(s.pop_admissible([], cfg, now=1.0)) == "A" * 8


def test_the_default_cap_is_two_rows_while_another_client_is_present():
    s = queue(*[row("A") for _ in range(20)], row("B"))
    got = s.pop_admissible([], AcousticConfig(), now=0.0)
    assert clients(got) == "ABA"


def test_priority_levels_come_first_and_aging_lifts_a_waiting_client():
    cfg = AcousticConfig(max_rows=1, reserved_rows=0)
    high = row("B", priority=2, submitted_at=10.0)
    # A's turn has waited 2.5 aging periods: level 2, then the older turn goes first.
    s = queue(row("A", submitted_at=10.0 - 2.5 * AGING_SECONDS), high)
    assert clients(s.pop_admissible([], cfg, now=10.0)) == "A"
    s = queue(row("A", submitted_at=10.0 - 1.5 * AGING_SECONDS), row("B", priority=2, submitted_at=10.0))
    assert clients(s.pop_admissible([], cfg, now=10.0)) == "B"


def test_a_clients_turn_ages_from_its_last_slot_not_from_its_rows_arrival():
    """A's rows have waited 10 s, B's 1 s: A goes first, then B, though A's rows are all older
    than B's (FIFO by row would serve every A row first)."""
    s = queue(*[row("A", submitted_at=0.0) for _ in range(3)], row("B", submitted_at=9.0))
    cfg = AcousticConfig(max_rows=1, reserved_rows=0)
    order = "".join(clients(s.pop_admissible([], cfg, now=now)) for now in (10.0, 11.0, 12.0))
    assert order == "ABA"


def test_later_segments_and_budget_keep_their_rules_between_clients():
    first = row("A")
    later = row("A", after=first.stream)
    big = row("B", max_new=500)
    small = row("C", max_new=10)
    cfg = AcousticConfig(token_budget=prompt_len_estimate(big.req) + 500 - 1)
    s = queue(later, big, small)
    # A's later segment waits for its first; B's big row does not fit beside a running row and
    # stops admission there: C's small row does not overtake it.
    assert s.pop_admissible(running("X"), cfg, now=0.0) == []
    assert clients(s.pop_admissible([], cfg, now=0.0)) == "B"
    # Cancelled rows come out whatever the slots.
    gone = row("D")
    gone.stream.cancel()
    s.push(gone, gone.stream.row_id, max_queued=100)
    assert s.pop_admissible(running(*"XXXXXXXXXXXXXXXXX"), AcousticConfig(), now=0.0) == [gone]


def test_per_client_queue_cap_refuses_only_that_client():
    s = queue(*[row("A") for _ in range(3)], per_client=4)
    with pytest.raises(ClientQueueFull, match="client A: 3 waiting, this request adds 2, at most 4") as err:
        s.push_all([(r, r.stream.row_id) for r in (row("A"), row("A"))], max_queued=100, max_per_client=4)
    assert isinstance(err.value, EngineOverloaded)
    assert waiting_for(s, "A") == 3  # nothing of the refused request, A's own rows untouched
    s.push_all([(r, r.stream.row_id) for r in (row("B"), row("B"))], max_queued=100, max_per_client=4)
    assert waiting_for(s, "B") == 2
    api = to_api_error(err.value)
    assert (api.status, api.code, api.type, api.headers.get("Retry-After")) == (
        429,
        "too_many_queued_rows",
        "rate_limit_error",
        "2",
    )
    # A request that can never fit is 413, not 429.
    with pytest.raises(RequestTooLarge, match="5 segments; at most 4 .*max_queued_rows_per_client"):
        s.push_all([(r, r.stream.row_id) for r in [row("C") for _ in range(5)]], max_queued=100, max_per_client=4)
    # The whole queue full is still 503 overloaded.
    with pytest.raises(EngineOverloaded, match="queue full") as full:
        s.push_all([(row("D"), 1)], max_queued=5, max_per_client=4)
    assert not isinstance(full.value, ClientQueueFull)


# ============================================================================== on the engine


@pytest.fixture(scope="module")
def spk(tiny_model) -> str:
    return SpeakerSampler(tiny_model.chat.speaker).from_seed(OPENAI_VOICES["alloy"])


def heavy(spk: str, n: int = 200, tokens: int = 60) -> list[SegmentRequest]:
    return [seg(spk, tokens, seed=i, client="heavy") for i in range(n)]


def test_a_polite_clients_row_joins_at_the_next_step_beside_a_heavy_one(make_engine, spk):
    engine = make_engine(max_rows=4, reserved_rows=1)
    hs = engine.submit_all(heavy(spk))
    while engine.running_rows < 4:
        engine.step()
    assert {r.req.client for r in engine.batch.rows} == {"heavy"}
    polite = engine.submit(seg(spk, 20, seed=999, client="polite"))
    engine.step()
    assert polite.admitted_at is not None and engine.running_rows == 5
    for s in hs:
        s.cancel()
    engine.run_until_idle()
    assert drain(polite)[1].shape[0] == 20


def test_a_client_past_its_queue_share_gets_429_and_the_others_go_on(make_engine, spk):
    engine = make_engine(max_queued_rows_per_client=8)
    mine = engine.submit_all([seg(spk, 10, seed=i, client="A") for i in range(6)])
    with pytest.raises(ClientQueueFull):
        engine.submit_all([seg(spk, 10, seed=i, client="A") for i in range(3)])
    other = engine.submit_all([seg(spk, 10, seed=i, client="B") for i in range(6)])
    with pytest.raises(RequestTooLarge):
        engine.submit_all([seg(spk, 10, seed=i, client="C") for i in range(9)])
    engine.run_until_idle()
    assert all(drain(s)[1].shape[0] == 10 for s in mine + other)
    assert engine.stats.rows_cancelled == 0
