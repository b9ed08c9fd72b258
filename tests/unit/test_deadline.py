"""Deadline scheduling (serve_app/engine/decode/deadline.py) and its parts: the listener's clock
(engine/playback.py's PlaybackClock, tested in test_playback.py) over a request's segments in
order (decode/playback.py), the step-time capacity
model (decode/capacity.py). First without a model, on synthetic rows and an injected clock
(unit tests of the order, hypothesis for the rule's invariants, a simulated overload for
starvation), then on the engine with random-tiny weights and an injected clock."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engine import decode_alone, drain, seg

from serve_app.engine.config import AcousticConfig
from serve_app.engine.decode.capacity import EWMA_ALPHA, StepModel
from serve_app.engine.decode.deadline import LOOKAHEAD_S, Capacity, committing, decide, is_new, slack_of
from serve_app.engine.decode.playback import Playback
from serve_app.engine.decode.row import Row
from serve_app.engine.decode.scheduler import Scheduler
from serve_app.engine.decode.streams import HiddenChunk, RowStream
from serve_app.engine.errors import CapacityExhausted
from serve_app.engine.pacing import TOKEN_SECONDS
from serve_app.engine.playback import PlaybackClock
from serve_app.engine.types import SegmentRequest

T = TOKEN_SECONDS
_ids = itertools.count()

# ============================================================================== clocks


def reqs(n: int, tokens: int = 100, client: str = "A", realtime: bool = True) -> list[SegmentRequest]:
    return [
        SegmentRequest(
            text="abc",
            spk_emb=None,
            seed=i,
            max_new_tokens=3 * tokens,
            target_tokens=tokens,
            client=client,
            realtime=realtime,
        )
        for i in range(n)
    ]


def stream_rows(
    n: int = 1, tokens: int = 100, client: str = "A", realtime: bool = True, at: float = 0.0, prebuffer: float = 0.3
) -> list[Row]:
    """One request's rows with its playback clock, as ``AcousticEngine.submit_all`` makes them."""
    rs = reqs(n, tokens, client, realtime)
    pb = Playback(rs, prebuffer, at)
    rows: list[Row] = []
    for i, r in enumerate(rs):
        s = RowStream(next(_ids), None)
        s.submitted_at, s.playback, s.segment = at, pb, i
        rows.append(Row(req=r, stream=s, after=rows[0].stream if i else None, prompt_len=1))
    pb.streams = [r.stream for r in rows]
    return rows


def send(row: Row, tokens: int, at: float, final: bool = False) -> None:
    """The engine sends ``tokens`` of ``row`` at ``at`` (a real stream send: the playback clock sees it)."""
    row.stream.send(HiddenChunk(torch.zeros(tokens, 1), row.chunks_sent, row.tokens_sent, final), now=at)
    row.chunks_sent += 1
    row.tokens_sent += tokens


def test_a_requests_segments_play_in_order_and_later_ones_have_their_deadline_ahead():
    rows = stream_rows(3, tokens=100, at=0.0, prebuffer=0.3)
    pb = rows[0].stream.playback
    assert slack_of(rows[0], 0.4) == pytest.approx(-0.4) and is_new(rows[0])  # waiting for first audio
    send(rows[0], 12, at=0.5)
    assert pb.started and not is_new(rows[0])
    # Playback starts at 0.8; segment 1's audio plays after segment 0's expected 100 tokens.
    assert slack_of(rows[0], 0.8) == pytest.approx(12 * T)
    assert slack_of(rows[1], 0.8) == pytest.approx(100 * T)
    assert slack_of(rows[2], 0.8) == pytest.approx(200 * T)
    # Audio of a later segment does not play (nor count for the stream) before the ones before it.
    send(rows[1], 50, at=0.9)
    assert pb.slack(0.9) == pytest.approx(12 * T - 0.1)
    assert slack_of(rows[1], 0.9) == pytest.approx((100 + 50) * T - 0.1)
    # Segment 0 ends shorter than expected: segment 1's audio follows at once and counts now.
    send(rows[0], 8, at=1.0, final=True)
    assert pb.head == 1 and pb.slack(1.0) == pytest.approx((20 + 50) * T - 0.2)
    assert slack_of(rows[2], 1.0) == pytest.approx((20 + 100) * T - 0.2)
    # Nothing more for a while: the listener runs dry at 0.8 + 70 T and the engine counts the silence.
    dry = 0.8 + 70 * T
    assert pb.stall_s(dry + 0.25) == pytest.approx(0.25)
    send(rows[1], 50, at=dry + 0.25, final=True)
    send(rows[2], 100, at=dry + 0.25, final=True)
    assert pb.finished and pb.stall_s(100.0) == pytest.approx(0.25)  # the silence it heard, no more


