"""A job's submission against the jobs service itself (no Ray: a directory store, the memory voice
store, a runner that is only told): the cheap refusals come first, nothing proportional to the
job's size runs on the event loop, the job reserves its normalised plan, its chunks never hold
more silence than the planner takes, and jobs need a key unless anonymous ones are allowed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.asgi import job_submission
from support.loop import STALL_LIMIT_S, Watched
from support.speakers import encode_speaker

from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.config import SegmentConfig
from serve_app.engine.planner import Planner, plan_seconds
from serve_app.engine.types import SynthesisOptions
from serve_app.errors import APIError
from serve_app.http.security import ANONYMOUS, Caller
from serve_app.jobs.build import JobBuilder
from serve_app.jobs.cutting import cut_text, estimated_pcm_bytes
from serve_app.jobs.planning import JobPlanner
from serve_app.jobs.request import loads_object
from serve_app.jobs.service import JobsService
from serve_app.settings import JobsConfig, LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.jobs import Place
from serve_app.storage.jobs.model import CHUNKS_FILE, STATE_FILE
from serve_app.storage.lexicons import LexiconBook, make_lexicon_store, parse_create
from serve_app.storage.voices import VoiceCatalog, make_voice_store, stored_voice

ALICE = "a1a1a1a1a1a1"
SPEAKER = encode_speaker(np.linspace(-1, 1, 768, dtype=np.float32))


class _Runner:
    """The runner as the service sees it when a job is made: told, nothing more."""

    class notify:  # noqa: N801 - a Ray actor method's shape
        told = 0

        @classmethod
        def remote(cls) -> None:
            cls.told += 1


def caller(owner: str = ALICE) -> Caller:
    return Caller(id=owner, owner=owner, max_priority=0, max_streams=0, max_voices=None)


async def service(tmp_path: Path, segments: SegmentConfig | None = None, **jobs: Any) -> JobsService:
    store = make_voice_store(VoiceStoreConfig(backend="memory"))
    # A clip voice of the caller's own: tens of kilobytes that must never be copied per part.
    await store.create(
        stored_voice("mine", "clip", owner=ALICE, speaker=SPEAKER, sample="c" * 40_000, transcript="hello there")
    )
    settings = JobsConfig(path=str(tmp_path / "jobs"), **{"max_bytes_per_key": 2**50, **jobs})
    return JobsService(settings, None, None, VoiceCatalog(store), segments=segments, runner=_Runner)


def encoded(body: dict) -> bytes:
    return json.dumps({"response_format": "pcm", **body}).encode()


async def submit(svc: JobsService, body: dict | bytes, who: Caller | None = None) -> tuple[int, dict]:
    try:
        r = await svc.create(job_submission(body if isinstance(body, bytes) else encoded(body)), who or caller())
    except APIError as exc:
        return exc.status, {"error": {"code": exc.code, "message": exc.message}}
    return r.status_code, json.loads(r.body)


# ------------------------------------------------------------------ the event loop


SSML_MILLION = {"input": "<speak>" + "山上有一座庙。" * ((1_000_000 - 15) // 7) + "</speak>"}

WORST = {
    # 1,000,000 characters of SSML, one text run (its language detected over all of it)
    "ssml": SSML_MILLION,
    # 100,000 turns in the caller's own clip voice (before: the clip re-serialised per part, ~10 s)
    "turns": {"turns": [{"voice": "mine", "input": "Hi."} for _ in range(100_000)]},
    # 12,000 turns (900,000 characters), each its own SSML document with a voice and a break
    "ssml turns": {
        "turns": [
            {"voice": "alloy", "input": f'<speak><voice name="mine">Hi {i}.</voice><break time="1s"/></speak>'}
            for i in range(12_000)
        ]
    },
    # runs of one character
    "run of a": {"input": "a" * 1_000_000},
    "run of 1": {"input": "1" * 1_000_000},
    "run of dots": {"input": "x" + "." * 999_999},
}


@pytest.mark.parametrize("name", list(WORST))
async def test_the_worst_admitted_jobs_never_stall_the_event_loop(tmp_path: Path, name: str):
    svc = await service(tmp_path, max_submissions_at_once=4)
    body = encoded(WORST[name])  # the client's work, before the watch
    t0 = time.perf_counter()
    async with Watched() as watch:
        status, job = await submit(svc, body)
    elapsed = time.perf_counter() - t0
    print(f"{name}: {status} in {elapsed:.1f} s, longest stall {watch.longest * 1000:.0f} ms")
    assert status == 202, job
    # Before: 0.7-1.4 s (SSML), 2.3 s (turns), ~10 s (turns in a clip voice), all on the loop.
    assert watch.longest < STALL_LIMIT_S, (name, watch.longest)


async def test_the_quota_refuses_before_the_body_is_read(tmp_path: Path):
    svc = await service(tmp_path, max_active_jobs_per_key=1)
    assert (await submit(svc, {"input": "你好。"}))[0] == 202
    # The owner is at its limit: a million characters are refused without being parsed at all.
    body = encoded(SSML_MILLION)
    async with Watched() as watch:
        t0 = time.perf_counter()
        status, err = await submit(svc, body)
        elapsed = time.perf_counter() - t0
    assert (status, err["error"]["code"]) == (429, "too_many_jobs")
    assert elapsed < 0.5 and watch.longest < STALL_LIMIT_S, (elapsed, watch.longest)


async def test_a_second_submission_of_a_key_waits_for_its_first(tmp_path: Path):
    svc = await service(tmp_path)
    first = asyncio.get_running_loop().create_task(submit(svc, WORST["run of a"]))
    await asyncio.sleep(0)
    while ALICE not in svc._submitting:
        await asyncio.sleep(0.001)
    status, err = await submit(svc, {"input": "你好。"})
    assert (status, err["error"]["code"]) == (429, "job_submission_in_progress")
    assert (await first)[0] == 202


def test_the_piecewise_json_reader_reads_what_json_reads():
    for doc in [
        "{}",
        '{"a": []}',
        ' { "a" : [ 1 , {"b": [2]} ] , "c": "x\\"y" , "d": null } ',
        '{"turns": [{"voice": "alloy", "input": "hi"}], "pause_s": 0.5}',
        '{"a": 1, "a": 2}',
    ]:
        assert loads_object(doc) == json.loads(doc), doc
    for bad in ["{", '{"a": [1,]}', '{"a": 1,}', '{"a": 1} x', '{"a" 1}', "[1]", '{"a": [1 2]}']:
        with pytest.raises(ValueError):
            loads_object(bad)


async def test_a_malformed_body_is_a_400(tmp_path: Path):
    svc = await service(tmp_path)
    for body, code in [
        (b'{"input": "x",', "invalid_json"),
        (b"\xff{}", "invalid_json"),
        (b"[1]", "invalid_value"),
        (b'{"turns": ' + json.dumps([{"input": "x"}] * 1500 + [{"input": ""}]).encode() + b"}", "invalid_value"),
    ]:
        with pytest.raises(APIError) as e:
            await svc.create(job_submission(body), caller())
        assert (e.value.status, e.value.code) == (400, code), body[:40]
    assert "turns.1500.input" in e.value.message  # a later piece's error names its turn in the whole list


# ------------------------------------------------------------------ the reservation


NUMBERS = " ".join(str(10**11 + 7919 * i) for i in range(1700))  # ~22,000 characters of 12-digit numbers


async def test_the_reservation_is_the_normalised_plan_not_the_written_text(tmp_path: Path):
    svc = await service(tmp_path, reservation_headroom=0.0)
    status, view = await submit(svc, {"input": NUMBERS, "voice": "alloy"})
    assert status == 202, view
    job = svc.store.get(view["id"], ALICE)
    chunks = svc.store.chunks(job)
    planner = Planner()
    options = SynthesisOptions.model_validate(job.options)
    planned = sum(
        plan_seconds(planner.plan(c.text, options.model_copy(update={"seed": c.seed}))) + c.pause_after for c in chunks
    )
    planned_bytes = int(planned * SAMPLE_RATE * 2)
    written = estimated_pcm_bytes(chunks, options.speed)
    print(
        f"12-digit numbers: written-text estimate {written} B, planned {planned_bytes} B, reserved {job.reserved_bytes} B"
    )
    # Before: the written text's estimate, about a tenth of what the plan makes.
    assert planned_bytes > 5 * written
    assert planned_bytes <= job.reserved_bytes <= planned_bytes + 4 and job.pcm_limit_bytes == job.reserved_bytes


async def test_a_job_past_its_owners_room_by_its_plan_is_a_409_before_it_is_stored(tmp_path: Path):
    chunks = cut_text(NUMBERS, 1, 600, 0.5)
    written = estimated_pcm_bytes(chunks, 1.0)
    # Room for three times the written text's estimate: the old check let it in.
    svc = await service(tmp_path, max_bytes_per_key=max(2**20, 3 * written), reservation_headroom=0.0)
    status, err = await submit(svc, {"input": NUMBERS, "voice": "alloy"})
    assert (status, err["error"]["code"]) == (409, "job_quota_exceeded"), err
    assert "normalised plan" in err["error"]["message"]
    assert svc.store.list(ALICE) == []


async def test_chapters_reserve_their_copy_of_the_audio(tmp_path: Path):
    svc = await service(tmp_path, reservation_headroom=0.25)
    book = "# One\n\n山上有一座庙。庙里有个老和尚。\n\n# Two\n\n老和尚讲故事。"
    plain = svc.store.get((await submit(svc, {"input": book}))[1]["id"], ALICE)
    chaptered = svc.store.get((await submit(svc, {"input": book, "chapters": True}))[1]["id"], ALICE)
    assert chaptered.reserved_bytes == 2 * chaptered.pcm_limit_bytes
    assert plain.reserved_bytes == plain.pcm_limit_bytes
    assert chaptered.pcm_limit_bytes >= plain.pcm_limit_bytes > 0  # the same audio (its chapter pause longer)


async def test_a_chunk_the_planner_would_refuse_is_refused_at_submission(tmp_path: Path):
    # The TextNormalizer's limits: a chunk of 600 characters of numbers makes more segments than 8.
    svc = await service(tmp_path, segments=SegmentConfig(max_segments=8))
    status, err = await submit(svc, {"input": NUMBERS})
    assert (status, err["error"]["code"]) == (413, "request_too_large"), err
    assert "chunk 0" in err["error"]["message"] and "segments.max_segments" in err["error"]["message"]
    assert svc.store.list(ALICE) == []


ALIAS = "spelled out " * 10 + "in full"  # 127 characters for the two written: ~60x the text


async def _with_lexicon(svc: JobsService) -> str:
    """The caller's lexicon that says ``zq`` as ``ALIAS``; its id."""
    cfg = LexiconStoreConfig(backend="memory")
    store = make_lexicon_store(cfg)
    svc.lexicons = LexiconBook(store)
    made = await store.create(parse_create({"name": "grow", "entries": [{"text": "zq", "alias": ALIAS}]}, cfg, ALICE))
    return made.id


