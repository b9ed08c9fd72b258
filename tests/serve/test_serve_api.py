"""End to end over HTTP: the real app on Ray Serve (tiny random weights), real clients.

The openai SDK, httpx (sync, async, streaming, raw bodies), the project's own client and CLI
(``chattts-serve say --url``).
Random weights never stop by themselves, so every segment lasts exactly the number of tokens
``serve_app.engine.pacing`` gives its text: durations are checked to the sample where the
format allows it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import time

import httpx
import openai
import pytest
from support.app import APP_NAME, acoustic_stats, app_args, wait_idle
from support.audio import SR, assert_duration, read_wav
from support.cli import cli_command
from support.engine import expected_samples as plan_samples
from support.http import assert_openai_error, speech
from support.report import report
from support.waiting import wait_until

# The format -> content-type contract itself is asserted in test_audio.
from serve_app.engine.audio import AUDIO_FORMATS as FORMATS
from serve_app.engine.audio import CONTENT_TYPES
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.types import SynthesisOptions
from serve_app.engine.wav import with_true_length

# Every voice name OpenAI's speech API accepts.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)

SHORT_TEXT = "你好，世界。今天天气不错。"
# ~11 s of audio in one request (three sentences).
LONG_TEXT = "今天天气很好，我们一起去公园散步吧。公园里有很多花，红的黄的都很漂亮。走累了我们就坐在湖边休息一会儿。"
# Twenty sentences: several segments of ~25 s each, far longer than the disconnect test waits.
_SENTENCES = [
    "春天来了，山上的花都开了。",
    "小河里的水哗哗地流着。",
    "孩子们在田野里放风筝。",
    "老人坐在门口晒太阳。",
    "远处传来悠扬的笛声。",
    "燕子从南方飞回来了。",
    "农民伯伯开始播种了。",
    "柳树发出了嫩绿的新芽。",
    "蜜蜂在花丛中忙着采蜜。",
    "天空中飘着几朵白云。",
    "小狗在院子里追着蝴蝶。",
    "妈妈在厨房里做着午饭。",
    "爷爷在书房里写着毛笔字。",
    "奶奶在阳台上浇花。",
    "哥哥在操场上踢足球。",
    "姐姐在房间里弹钢琴。",
    "弟弟在客厅里搭积木。",
    "妹妹在门口跳绳。",
    "爸爸在车库里修自行车。",
    "一家人过着幸福的生活。",
]
DISCONNECT_TEXT = "".join(_SENTENCES)


# ---------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def planner():
    """The app's own planner (same segment limits), to compute the exact expected durations."""
    from serve_app.engine.planner import Planner

    return Planner(app_args().segments)


def expected_samples(planner, text: str, voice: str = "alloy", speed: float = 1.0) -> int:
    """Samples of the whole answer to ``text`` (random weights: exact)."""
    plan = planner.plan(text, SynthesisOptions(voice=voice, speed=speed))
    assert plan.segments
    return plan_samples(plan)


def wav_sizes(data: bytes) -> tuple[int, int]:
    """A WAV's RIFF and data chunk sizes as its header says them."""
    return struct.unpack("<I", data[4:8])[0], struct.unpack("<I", data[40:44])[0]