# ============================================================================== capacity


def test_the_step_model_learns_a_line_and_gives_the_rows_each_at_real_time():
    m = StepModel()
    assert m.rows_within(T, 16) is None and m.step_s(4) is None
    for _ in range(50):
        for rows in (2, 5):
            m.observe(rows, 0.004 + 0.002 * rows)  # a CPU: 4 ms a step plus 2 ms a row
    a, b = m.line()
    assert (a, b) == (pytest.approx(0.004), pytest.approx(0.002))
    assert m.step_s(8) == pytest.approx(0.020)  # never seen: from the line
    assert m.rows_within(T, 16) == 8  # 8 rows: 20 ms <= 21.3 ms; 9: 22 ms
    assert m.rows_within(T * 0.85, 16) == 7
    assert m.audio_rate(8) == pytest.approx(8 * T / 0.020)
    m.observe(5, 10.0)  # a pause (GC, a preempted thread) counts as 3x the estimate, not 10 s
    assert m.step_s(5) == pytest.approx(0.014 + EWMA_ALPHA * (3 - 1) * 0.014)


def test_sizes_never_measured_come_from_their_neighbours_and_the_slope():
    m = StepModel()
    for _ in range(20):
        for rows, t in ((12, 0.030), (14, 0.034), (16, 0.040)):  # a batch always nearly full
            m.observe(rows, t)
    assert m.step_s(13) == pytest.approx(0.032)  # between two sizes: interpolated
    b = m.slope(12)
    assert 0 < b <= 0.030 / 12 and m.step_s(8) == pytest.approx(0.030 - 4 * b)  # below: the slope down
    assert m.step_s(17) == pytest.approx(0.040 + m.slope(16))
    assert m.rows_within(T, 16) == max(r for r in range(1, 17) if m.step_s(r) <= T)


def test_one_size_seen_is_read_as_is_until_a_second_gives_the_slope():
    m = StepModel()
    for _ in range(5):
        m.observe(1, 0.005)
    assert m.line() is None and m.step_s(1) == pytest.approx(0.005) and m.step_s(4) == pytest.approx(0.005)
    assert m.rows_within(T, 3) == 3  # the loop tries more rows, and so measures them


# ============================================================================== the rule, unit by unit


def queue(*rows: Row) -> Scheduler:
    s = Scheduler()
    for r in rows:
        s.push(r, r.stream.row_id, max_queued=10_000)
    return s


def nonrt(client: str = "J", at: float = 0.0) -> Row:
    return stream_rows(1, client=client, realtime=False, at=at)[0]


def started(at: float, ahead_s: float, client: str = "A", n: int = 1) -> list[Row]:
    """A real-time request whose first segment, running, is ``ahead_s`` ahead of its listener at ``at``."""
    rows = stream_rows(n, tokens=1000, client=client, at=at - 1.0, prebuffer=0.0)
    send(rows[0], round((ahead_s + 1.0) / T), at=at - 1.0)
    rows[0].stream.admitted_at = at - 1.0
    return rows


CFG = AcousticConfig(max_rows=3, reserved_rows=0, park_ahead_s=4.0, resume_ahead_s=2.0, token_budget=10**6)


def test_urgent_rows_take_free_slots_least_slack_first():
    now = 10.0
    calm, tight = started(now, 1.5)[0], started(now, 0.2)[0]
    new = stream_rows(1, at=now - 0.5)[0]  # waited 0.5 s for first audio: slack -0.5
    d = decide([], [], queue(calm, tight, new), CFG.model_copy(update={"max_rows": 2}), now)
    assert d.admit == [new, tight] and d.park == []


def test_a_row_far_ahead_is_parked_for_an_urgent_one_and_a_row_between_the_thresholds_is_not():
    now = 10.0
    running = [started(now, 5.0)[0], started(now, 3.0)[0], started(now, 1.0)[0]]  # full batch
    urgent = started(now, 0.5)[0]
    s = queue(urgent)
    d = decide(running, [], s, CFG, now)
    assert d.park == [0] and d.admit == [urgent] and len(s) == 0
    # Nothing far enough ahead (3 s is between resume_ahead_s and park_ahead_s): it waits.
    s = queue(urgent)
    assert decide(running[1:] + [started(now, 1.0)[0]], [], s, CFG, now).park == [] and len(s) == 1