# One chunk of 600 characters grows by ~1,500 through the lexicon: well inside a request's 4,096
# (segments.max_lexicon_growth_chars), every chunk alike (a repeated paragraph).
GROWING = ("zq is what this sentence is about, again and again and again. " * 10 + "\n\n") * 10


async def test_a_lexicon_grows_a_whole_job_by_its_input_limit_at_most(tmp_path: Path):
    """The finding: each chunk had a request's growth budget of its own, so a job read through a
    growing lexicon planned up to ~8x its text at submission (a million characters: eight
    million planned). The job is charged as a whole: what the lexicon adds to all its chunks
    together is at most ``jobs.max_input_chars``, refused before anything is stored."""
    svc = await service(tmp_path, max_input_chars=len(GROWING))
    lexicon = await _with_lexicon(svc)
    chunks = cut_text(GROWING, 1, svc.cfg.chunk_chars, 0.5)
    grown = GROWING.count("zq") * (len(ALIAS) - 2)
    assert len(chunks) >= 10 and grown > 2 * len(GROWING)  # the whole job grows past its limit ...
    assert (
        max(c.text.count("zq") for c in chunks) * len(ALIAS) < SegmentConfig().max_lexicon_growth_chars
    )  # ... no chunk
    status, err = await submit(svc, {"input": GROWING, "lexicon": lexicon})
    assert status == 413 and err["error"]["code"] == "input_too_long", err
    assert "jobs.max_input_chars" in err["error"]["message"], err
    assert svc.store.list(ALICE) == []
    # The same text without the lexicon, and a job whose growth fits, are made.
    assert (await submit(svc, {"input": GROWING, "lexicon": "none"}))[0] == 202
    fits = GROWING[: len(GROWING) // 4]
    assert (await submit(svc, {"input": fits, "lexicon": lexicon}))[0] == 202


@pytest.mark.parametrize(
    "body",
    [
        {"input": '<speak><break time="2s"/>。</speak>'},
        {"input": '<speak><sub alias="。">hello</sub></speak>'},
        {"turns": [{"voice": "alloy", "input": "……"}, {"voice": "echo", "input": "。。"}]},
    ],
    ids=["a break and a mark", "an alias of a mark", "turns of marks"],
)
async def test_a_job_that_plans_to_nothing_speakable_is_refused_before_it_is_stored(tmp_path: Path, body: dict):
    """The finding: a script whose every chunk planned empty was stored and queued (202), with a
    reservation of 0 bytes (no limit at all in the runner) and nothing to speak."""
    svc = await service(tmp_path)
    status, err = await submit(svc, body)
    assert status == 400 and err["error"]["code"] == "empty_input", err
    assert svc.store.list(ALICE) == []


async def test_no_chunk_of_a_dialogue_holds_more_silence_than_the_planner_takes(tmp_path: Path):
    # The finding: 2,700 short turns with 10 s breaks made chunks of hours of silence each.
    svc = await service(tmp_path)
    turns = [{"voice": "alloy", "input": f'<speak>Hi {i}.<break time="10s"/></speak>'} for i in range(2700)]
    status, view = await submit(svc, {"turns": turns, "pause_s": 5.0})
    assert status == 202, view
    job = svc.store.get(view["id"], ALICE)
    chunks = svc.store.chunks(job)
    limit = SegmentConfig().max_silence_seconds
    silences = [sum(p.pause_before for p in c.parts) for c in chunks]
    print(f"2,700 turns of 10 s breaks: {len(chunks)} chunks, the most silence in one {max(silences):.0f} s")
    assert max(silences) <= limit
    assert sum(silences) == pytest.approx(2700 * 10 + 2699 * 5)  # none lost


# ------------------------------------------------------------------ voices apart from progress


async def test_the_jobs_state_stays_small_whatever_its_voices(tmp_path: Path):
    svc = await service(tmp_path)
    turns = [{"voice": f"seed:{i}", "input": "Hi."} for i in range(2000)]  # 2,000 distinct inline voices
    turns += [{"voice": "mine", "input": "Hello."}] * 2000  # and one clip voice, many times
    status, view = await submit(svc, {"turns": turns})
    assert status == 202, view
    job = svc.store.get(view["id"], ALICE)
    folder = Path(svc.store.files.root) / Place.of(job).key()
    state, doc = (folder / STATE_FILE).read_bytes(), json.loads((folder / CHUNKS_FILE).read_bytes())
    print(f"job.json {len(state)} B, chunks.json {(folder / CHUNKS_FILE).stat().st_size} B")
    # Before: every voice in job.json, rewritten after each chunk (megabytes for thousands of voices).
    assert len(state) < 4096 + 8 * job.chunks_total
    assert len(doc["script_voices"]) == 2001 and sum(1 for v in doc["script_voices"] if v["spk_smp"]) == 1
    script = svc.store.script(job)
    assert len(script.script_voices) == 2001 and script.voice["name"] == "alloy"


# ------------------------------------------------------------------ jobs without a key


async def test_jobs_without_a_key_are_refused_unless_allowed(tmp_path: Path):
    anonymous = Caller(id="ip:10.0.0.1", owner=ANONYMOUS, max_priority=0, max_streams=0, max_voices=None)
    svc = await service(tmp_path / "off")
    status, err = await submit(svc, {"input": "你好。"}, anonymous)
    assert (status, err["error"]["code"]) == (403, "jobs_need_api_key")
    for call in (svc.list(anonymous), svc.get("job_" + "0" * 24, anonymous), svc.delete("job_" + "0" * 24, anonymous)):
        with pytest.raises(APIError) as e:
            await call
        assert (e.value.status, e.value.code) == (403, "jobs_need_api_key")
    assert (await submit(svc, {"input": "你好。"}))[0] == 202  # a key's job as ever

    svc = await service(tmp_path / "on", allow_anonymous=True)
    status, view = await submit(svc, {"input": "你好。"}, anonymous)
    assert status == 202 and view["owner"] == ANONYMOUS
    assert [j.id for j in (await svc.list(anonymous)).data] == [view["id"]]


async def test_an_abandoned_submission_holds_its_slot_until_its_work_has_stopped(tmp_path: Path, monkeypatch):
    """A client that hangs up on a large submission while it is being cut, then while it is being
    planned: its key's submission slot is free only once nothing of it runs any more (before, the
    slot was freed at once while the cutting went on in a thread of the loop's shared pool), and
    its planning stops at the next chunk."""
    svc = await service(tmp_path, max_input_chars=4_000_000, chunk_chars=300)
    text = "".join(f"第{i}段，今天的天气非常好，我们一起去公园散步，然后回家吃晚饭。\n\n" for i in range(20_000))
    cutting, cut_done = threading.Event(), []
    real_cut = JobBuilder._cut

    def slow_cut(self, *args):
        cutting.set()
        out = real_cut(self, *args)
        time.sleep(0.5)  # a cut of a book that takes a while
        cut_done.append(time.monotonic())
        return out

    monkeypatch.setattr(JobBuilder, "_cut", slow_cut)
    task = asyncio.ensure_future(submit(svc, {"input": text}))
    await asyncio.to_thread(cutting.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    freed = time.monotonic()
    assert ALICE not in svc._submitting
    assert cut_done and cut_done[0] <= freed, "the slot was freed while the submission's cut still ran"
    monkeypatch.setattr(JobBuilder, "_cut", real_cut)

    planned: list[float] = []
    real_one = JobPlanner._one

    def one(self, *args):
        planned.append(time.monotonic())
        time.sleep(0.002)  # a chunk's planning, long enough to be caught mid-piece
        return real_one(self, *args)

    monkeypatch.setattr(JobPlanner, "_one", one)
    task = asyncio.ensure_future(submit(svc, {"input": text}))
    while len(planned) < 50:  # planning has started
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    freed = time.monotonic()
    await asyncio.sleep(0.3)
    assert max(planned) <= freed, f"{sum(t > freed for t in planned)} chunks planned after the slot was freed"
    status, _ = await submit(svc, {"input": "下一个请求。"})
    assert status == 202  # the key submits again at once