@pytest.fixture(scope="module")
def oai(app_url):
    with openai.OpenAI(base_url=app_url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


# ---------------------------------------------------------------------------------------- openai SDK


@pytest.mark.parametrize("fmt", FORMATS)
def test_openai_sdk_every_format(oai, planner, fmt):
    voice = OPENAI_VOICES[FORMATS.index(fmt)]
    resp = oai.audio.speech.create(model="tts-1", voice=voice, input=SHORT_TEXT, response_format=fmt)
    headers = resp.response.headers
    assert headers["content-type"] == CONTENT_TYPES[fmt]
    assert headers.get("x-request-id")
    assert headers.get("x-weights") == "random"
    assert headers.get("x-cache") == "miss"  # a fresh synthesis, not a replay
    assert_duration(resp.content, fmt, expected_samples(planner, SHORT_TEXT, voice))


def test_openai_sdk_streaming_response(oai, planner):
    text = "Streaming speech, chunk by chunk."
    chunks = []
    with oai.audio.speech.with_streaming_response.create(
        model="tts-1", voice="nova", input=text, response_format="wav"
    ) as resp:
        assert resp.headers["content-type"] == "audio/wav"
        assert resp.headers.get("x-weights") == "random"
        assert resp.headers.get("x-cache") == "miss"
        for chunk in resp.iter_bytes():
            chunks.append(chunk)
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert_duration(data, "wav", expected_samples(planner, text, "nova"))
    # The same request again (now from the result cache): the streamed bytes were all of it, and
    # the replay, a whole answer, says its true length (the stream could not).
    whole = oai.audio.speech.create(model="tts-1", voice="nova", input=text, response_format="wav")
    assert whole.response.headers.get("x-cache") == "hit"
    assert whole.content == with_true_length(data) and wav_sizes(whole.content) == (len(data) - 8, len(data) - 44)


def test_openai_sdk_speaks_every_openai_voice_name_and_refuses_an_unknown_one(oai, planner):
    """What OpenAI's SDKs (and Pipecat's OpenAITTSService, LiveKit's openai.TTS on top of them) send:
    the newest names are voices of their own; an unknown one raises BadRequestError, as OpenAI's."""
    text = "marin 和 cedar。"
    audio = {}
    for voice in ("marin", "cedar"):
        resp = oai.audio.speech.create(model="gpt-4o-mini-tts", voice=voice, input=text, response_format="wav")
        assert_duration(resp.content, "wav", expected_samples(planner, text, voice))
        audio[voice] = read_wav(resp.content)
    assert len(audio["marin"]) == len(audio["cedar"]) and (audio["marin"] != audio["cedar"]).any()
    with pytest.raises(openai.BadRequestError) as excinfo:
        oai.audio.speech.create(model="tts-1", voice="no-such-voice", input="你好")
    err = excinfo.value
    assert (err.status_code, err.code, err.param) == (400, "voice_not_found", "voice")
    assert err.type == "invalid_request_error"


async def test_async_sdk_streams_pcm_as_voice_agents_read_it(app_url, planner):
    """Pipecat's OpenAITTSService (and LiveKit's openai.TTS) stream through the async SDK: pcm,
    read in chunks as it comes, s16le at 24 kHz."""
    text = "Voice agents read pcm as it streams."
    async with openai.AsyncOpenAI(base_url=app_url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        async with client.audio.speech.with_streaming_response.create(
            input=text, model="gpt-4o-mini-tts", voice="cedar", response_format="pcm"
        ) as r:
            assert r.status_code == 200
            pcm = b"".join([chunk async for chunk in r.iter_bytes(1024)])
    assert len(pcm) == 2 * expected_samples(planner, text, "cedar")


def test_open_webui_discovers_models_and_voices_then_speaks(app_url):
    """Open WebUI's requests to an OpenAI-compatible TTS engine (its audio router): GET
    {base}/audio/models -> "models", GET {base}/audio/voices -> "voices" [{id, name}], without a
    key; then POST {base}/audio/speech with a voice from that list."""
    base = app_url + "/v1"
    with httpx.Client(timeout=120) as client:
        models = client.get(f"{base}/audio/models")
        assert models.status_code == 200, models.text
        assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= {m["id"] for m in models.json().get("models", [])}
        voices = client.get(f"{base}/audio/voices")
        assert voices.status_code == 200, voices.text
        available = {v["id"]: v["name"] for v in voices.json().get("voices", [])}  # what Open WebUI keeps
        assert {name: name for name in OPENAI_VOICES}.items() <= available.items()
        r = client.post(
            f"{base}/audio/speech",
            json={"model": "tts-1", "input": "Open WebUI 你好。", "voice": "cedar", "response_format": "mp3"},
        )
        assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg" and len(r.content) > 100


def test_wyoming_openai_probes_find_an_openai_server(app_url):
    """wyoming-openai's backend detection against base {app}/v1: GET {base}/readyz (LocalAI if 2xx),
    GET {base}/../../health (Speaches if its text is "OK"), GET {base}/test (Kokoro-FastAPI if
    {"status": "ok"}). None matches, so it speaks to us as to OpenAI: its own list of OpenAI's
    voice names, every one built in here (README, "Home Assistant")."""
    with httpx.Client(base_url=app_url + "/v1/", timeout=30) as client:
        assert client.get("readyz").status_code == 404
        health = client.get("../../health")
        assert health.url.path == "/health" and health.status_code == 200
        assert health.json() == {"status": "ok"} and health.text != "OK"
        assert client.get("test").status_code == 404


def test_request_id_is_echoed(app_url):
    r = httpx.post(
        app_url + "/v1/audio/speech",
        json={"input": "你好。", "response_format": "pcm"},
        headers={"X-Request-Id": "e2e-test-request-1"},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.headers.get("x-request-id") == "e2e-test-request-1"


# ---------------------------------------------------------------------------------------- streaming


def test_long_request_streams_before_it_is_done(app_url, planner):
    body = {"model": "chattts", "input": LONG_TEXT, "voice": "echo", "response_format": "wav"}
    expected = expected_samples(planner, LONG_TEXT, "echo")
    assert expected / SR > 9.0, "the long text should give ~10 s of audio"
    arrivals: list[tuple[float, int]] = []
    with httpx.Client(timeout=120) as client:
        t0 = time.perf_counter()
        with client.stream("POST", app_url + "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            assert r.headers.get("x-cache") == "miss"
            assert r.headers.get("transfer-encoding") == "chunked"
            assert "content-length" not in r.headers
            parts = []
            for chunk in r.iter_raw():
                arrivals.append((time.perf_counter() - t0, len(chunk)))
                parts.append(chunk)
        total = time.perf_counter() - t0
    ttfb = arrivals[0][0]
    data = b"".join(parts)
    assert_duration(data, "wav", expected)
    report(
        "long streaming request (wav, %.1f s audio)" % (expected / SR),
        f"TTFB {ttfb * 1000:.0f} ms, total {total:.2f} s, {len(arrivals)} chunks",
    )
    assert len(arrivals) >= 5, f"expected the audio in many chunks, got {len(arrivals)}"
    assert ttfb < 0.5 * total, f"first byte after {ttfb:.2f} s of {total:.2f} s"
    # Audio keeps arriving over the response, not in one burst at the end.
    half = sum(n for t, n in arrivals if t < total / 2)
    assert half > 0.1 * len(data), f"only {half} of {len(data)} bytes in the first half"


def _parse_sse(raw: bytes) -> list[dict]:
    text = raw.decode()
    assert text.endswith("\n\n"), "SSE stream must end with a blank line"
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block[:200]
        events.append(json.loads("".join(line[len("data: ") :] for line in lines)))
    return events


def test_sse_stream_matches_plain_response(app_url):
    body = {"input": "Server sent events. 你好！", "voice": "coral", "seed": 1234, "response_format": "wav"}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", app_url + "/v1/audio/speech", json={**body, "stream_format": "sse"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers.get("x-cache") == "miss"
            raw = r.read()
        # The plain request is the same cache entry (stream_format is framing only)...
        plain = client.post(app_url + "/v1/audio/speech", json=body)
        # ...so also compare with a fresh synthesis of the same audio (pcm is another entry).
        fresh = client.post(app_url + "/v1/audio/speech", json={**body, "response_format": "pcm"})
    assert plain.status_code == 200 and plain.headers["content-type"] == "audio/wav"
    assert fresh.status_code == 200 and fresh.headers.get("x-cache") == "miss"
    events = _parse_sse(raw)
    assert len(events) >= 3, "a fresh synthesis streams several deltas"
    *deltas, done = events
    assert done["type"] == "speech.audio.done", done
    assert "usage" in done
    assert all(e["type"] == "speech.audio.delta" for e in deltas), [e["type"] for e in deltas]
    audio = b"".join(base64.b64decode(e["audio"], validate=True) for e in deltas)
    assert with_true_length(audio) == plain.content  # the plain answer is whole: its true length
    assert audio[44:] == fresh.content
    read_wav(audio)


# ---------------------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes_other_seed_differs(app_url):
    """Two fresh syntheses of one request are the same audio. Repeats of a request are answered
    by the result cache, so the second synthesis asks for pcm: another cache entry, the same
    samples as the wav's data chunk."""
    body = {"input": "同一个声音，同一个种子。", "voice": "onyx", "seed": 42, "response_format": "wav"}
    a = speech(app_url, **body)
    b = speech(app_url, **{**body, "response_format": "pcm"})
    c = speech(app_url, **{**body, "seed": 43})
    d = speech(app_url, **{**body, "voice": "sage"})
    for r in (a, b, c, d):
        assert r.status_code == 200
        assert r.headers.get("x-cache") == "miss"
    assert a.content[:4] == b"RIFF" and len(a.content) == 44 + len(b.content)
    assert a.content[44:] == b.content  # byte-identical audio from two syntheses
    assert len(c.content) == len(a.content)  # same text, same length...
    assert c.content != a.content  # ...other seed, other tokens
    assert d.content != a.content  # another voice with the same seed differs too
    # The same request again: byte-identical (a cache replay now).
    again = speech(app_url, **body)
    assert again.headers.get("x-cache") == "hit"
    assert again.content == with_true_length(a.content)

    # Cache-Control from the client: no-cache synthesises afresh (same bytes: deterministic) and
    # stores; no-store neither looks up nor stores.
    def post(b: dict, cc: str) -> httpx.Response:
        return httpx.post(
            app_url + "/v1/audio/speech", json={"model": "chattts", **b}, headers={"Cache-Control": cc}, timeout=120
        )

    fresh = post(body, "no-cache")
    assert fresh.headers.get("x-cache") == "miss" and fresh.content == a.content
    other = {**body, "seed": 44}
    assert post(other, "no-store").headers.get("x-cache") == "bypass"
    assert speech(app_url, **other).headers.get("x-cache") == "miss"  # nothing was stored
    assert speech(app_url, **other).headers.get("x-cache") == "hit"


# ---------------------------------------------------------------------------------------- GET routes


def test_models_voices_health(app_url):
    with httpx.Client(base_url=app_url, timeout=30) as client:
        models = client.get("/v1/models")
        assert models.status_code == 200
        m = models.json()
        assert m["object"] == "list"
        ids = {card["id"] for card in m["data"]}
        assert {"chattts", "tts-1", "tts-1-hd"} <= ids
        assert all(card["object"] == "model" for card in m["data"])

        voices = client.get("/v1/voices")
        assert voices.status_code == 200
        v = voices.json()
        assert v["object"] == "list"
        assert set(OPENAI_VOICES) <= {card["id"] for card in v["data"]}

        health = client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "weights": "random"}


# ---------------------------------------------------------------------------------------- bad input

# Empty input, over max_input_chars, unknown voice, bad response_format, speed too high, unknown
# model and only punctuation: through every front door in test_error_contract.py.
BAD_JSON_BODIES = {
    "blank input": ({"input": "   "}, 400, None),
    "speed too low": ({"input": "你好", "speed": 0.1}, 400, None),
    "input not a string": ({"input": 123}, 400, None),
    "speed not a number": ({"input": "你好", "speed": "fast"}, 400, None),
    "missing input": ({"voice": "alloy"}, 400, None),
}


@pytest.mark.parametrize("case", list(BAD_JSON_BODIES))
def test_bad_input_gets_openai_error(app_url, case):
    body, status, code = BAD_JSON_BODIES[case]
    r = httpx.post(app_url + "/v1/audio/speech", json=body, timeout=60)
    err = assert_openai_error(r, status, code)
    if case in ("speed too low", "speed not a number"):
        assert err["param"] == "speed", err


def test_malformed_json_is_400(app_url):
    r = httpx.post(
        app_url + "/v1/audio/speech",
        content=b'{"input": "\xe4\xbd\xa0\xe5\xa5\xbd", "voice": ',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert_openai_error(r, 400, "invalid_json")


def test_body_over_limit_is_413(app_url):
    limit = 64 * 1024  # IngressConfig.max_body_bytes default
    padding = "x" * (limit + 1000)
    r = httpx.post(app_url + "/v1/audio/speech", json={"input": "你好", "instructions": padding}, timeout=30)
    assert_openai_error(r, 413, "body_too_large")


def test_chunked_body_over_limit_is_413(app_url):
    """No Content-Length: the limit is enforced while the body streams in."""

    def body():
        yield b'{"input": "'
        for _ in range(80):
            yield b"a" * 1024
        yield b'"}'

    r = httpx.post(
        app_url + "/v1/audio/speech", content=body(), headers={"content-type": "application/json"}, timeout=30
    )
    assert_openai_error(r, 413, "body_too_large")


def test_still_serves_after_bad_requests(app_url, planner):
    r = speech(app_url, input=SHORT_TEXT, voice="alloy", response_format="flac")
    assert r.status_code == 200 and r.headers["content-type"] == "audio/flac"
    assert_duration(r.content, "flac", expected_samples(planner, SHORT_TEXT))


# ---------------------------------------------------------------------------------------- batching


@pytest.mark.asyncio
async def test_concurrent_requests_are_batched(app_url):
    texts = [f"第{n}位用户在同一时间请求语音合成。" for n in "一二三四五六七八"]
    before = await asyncio.to_thread(acoustic_stats)
    assert before["running_rows"] == 0 and before["waiting_rows"] == 0

    async with httpx.AsyncClient(base_url=app_url, timeout=120) as client:

        async def one(text: str) -> httpx.Response:
            return await client.post("/v1/audio/speech", json={"input": text, "response_format": "wav"})

        responses = await asyncio.gather(*(one(t) for t in texts))
    after = await asyncio.to_thread(acoustic_stats)

    for r in responses:
        assert r.status_code == 200, r.text[:300]
        assert r.headers.get("x-cache") == "miss"
        assert len(read_wav(r.content)) > SR  # > 1 s each
    rows = after["rows_admitted"] - before["rows_admitted"]
    admissions = after["admissions"] - before["admissions"]
    steps = after["steps"] - before["steps"]
    mean_rows = (after["row_steps"] - before["row_steps"]) / steps
    report(
        "8 concurrent requests",
        f"{rows} rows in {admissions} admissions, {steps} steps, mean {mean_rows:.2f} rows/step, max_rows {after['max_rows']}",
    )
    assert rows == 8  # one segment each
    assert admissions < 8, f"{admissions} admissions for 8 requests: no batching"
    assert after["max_rows"] >= 2
    assert mean_rows > 1.5, f"mean {mean_rows:.2f} rows per decode step"
    assert after["rows_finished"] - before["rows_finished"] == 8


# ---------------------------------------------------------------------------------------- disconnect


def test_client_disconnect_cancels_generation(app_url, planner):
    plan_samples = expected_samples(planner, DISCONNECT_TEXT, "alloy")
    assert plan_samples / SR > 30, "the request should be far longer than this test waits"
    before = acoustic_stats()
    assert before["running_rows"] == 0

    client = httpx.Client(timeout=60)
    t0 = time.monotonic()
    with client.stream(
        "POST", app_url + "/v1/audio/speech", json={"input": DISCONNECT_TEXT, "response_format": "pcm"}
    ) as r:
        assert r.status_code == 200
        body = r.iter_raw()  # keep a reference: a dropped httpx iterator closes the connection
        assert next(body)
        # While the client stays connected (not even reading), decoding goes on.
        connected = acoustic_stats()
        during = wait_until(
            acoustic_stats,
            10,
            until=lambda s: s["steps"] > connected["steps"],
            what="decode steps while the client is connected",
        )
        assert during["running_rows"] >= 1, during
        body.close()  # hang up with the rest of the response unread
    client.close()
    closed = time.monotonic()

    after = wait_idle(5.0)  # the disconnected request's rows stopped
    stop_s = time.monotonic() - closed
    assert after["rows_cancelled"] > before["rows_cancelled"], after
    assert after["rows_finished"] == before["rows_finished"], "a disconnected row ran to its end"
    # Nothing decodes any more for it (a decode step takes ~10-50 ms here).
    time.sleep(0.5)
    idle = acoustic_stats()
    assert idle["steps"] == after["steps"], (after["steps"], idle["steps"])
    tokens_done = after["row_steps"] - before["row_steps"]
    report(
        "client disconnect",
        f"rows stopped {stop_s:.2f} s after close ({closed - t0:.2f} s into the request); "
        f"{after['rows_cancelled'] - before['rows_cancelled']} rows cancelled after {tokens_done} row-steps "
        f"of {plan_samples // SAMPLES_PER_TOKEN} planned tokens",
    )
    # A normal request still succeeds.
    r = speech(app_url, input="断开之后一切正常。", response_format="wav")
    assert r.status_code == 200
    assert len(read_wav(r.content)) > 0


# ---------------------------------------------------------------------------------------- own client + CLI


def test_speech_client_sync(app_url, planner, tmp_path):
    from serve_app.client import SpeechClient, SpeechError

    out = tmp_path / "sync.wav"
    with SpeechClient(app_url) as client:
        assert client.ready()
        info = client.speak_to_file("客户端测试。", out, voice="fable", response_format="wav")
        assert info.bytes == out.stat().st_size > 44
        assert 0 < info.ttfb_s <= info.total_s
        assert info.request_id
        assert len(read_wav(out.read_bytes())) == expected_samples(planner, "客户端测试。", "fable")
        with pytest.raises(SpeechError) as excinfo:
            client.speak_to_file("你好", tmp_path / "never.wav", voice="no-such-voice")
        assert excinfo.value.status == 400
        assert excinfo.value.code == "voice_not_found"
        assert not (tmp_path / "never.wav").exists()


@pytest.mark.asyncio
async def test_speech_client_async(app_url, planner, tmp_path):
    from serve_app.client import AsyncSpeechClient, SpeechError

    out = tmp_path / "async.mp3"
    async with AsyncSpeechClient(app_url) as client:
        info = await client.speak_to_file("异步客户端。", out, voice="shimmer", response_format="mp3")
        assert info.bytes == out.stat().st_size > 0
        await asyncio.to_thread(
            assert_duration, out.read_bytes(), "mp3", expected_samples(planner, "异步客户端。", "shimmer")
        )
        with pytest.raises(SpeechError) as excinfo:
            await client.speech("你好", voice="no-such-voice")
        assert excinfo.value.status == 400
        assert excinfo.value.code == "voice_not_found"


def test_cli_say_through_server(app_url, planner, tmp_path):
    out = tmp_path / "out.wav"
    proc = subprocess.run(
        [*cli_command(), "say", "你好", "-o", str(out), "--url", app_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = out.read_bytes()
    assert data[:4] == b"RIFF"
    assert len(read_wav(data)) == expected_samples(planner, "你好")


@pytest.mark.timeout(300)
def test_cli_say_stdin_speaks_lines_as_they_arrive(app_url, planner, tmp_path):
    """Through the server's WebSocket: the first line's audio is in the file before the second
    line is written; the whole file is exactly both lines' audio (random weights: each segment
    lasts its planned number of tokens)."""
    lines = ["第一行，边写边说。", "Second line, spoken as it arrives."]
    plans = [planner.plan(line, SynthesisOptions(voice="nova")) for line in lines]
    expected = sum(plan_samples(plan) for plan in plans)
    out = tmp_path / "lines.pcm"
    proc = subprocess.Popen(
        [*cli_command(), "say", "--stdin", "--url", app_url, "--voice", "nova", "-o", str(out)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdin.write(lines[0] + "\n")
        proc.stdin.flush()
        wait_until(lambda: out.exists() and out.stat().st_size, 120, 0.05, what="the first line's audio")
        proc.stdin.write(lines[1] + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
    assert out.stat().st_size == 2 * expected
    assert f"{sum(len(plan.segments) for plan in plans)} segment(s)" in proc.stderr.read()


def test_cli_say_cuts_text_into_the_segments_the_server_does(app_url):
    """``say`` and the server share their defaults (one home for each): the running TextNormalizer
    and the CLI's planner cut a long text into the same segments with the same token caps."""
    from ray import serve

    from chattts_serve.cli import build_parser
    from chattts_serve.say import engine_config
    from serve_app.engine.planner import Planner

    text = (
        "今天我们来聊一聊语音合成服务的部署，从单机到集群，再到自动扩缩容。它需要低延迟，也需要高吞吐量，"
        "还需要在异常输入面前保持稳定。Then we speak some English too: it costs $12.50, and the meeting is at 10:30."
    )
    opts = SynthesisOptions(voice="nova", seed=5)
    local = Planner(engine_config(build_parser().parse_args(["say", text, "-o", "x.wav"])).segments).plan(text, opts)
    normalizer = serve.get_deployment_handle("TextNormalizer", app_name=APP_NAME)
    served = normalizer.plan.remote(text, opts).result(timeout_s=60)
    assert len(local.segments) >= 3  # max_seconds cuts it (characters alone would not)
    assert served.texts == local.texts
    assert [(r.max_new_tokens, r.target_tokens, r.seed) for r in served.segments] == [
        (r.max_new_tokens, r.target_tokens, r.seed) for r in local.segments
    ]