def test_a_parked_row_comes_back_when_urgent_and_otherwise_only_into_spare_capacity():
    now = 10.0
    held = started(now, 1.5)[0]  # parked, now urgent: it takes a slot from the row far ahead
    running = [started(now, 6.0)[0], started(now, 0.5)[0], started(now, 0.5)[0]]
    d = decide(running, [held], queue(), CFG, now)
    assert d.resume == [held] and d.park == [0]
    calm = started(now, 3.0)[0]  # parked, not urgent: a free slot, no preemption
    assert decide(running, [calm], queue(), CFG, now).resume == []
    assert decide(running[1:], [calm], queue(), CFG, now).resume == [calm]
    # While the rows that must keep 1x fill the measured capacity, it stays out even with a slot free.
    assert decide(running[1:], [calm], queue(), CFG, now, Capacity(admit_rows=2, park_rows=2)).resume == []


def test_a_new_stream_starts_only_within_the_measured_capacity():
    now = 10.0
    running = [started(now, 0.5)[0], started(now, 0.8)[0]]
    new = stream_rows(1, client="B", at=now - 2.0)[0]  # waited 2 s: the least slack of all
    cfg = CFG.model_copy(update={"max_rows": 8})
    s = queue(new)
    assert decide(running, [], s, cfg, now, Capacity(admit_rows=2, park_rows=3)).admit == [] and len(s) == 1
    assert decide(running, [], s, cfg, now, Capacity(admit_rows=3, park_rows=3)).admit == [new]
    # A row far ahead does not hold capacity: it is parked for the new stream.
    s = queue(new)
    d = decide([running[0], started(now, 6.0)[0]], [], s, cfg, now, Capacity(admit_rows=2, park_rows=2))
    assert d.admit == [new] and d.park == [1]
    # A started stream between two segments (its first one done, the next one waiting) holds its
    # place in the capacity: its next segment goes first, the new stream waits.
    x = stream_rows(2, tokens=50, client="X", at=now - 2.0, prebuffer=0.0)
    send(x[0], 50, at=now - 1.5, final=True)  # ends 50 tokens (1.07 s) of audio: 0.57 s left
    s = queue(new, x[1])
    d = decide([], [], s, cfg, now, Capacity(admit_rows=1, park_rows=1))
    assert d.admit == [x[1]] and len(s) == 1
    # Steps slower than real time even at one row: no smooth stream to protect, nothing held back.
    assert decide(running, [], queue(new), cfg, now, Capacity(admit_rows=0, park_rows=0)).admit == [new]
    # A job owed its slot does not keep the only stream a replica can carry from starting.
    job = nonrt(at=now - 5.0)
    job.stream.admitted_at = now - 5.0
    assert decide([job], [], queue(new), cfg, now, Capacity(admit_rows=1, park_rows=1)).admit == [new]


def test_one_keys_many_streams_are_not_capped_while_capacity_is_free():
    """Fifty calls through one agent platform's key: its streams take every free slot, though
    another client is present and ``max_running_rows_per_client`` is 2."""
    now = 10.0
    cfg = AcousticConfig(max_rows=16, token_budget=10**6)
    assert cfg.max_running_rows_per_client == 2
    other = started(now, 0.5, client="other")[0]
    calls = [stream_rows(1, client="platform", at=now - 0.1)[0] for _ in range(50)]
    d = decide([other], [], queue(*calls), cfg, now)
    assert len(d.admit) == 16 and {r.req.client for r in d.admit} == {"platform"}
    # Under contention the capacity is shared: a client under its share starts first.
    late = stream_rows(1, client="polite", at=now)[0]  # waited least of all
    d = decide(calls[:4], [], queue(*calls[4:8], late), cfg, now, Capacity(admit_rows=6, park_rows=8))
    assert d.admit[0] is late and len(d.admit) == 2


def test_rows_without_a_listener_get_what_is_left_and_yield_to_urgent_rows():
    now = 10.0
    jobs = [nonrt("J", at=now - 1.0) for _ in range(3)]
    for r in jobs:
        r.stream.admitted_at = now - 1.0
    urgent = started(now, 0.3)[0]
    # The first job admitted is protected (background_rows 1); the newest other one leaves.
    d = decide(jobs, [], queue(urgent), CFG, now)
    assert d.park == [2] and d.admit == [urgent]
    # A free slot goes to a real-time row first, whatever the job waited (under background_wait_s).
    s = queue(nonrt("K", at=now - 1.0), started(now, 3.0)[0])
    d = decide(jobs[:2], [], s, CFG, now)
    assert [r.req.realtime for r in d.admit] == [True]
    # With real-time rows at capacity, jobs wait even with a slot free; without them, they run.
    s = queue(nonrt("K", at=now - 1.0))
    assert decide([started(now, 1.0)[0]], [], s, CFG, now, Capacity(admit_rows=1, park_rows=1)).admit == []
    assert len(decide([], [], s, CFG, now, Capacity(admit_rows=1, park_rows=1)).admit) == 1


def test_a_job_that_waited_background_wait_s_is_owed_a_slot_and_keeps_it():
    now = 10.0
    urgent_rows = [started(now, 0.5)[0] for _ in range(2)] + [started(now, 6.0)[0]]
    job = nonrt("J", at=now - CFG.background_wait_s - 0.1)
    d = decide(urgent_rows, [], queue(job, started(now, 0.1)[0]), CFG, now)
    # The owed slot comes first: it parks the row far ahead, before the urgent real-time row can.
    assert d.admit[0] is job and d.park == [2]
    job.stream.admitted_at = now
    # Once running it is protected: urgent rows do not park it.
    d = decide(urgent_rows[:2] + [job], [], queue(started(now, 0.1)[0]), CFG, now)
    assert d.park == [] and d.admit == []


def test_steps_too_slow_for_real_time_park_rows_far_ahead_down_to_the_capacity():
    now = 10.0
    running = [started(now, 0.5)[0], started(now, 5.0)[0], started(now, 7.0)[0], nonrt()]
    running[3].stream.admitted_at = now
    cfg = CFG.model_copy(update={"max_rows": 8, "background_rows": 1})
    # 4 rows, steps at 1x up to 3 (park_rows), with headroom 2 (admit_rows): the band is
    # hysteresis, so parking starts above 3 and goes down to 2, most ahead first.
    d = decide(running, [], queue(), cfg, now, Capacity(admit_rows=2, park_rows=3))
    assert d.park == [2, 1]
    assert decide(running[:3], [], queue(), cfg, now, Capacity(admit_rows=2, park_rows=3)).park == []
    # Only real-time rows that must keep 1x call for it: jobs alone run as many as fit.
    assert decide(running[1:], [], queue(), cfg, now, Capacity(admit_rows=2, park_rows=3)).park == []


# ============================================================================== the rule's invariants


def is_parkable(row: Row, slack: float | None, protected: set[int], cfg: AcousticConfig) -> bool:
    if not row.req.realtime:
        return id(row) not in protected
    return slack >= cfg.park_ahead_s


STREAM = st.tuples(
    st.sampled_from("ABC"),  # client
    st.booleans(),  # real-time
    st.integers(1, 3),  # segments
    st.one_of(st.none(), st.floats(-3.0, 8.0)),  # slack of its first segment at `now` (None: not started)
    st.lists(st.sampled_from(["run", "wait", "held"]), min_size=3, max_size=3),  # where each segment is
)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    streams=st.lists(STREAM, min_size=1, max_size=8),
    max_rows=st.integers(1, 6),
    reserved=st.integers(0, 1),
    thresholds=st.sampled_from([(4.0, 2.0), (1.0, 0.5), (3.0, 0.0)]),
    capacity=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 3))),
    background=st.integers(1, 2),
)
def test_no_urgent_row_waits_while_a_row_with_more_slack_could_give_way(
    streams, max_rows, reserved, thresholds, capacity, background
):
    """Whatever the rows, their slacks and the capacity: the batch never exceeds its slots; only
    parkable rows are parked; and an urgent row (real-time, less than resume_ahead_s of slack, or
    a new stream) is left waiting only if the batch is full (its slots, or the capacity) of rows
    that may not give way, or it is a new stream beyond the capacity; among the rows taken, none
    has more slack than an urgent row left waiting, but for new streams of a client that already
    holds streams (its share)."""
    now = 100.0
    cfg = AcousticConfig(
        max_rows=max_rows,
        reserved_rows=reserved,
        park_ahead_s=thresholds[0],
        resume_ahead_s=thresholds[1],
        background_rows=background,
        token_budget=10**6,
    )
    cap = Capacity() if capacity is None else Capacity(admit_rows=capacity[0], park_rows=capacity[0] + capacity[1])
    running: list[Row] = []
    held: list[Row] = []
    waiting: list[Row] = []
    for client, realtime, n, slack, places in streams:
        rows = stream_rows(n, tokens=200, client=client, realtime=realtime, at=now - 5.0, prebuffer=0.0)
        if slack is not None:  # started: its first segment sent enough to be `slack` ahead at `now`
            send(rows[0], max(1, round((slack + 1.0) / T)), at=now - 1.0)
        for i, r in enumerate(rows):
            place = places[i] if (slack is not None or i == 0) else "wait"
            if place == "run" and len(running) >= cfg.max_rows + cfg.reserved_rows:
                place = "wait"
            r.stream.admitted_at = None if place == "wait" else now - 5.0 + len(running) * 0.01
            r.parked_at = now - 1.0 if place == "held" else None
            {"run": running, "wait": waiting, "held": held}[place].append(r)
    s = queue(*waiting)
    slack = {id(r): slack_of(r, now) for r in running + held + waiting}
    nonrt_running = sorted((r for r in running if not r.req.realtime), key=lambda r: r.stream.admitted_at)
    protected = {id(r) for r in nonrt_running[:background]}

    d = decide(running, held, s, cfg, now, cap)

    parked = [running[i] for i in d.park]
    assert len(set(d.park)) == len(d.park) and all(is_parkable(r, slack[id(r)], protected, cfg) for r in parked)
    assert all(r in held for r in d.resume) and all(r in waiting for r in d.admit)
    after = [r for r in running if r not in parked] + d.resume + d.admit
    slots = cfg.max_rows + cfg.reserved_rows
    assert len(after) <= slots
    assert all(r not in [w for rows in s.realtime_streams() for w in rows] for r in d.admit)  # out of the queue

    taken = {id(r) for r in d.resume + d.admit}
    may_give_way = [r for r in running if r not in parked and is_parkable(r, slack[id(r)], protected, cfg)]
    kept = min(background, sum(1 for r in after if not r.req.realtime))
    committed = {id(r.stream.playback) for r in running + held + waiting if committing(r.stream.playback, now, cfg)}
    committed |= {id(r.stream.playback) for r in d.admit if is_new(r)}
    within = slots if not cap.admit_rows else min(slots, max(cap.admit_rows, kept + 1))
    eligible = [r for r in held if id(r) not in taken] + [
        r for r in waiting if id(r) not in taken and s.eligible(r, cfg, None)
    ]
    for w in eligible:
        if not w.req.realtime:
            continue
        new = is_new(w)
        if not (new or slack[id(w)] < cfg.resume_ahead_s):
            continue  # not urgent
        gated = new and bool(cap.admit_rows) and len(committed) + 1 > max(1, cap.admit_rows - kept)
        if gated:
            continue
        assert len(after) >= within and not may_give_way, (w.req.client, slack[id(w)], len(after), within)
        holds_streams = any(r.req.realtime and r.req.client == w.req.client for r in after)
        for a in d.resume + d.admit:
            if a.req.realtime and (is_new(a) or slack[id(a)] < cfg.resume_ahead_s):
                assert slack[id(a)] <= slack[id(w)] or (new and holds_streams), (slack[id(a)], slack[id(w)])


# ============================================================================== no starvation, simulated


def test_jobs_are_never_starved_by_an_endless_overload_of_real_time_streams():
    """A batch always full of urgent real-time rows (new streams keep coming, every listener is
    behind): a job queued at t=0 gets a slot once it has waited background_wait_s and a slot
    frees, keeps it to its end, and the next job of the queue follows it at once."""
    cfg = AcousticConfig(max_rows=4, reserved_rows=0, token_budget=10**6)
    dt = 0.05  # a step: slower than a token's audio, so every listener falls behind
    length = 20  # steps a real-time row decodes before it ends
    s = Scheduler()
    for r in [stream_rows(1, tokens=length, at=0.0)[0] for _ in range(8)] + [nonrt("J", at=0.0) for _ in range(2)]:
        s.push(r, r.stream.row_id, max_queued=10_000)
    running: list[Row] = []
    held: list[Row] = []
    steps_of: dict[int, int] = {}
    admitted_at: dict[int, float] = {}
    ran_jobs: list[tuple[float, float]] = []
    for step in range(400):
        now = step * dt
        if len(s) < 8:  # new streams keep arriving
            r = stream_rows(1, tokens=length, at=now)[0]
            s.push(r, r.stream.row_id, max_queued=10_000)
        d = decide(running, held, s, cfg, now)
        parked = [running[i] for i in d.park]
        jobs_in = sorted((r for r in running if not r.req.realtime), key=lambda r: r.stream.admitted_at)
        assert not jobs_in or jobs_in[0] not in parked  # the job owed its slot keeps it
        for r in parked:
            r.parked_at = now
        held = [r for r in held if r not in d.resume] + parked
        running = [r for r in running if r not in parked] + d.resume + d.admit
        for r in d.admit:
            r.stream.admitted_at = now
            admitted_at[id(r)] = now
        for r in list(running):  # one token each
            steps_of[id(r)] = steps_of.get(id(r), 0) + 1
            if r.req.realtime:
                send(r, 1, at=now, final=steps_of[id(r)] == length)
            if steps_of[id(r)] == length:
                running.remove(r)
                if not r.req.realtime:
                    ran_jobs.append((admitted_at[id(r)], now))
        assert len(running) <= cfg.max_rows
    assert len(ran_jobs) == 2
    # The first got its slot within background_wait_s plus one row's length (a slot freeing), not before.
    assert cfg.background_wait_s <= ran_jobs[0][0] <= cfg.background_wait_s + length * dt
    assert ran_jobs[1][0] <= ran_jobs[0][1] + dt  # the next job follows it at once (it has waited)


# ============================================================================== on the engine


class FakeClock:
    """The engine's clock, advanced by the test: playback and scheduling on a known timeline."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def rt_seg(spk, n, seed, client="A", **kw) -> SegmentRequest:
    return seg(spk, n, seed=seed, client=client, realtime=True, **kw)


def test_one_keys_real_time_streams_all_run_on_the_engine_beside_another_client(make_engine, spk):
    eng = make_engine(max_rows=8, reserved_rows=1)
    other = eng.submit(seg(spk, 30, seed=99, client="B"))
    mine = [eng.submit(rt_seg(spk, 30, seed=i, client="platform")) for i in range(6)]
    eng.step()
    assert sum(r.req.client == "platform" for r in eng.batch.rows) == 6 and eng.running_rows == 7
    eng.run_until_idle()
    assert all(drain(s)[1].shape[0] == 30 for s in [other, *mine])
    # The same under fair scheduling: the running cap holds (the comparison the bench makes).
    fair = make_engine(max_rows=8, reserved_rows=1, scheduling="fair")
    fair.submit(seg(spk, 30, seed=99, client="B"))
    for i in range(6):
        fair.submit(rt_seg(spk, 30, seed=i, client="platform"))
    fair.step()
    assert sum(r.req.client == "platform" for r in fair.batch.rows) == 2


def test_the_engine_infers_each_streams_slack_and_stalls(make_engine, spk):
    """On an injected clock: a real-time stream whose steps come slower than its audio stalls, and
    the engine's count of the silence matches a listener replayed from when each chunk arrived
    (what the bench computes on the client side)."""
    clock = FakeClock()
    eng = make_engine(prebuffer_s=0.2, first_chunk_tokens=4, chunk_tokens=4, clock=clock)
    stream = eng.submit(rt_seg(spk, 40, seed=1))
    status = eng.realtime()
    assert (status.demand_streams, status.waiting_streams, status.capacity_streams) == (1, 1, None)
    assert status.streams[0].slack_s == 0.0 and not status.streams[0].started
    replay = PlaybackClock(0.2)

    def heard(c: PlaybackClock, now: float) -> float:  # silence so far, the one it is in included
        return c.stall_s + max(0.0, -c.slack(now)) if c.started else 0.0

    tokens = 0
    while eng.step():
        for chunk in stream.poll():  # arrived during this step, at the clock's time
            replay.deliver(chunk.hidden.shape[0] * T, clock.t)
            tokens += chunk.hidden.shape[0]
        if eng.running_rows:
            mid = eng.realtime().streams[0]
            assert mid.started == stream.playback.started and mid.stalled_s == pytest.approx(heard(replay, clock.t))
        clock.t += 0.04  # a step every 40 ms: 21.3 ms of audio each, about half real time
    assert tokens == 40
    pb = stream.playback
    assert pb.finished and pb.stall_s(clock.t) == pytest.approx(replay.stall_s) and replay.stall_s > 0.3
    status = eng.realtime()
    assert status.demand_streams == 0 and status.capacity_streams is not None and status.step_s > 0


@pytest.mark.timeout(120)
def test_rows_parked_and_resumed_by_the_deadline_rule_decode_as_alone(make_engine, spk):
    """One slot, two real-time streams on an injected clock that runs slower than their audio
    while a row decodes and faster while it waits: the rule swaps them several times (each
    parked with its KV, resumed where it left off); both decode what they decode alone."""
    clock = FakeClock()
    a, b = rt_seg(spk, 120, seed=5), rt_seg(spk, 120, seed=6, text="hello world", client="B")
    expected = [decode_alone(make_engine(), r) for r in (a, b)]
    eng = make_engine(
        max_rows=1,
        reserved_rows=0,
        first_chunk_tokens=4,
        chunk_tokens=4,
        prebuffer_s=0.0,
        park_ahead_s=0.3,
        resume_ahead_s=0.1,
        clock=clock,
    )
    streams = [eng.submit(a), eng.submit(b)]
    while eng.step():
        clock.t += 0.01  # a running row gains 11 ms of slack a step, a waiting one loses 10 ms
    assert eng.stats.deadline_parked >= 4 and eng.stats.deadline_resumed == eng.stats.deadline_parked
    for s, want in zip(streams, expected):
        assert torch.equal(drain(s)[1], want)


def test_a_job_beside_real_time_streams_that_fill_the_batch_is_not_starved(make_engine, spk):
    """Real-time streams keep both slots busy and every listener behind; a job waits its
    background_wait_s, then takes the first slot that frees, before the streams still waiting (who
    wait as long as it takes here: capacity_wait_s None)."""
    clock = FakeClock()
    eng = make_engine(max_rows=2, reserved_rows=0, background_wait_s=0.5, capacity_wait_s=None, clock=clock)
    job = eng.submit(seg(spk, 20, seed=50, client="jobs"))
    calls = [eng.submit(rt_seg(spk, 60, seed=i)) for i in range(6)]
    while eng.step():
        clock.t += 0.05  # slower than the audio: the real-time rows stay urgent
    assert drain(job)[1].shape[0] == 20 and all(drain(s)[1].shape[0] == 60 for s in calls)
    assert job.admitted_at - job.submitted_at >= 0.5
    assert job.admitted_at <= min(s.admitted_at for s in calls[2:])


def test_scheduling_is_live_and_fair_mode_brings_parked_rows_back(make_engine, spk):
    clock = FakeClock()
    eng = make_engine(max_rows=1, reserved_rows=0, prebuffer_s=0.0, park_ahead_s=0.3, resume_ahead_s=0.1, clock=clock)
    streams = [eng.submit(rt_seg(spk, 80, seed=7)), eng.submit(rt_seg(spk, 80, seed=8, client="B"))]
    while eng.deadline_parked_rows == 0:
        assert eng.step()
        clock.t += 0.005
    eng.reconfigure(scheduling="fair")
    eng.run_until_idle()
    assert eng.deadline_parked_rows == 0 and all(drain(s)[1].shape[0] == 80 for s in streams)
    with pytest.raises(ValueError, match="resume_ahead_s"):
        eng.reconfigure(resume_ahead_s=5.0)
    assert math.isclose(eng.cfg.park_ahead_s, 0.3)


def test_the_deadline_knobs_are_live_through_the_acoustic_user_config():
    """As the Acoustic replica applies a user_config: validated over its args, then every live
    field handed to the running engine (deployments/acoustic.py)."""
    from pydantic import ValidationError

    from serve_app.settings import LIVE_ACOUSTIC_FIELDS, AcousticUserConfig

    assert set(LIVE_ACOUSTIC_FIELDS) <= set(AcousticConfig.model_fields)
    live = AcousticUserConfig.model_validate(
        {"scheduling": "fair", "park_ahead_s": 3.0, "resume_ahead_s": 1.0, "prebuffer_s": 0.5, "background_rows": 2}
    )
    cfg = live.engine_config(AcousticConfig())
    assert (cfg.scheduling, cfg.park_ahead_s, cfg.resume_ahead_s, cfg.prebuffer_s, cfg.background_rows) == (
        "fair",
        3.0,
        1.0,
        0.5,
        2,
    )
    with pytest.raises(ValidationError, match="resume_ahead_s must be below park_ahead_s"):
        AcousticUserConfig.model_validate({"resume_ahead_s": 5.0}).engine_config(AcousticConfig())
    with pytest.raises(ValidationError):
        AcousticUserConfig.model_validate({"scheduling": "edf"}).engine_config(AcousticConfig())


def test_a_new_stream_with_no_room_within_capacity_wait_s_is_refused_and_one_with_room_starts(make_engine, spk):
    """The replica carries one stream at 1x (its steps, measured: 15 ms at one row, 30 ms at two).
    A second stream waits for room; past ``capacity_wait_s`` it is refused with
    ``CapacityExhausted`` (503 capacity_exhausted) before it sent anything, while the running
    stream plays on; once that one ends, a new stream starts at once."""
    clock = FakeClock()
    eng = make_engine(capacity_wait_s=0.5, clock=clock)
    eng.capacity.observe(1, 0.015)
    eng.capacity.observe(2, 0.030)
    first = eng.submit(rt_seg(spk, 80, seed=1))

    def step() -> None:
        eng.step()
        clock.t += 0.015 * max(1, eng.running_rows)

    step()
    late = eng.submit(rt_seg(spk, 40, seed=2, client="B"))
    for _ in range(45):  # 0.68 s of steps at one row
        step()
        assert eng.running_rows == 1
    with pytest.raises(CapacityExhausted, match="capacity_wait_s"):
        late.poll()
    assert eng.stats.capacity_refusals == 1 and late.first_chunk_at is None
    eng.run_until_idle()
    assert drain(first)[1].shape[0] == 80  # the running stream was never disturbed
    again = eng.submit(rt_seg(spk, 20, seed=3, client="B"))
    eng.run_until_idle()
    assert drain(again)[1].shape[0] == 20 and eng.stats.capacity_refusals == 1


def test_a_sessions_next_segment_continues_its_stream_and_is_never_refused(make_engine, spk):
    """A WebSocket session's next segment is a request of its own that says what its listener
    holds already (``ahead_s``): it is not a new stream (not refused for capacity, not urgent while
    that lasts), and its audio plays on when the audio before it runs out, with no new prebuffer."""
    clock = FakeClock()
    eng = make_engine(capacity_wait_s=0.2, clock=clock)
    eng.capacity.observe(1, 0.015)
    eng.capacity.observe(2, 0.030)  # one stream at 1x
    first = eng.submit(rt_seg(spk, 200, seed=1))
    eng.step()
    nxt = eng.submit(rt_seg(spk, 30, seed=2, ahead_s=3.0))
    pb = nxt.playback
    assert pb.continuing and pb.slack(clock.t) == pytest.approx(3.0)
    for _ in range(40):  # 0.6 s at one row: past capacity_wait_s, and it waits (3 s ahead)
        clock.t += 0.015
        eng.step()
    assert nxt.poll() == [] and eng.stats.capacity_refusals == 0
    assert pb.slack(clock.t) == pytest.approx(3.0 - 0.6, abs=0.02)
    eng.run_until_idle()
    assert drain(first)[1].shape[0] == 200 and drain(nxt)[1].shape[0] == 30 and eng.stats.capacity_refusals == 0


def test_later_segments_far_beyond_their_reader_wait_in_the_queue():
    """A long answer's later segments take free places only while their audio starts within
    ``LOOKAHEAD_S`` of what its reader has taken: a reader who stopped does not get every segment
    decoded and set aside with its KV; one who reads on (1x, or a download) moves the horizon."""
    now = 10.0
    rows = stream_rows(40, tokens=94, at=now - 1.0, prebuffer=0.0)  # forty segments of ~2 s each
    send(rows[0], 47, at=now - 0.5)
    cfg = CFG.model_copy(update={"max_rows": 64, "token_budget": 10**9})
    s = queue(*rows[1:])
    admitted = {rows.index(r) for r in decide([rows[0]], [], s, cfg, now).admit}
    beyond = {i for i in range(1, 40) if rows[0].stream.playback.beyond_reader_s(i) > LOOKAHEAD_S}
    assert beyond and not admitted & beyond and admitted == set(range(1, 40)) - beyond, (admitted, beyond)
    rows[0].stream.taken_tokens = 47 * 20  # the reader took ~20 s: the horizon moves with it
    later = {rows.index(r) for r in decide([rows[0]], [], s, cfg, now).admit}
    assert later and min(later) > max(admitted)
