"""The voice-agent frameworks' ElevenLabs plugins, unchanged, against the service's ElevenLabs door
(serve_app/elevenlabs/) on the session's Serve app, through Serve's HTTP proxy, with the README's
setup: the plugin's base URL set to the service, its API key one of the service's keys.

- Pipecat's ``ElevenLabsTTSService`` (multi-stream-input) in a pipeline, LLM text frames arriving
  token by token, then an interruption mid-answer; its ``ElevenLabsHttpTTSService``
  (``/stream/with-timestamps``);
- LiveKit Agents' ElevenLabs ``TTS``: ``stream()`` (multi-stream-input) and ``synthesize()``
  (``/stream``);
- the door's own contract where no plugin goes: keys (``xi-api-key`` or the bearer key), a
  context counting against the key's stream limit, the HTTP routes' errors.

Random weights: every segment has its target length, so the audio each plugin gets is compared
with one ``/v1/audio/speech`` request of the same text, sample for sample. The messages, cutting
and alignment without Ray: tests/unit/test_elevenlabs.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any, AsyncIterator, Optional

import httpx
import pytest
from support.app import ingress_settings
from support.report import report
from support.ws import Served, assert_same_audio, deltas, http_pcm

from serve_app.settings import SecurityConfig

KEY = "sk-eleven-one"
VOICE = "nova"
TEXT = "".join(Served.sentences)
LONG = "".join(Served.long_sentences)

pipecat = pytest.importorskip("pipecat", reason="pipecat-ai[elevenlabs] does not install on this Python")
livekit_elevenlabs = pytest.importorskip(
    "livekit.plugins.elevenlabs", reason="livekit-plugins-elevenlabs does not install on this Python"
)


@contextlib.contextmanager
def keys(tmp_path, **security: Any):
    """The Ingress with API keys (``KEY``), as an operator who serves the plugins runs it."""
    path = tmp_path / "keys.txt"
    path.write_text(KEY + "\n")
    with ingress_settings(
        security={**SecurityConfig().model_dump(), "api_keys_env": None, "api_keys_file": str(path), **security}
    ):
        yield


@pytest.fixture
def served(app_url) -> Served:
    return Served(app_url)


def ws_base(app_url: str) -> str:
    return app_url.replace("http://", "ws://")


# ---------------------------------------------------------------------------------------- Pipecat


class PipecatRun:
    """A Pipecat pipeline (the TTS service, then a sink that keeps what reaches the transport's
    place: audio frames with their arrival time, and the words the service times from the
    alignment), run until ``stop()``."""

    def __init__(self, tts) -> None:
        from pipecat.frames.frames import TTSAudioRawFrame, TTSTextFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.frame_processor import FrameProcessor
        from pipecat.workers.runner import WorkerRunner

        run = self
        self.audio: list[tuple[float, bytes]] = []
        self.words: list[str] = []
        self.errors: list[Any] = []

        class Sink(FrameProcessor):
            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                if isinstance(frame, TTSAudioRawFrame):
                    run.audio.append((time.perf_counter(), frame.audio))
                elif isinstance(frame, TTSTextFrame):
                    run.words.append(frame.text)
                elif type(frame).__name__ == "ErrorFrame":
                    run.errors.append(frame)
                await self.push_frame(frame, direction)

        self.worker = PipelineWorker(Pipeline([tts, Sink()]), cancel_on_idle_timeout=False)
        self.started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def _started(worker, frame):
            self.started.set()

        self.runner = WorkerRunner(handle_sigint=False)
        self.task: Optional[asyncio.Task] = None

    async def __aenter__(self) -> "PipecatRun":
        await self.runner.add_workers(self.worker)
        self.task = asyncio.ensure_future(self.runner.run())
        await asyncio.wait_for(self.started.wait(), 60)
        return self

    async def __aexit__(self, *exc) -> None:
        from pipecat.frames.frames import EndFrame

        await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(self.task, 60)

    async def push(self, frame) -> None:
        await self.worker.queue_frame(frame)

    def pcm(self) -> bytes:
        return b"".join(data for _, data in self.audio)

    async def audio_settled(self, quiet_s: float = 1.5, timeout_s: float = 120) -> bytes:
        """The audio once no frame came for ``quiet_s``."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            n = len(self.audio)
            await asyncio.sleep(quiet_s)
            if n and len(self.audio) == n:
                return self.pcm()
        raise AssertionError(f"the audio did not settle within {timeout_s} s: {len(self.audio)} frames")

    async def first_audio_after(self, n: int, timeout_s: float = 120) -> float:
        deadline = time.perf_counter() + timeout_s
        while len(self.audio) <= n:
            assert time.perf_counter() < deadline, "no audio"
            assert not self.errors, self.errors
            await asyncio.sleep(0.005)
        return self.audio[n][0]


def pipecat_tts(app_url: str, **kw):
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
    from pipecat.services.tts_service import TextAggregationMode

    return ElevenLabsTTSService(
        api_key=KEY,
        url=ws_base(app_url),
        sample_rate=24000,
        settings=ElevenLabsTTSService.Settings(voice=VOICE),
        text_aggregation_mode=TextAggregationMode.TOKEN,  # tokens to the socket as they come
        **kw,
    )


async def llm_turn(run: PipecatRun, text: str, seed: int, after_first_sentence: Optional[list] = None) -> float:
    """One LLM answer: its text frames a few characters at a time; returns when the first
    sentence's last token was pushed."""
    from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame

    first_end = text.index(".") + 1
    await run.push(LLMFullResponseStartFrame())
    pos, t_last = 0, 0.0
    for d in deltas(text, seed=seed):
        await run.push(LLMTextFrame(d))
        pos += len(d)
        if not t_last and pos >= first_end:
            t_last = time.perf_counter()
        await asyncio.sleep(0.01)  # an LLM's pace, about
    await run.push(LLMFullResponseEndFrame())
    return t_last


async def http_first_byte(app_url: str, text: str) -> float:
    """Seconds to the first audio byte of ``text`` sent whole to ``/v1/audio/speech`` (streamed)."""
    async with httpx.AsyncClient(timeout=120) as client:
        t0 = time.perf_counter()
        async with client.stream(
            "POST",
            app_url + "/v1/audio/speech",
            json={"model": "chattts", "input": text, "voice": VOICE, "response_format": "pcm"},
            headers={"Authorization": f"Bearer {KEY}", "Cache-Control": "no-store"},
        ) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                if chunk:
                    return time.perf_counter() - t0
    raise AssertionError("no audio")


async def test_pipecat_websocket_tokens_then_barge_in(app_url, served, tmp_path):
    reference = await asyncio.to_thread(http_pcm, app_url, TEXT, voice=VOICE)
    first_sentence = Served.sentences[0]
    with keys(tmp_path):
        async with PipecatRun(pipecat_tts(app_url)) as run:
            # An answer, token by token: the same audio as one request of it, word times from
            # the alignment, and the first audio soon after the first sentence's last token.
            t_token = await llm_turn(run, TEXT, seed=5)
            t_audio = await run.first_audio_after(0)
            pcm = await run.audio_settled()
            assert not run.errors, run.errors
            assert_same_audio(pcm, reference)
            assert " ".join(w.strip() for w in run.words).split() == TEXT.split()
            ws_first = t_audio - t_token
            http_first = min([await http_first_byte(app_url, first_sentence) for _ in range(2)])

            # A barge-in mid-answer: the context's rows stop at once and nothing more is decoded.
            from pipecat.frames.frames import InterruptionFrame

            before = await served.idle()
            n = len(run.audio)
            await llm_turn(run, LONG, seed=6)
            await run.first_audio_after(n)
            await served.rows_at_least(1)
            t_int = time.perf_counter()
            await run.push(InterruptionFrame())
            after = await served.idle()
            stopped = time.perf_counter() - t_int
            assert after["rows_cancelled"] > before["rows_cancelled"], "the interruption cancelled no row"
            finished = after["rows_finished"] - before["rows_finished"]
            assert finished < len(Served.long_sentences), "the interrupted answer was decoded to its end"
            heard = sum(len(data) for _, data in run.audio[n:]) / 2 / 24000
            assert heard < 8, f"{heard:.1f} s of the interrupted answer"
    report(
        "elevenlabs door (pipecat ws): first audio after the first sentence's last token",
        f"{1000 * ws_first:.0f} ms vs {1000 * http_first:.0f} ms for the sentence to /v1/audio/speech "
        f"({ws_first / http_first:.2f}x)",
    )
    report("elevenlabs door (pipecat ws): interruption to rows idle", f"{1000 * stopped:.0f} ms")


async def test_pipecat_http_with_timestamps(app_url, tmp_path):
    import aiohttp
    from pipecat.frames.frames import TTSSpeakFrame
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService

    text = "A plugin over plain HTTP. It reads the timestamps too."
    reference = await asyncio.to_thread(http_pcm, app_url, text, voice=VOICE)
    with keys(tmp_path):
        async with aiohttp.ClientSession() as session:
            tts = ElevenLabsHttpTTSService(
                api_key=KEY,
                base_url=app_url,
                aiohttp_session=session,
                sample_rate=24000,
                settings=ElevenLabsHttpTTSService.Settings(voice=VOICE),
            )
            async with PipecatRun(tts) as run:
                await run.push(TTSSpeakFrame(text))
                pcm = await run.audio_settled()
    assert not run.errors, run.errors
    assert_same_audio(pcm, reference)
    assert " ".join(w.strip() for w in run.words).split() == text.split()


# ---------------------------------------------------------------------------------------- LiveKit


def livekit_audio(pcm: bytes, reference: bytes) -> bytes:
    """LiveKit's emitter ends an answer on whole 10 ms frames, padding the last with silence:
    the audio without that padding."""
    pad = pcm[len(reference) :]
    assert len(pad) <= 2 * 240 and not any(pad), f"{len(pad)} bytes past the answer, not LiveKit's padding"
    return pcm[: len(reference)]


def livekit_tts(app_url: str, session):
    from livekit.plugins import elevenlabs

    return elevenlabs.TTS(
        api_key=KEY, voice_id=VOICE, base_url=app_url + "/v1", encoding="pcm_24000", http_session=session
    )


async def test_livekit_stream_and_synthesize(app_url, tmp_path):
    import aiohttp

    reference = await asyncio.to_thread(http_pcm, app_url, TEXT, voice=VOICE)
    with keys(tmp_path):
        async with aiohttp.ClientSession() as session:
            tts = livekit_tts(app_url, session)
            # stream(): text pushed as an LLM writes it, frames read as they come.
            stream = tts.stream()
            for d in deltas(TEXT, seed=7):
                stream.push_text(d)
            stream.end_input()
            frames = [ev.frame async for ev in stream]
            await stream.aclose()
            streamed = b"".join(bytes(f.data) for f in frames)
            # synthesize(): the whole text, over /stream.
            whole = b"".join([bytes(ev.frame.data) async for ev in tts.synthesize(TEXT)])
            await tts.aclose()
    assert {f.sample_rate for f in frames} == {24000}
    assert_same_audio(livekit_audio(whole, reference), reference)
    # LiveKit cuts the text into sentences itself and sends each with a flush: a segment each,
    # as the request's planner cuts them too.
    assert_same_audio(livekit_audio(streamed, reference), reference)


# ---------------------------------------------------------------------------------------- the door's own contract


async def test_keys_and_a_context_is_a_stream(app_url, tmp_path):
    from websockets.asyncio.client import connect

    url = ws_base(app_url) + f"/v1/text-to-speech/{VOICE}/multi-stream-input?output_format=pcm_16000"
    with keys(tmp_path, max_streams_per_key=1):
        # No key: refused before the handshake's accept or with the error message (no audio).
        async with connect(url, open_timeout=60) as ws:
            await ws.send(json.dumps({"text": " ", "context_id": "a"}))
            msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert msg["error"] == "invalid_api_key" and msg["code"] == 4401
        async with connect(url, additional_headers={"xi-api-key": KEY}, open_timeout=60) as ws:
            await ws.send(json.dumps({"text": " ", "context_id": "a"}))
            await ws.send(json.dumps({"text": "One stream.", "context_id": "a", "flush": True}))
            audio = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert audio["contextId"] == "a" and base64.b64decode(audio["audio"])
            assert audio["alignment"]["chars"][0] == " "
            # A second context is a second stream: past the key's limit.
            await ws.send(json.dumps({"text": " ", "context_id": "b"}))
            while "error" not in (msg := json.loads(await asyncio.wait_for(ws.recv(), 60))):
                pass
            assert (msg["error"], msg["code"], msg["contextId"]) == ("too_many_streams", 4429, "b")
        # The slot was given back: the bearer key works too, and the key in the first message.
        for headers, first in (({"Authorization": f"Bearer {KEY}"}, {}), ({}, {"xi-api-key": KEY})):
            async with connect(url, additional_headers=headers, open_timeout=60) as ws:
                await ws.send(json.dumps({"text": " ", "context_id": "c", **first}))
                await ws.send(json.dumps({"text": "Again.", "context_id": "c", "flush": True}))
                await ws.send(json.dumps({"context_id": "c", "close_context": True}))
                got = [json.loads(m) async for m in _until_final(ws)]
                assert got[-1] == {"isFinal": True, "contextId": "c"} and any("audio" in m for m in got)


async def _until_final(ws) -> AsyncIterator[str]:
    while True:
        raw = await asyncio.wait_for(ws.recv(), 60)
        yield raw
        if json.loads(raw).get("isFinal"):
            return


async def test_http_routes(app_url, tmp_path):
    text = "Three routes, one voice."
    reference = await asyncio.to_thread(http_pcm, app_url, text, voice=VOICE)
    body = {"text": text, "model_id": "eleven_flash_v2_5", "voice_settings": {"stability": 0.4}}
    headers = {"xi-api-key": KEY, "Cache-Control": "no-store"}
    base = f"{app_url}/v1/text-to-speech/{VOICE}"
    with keys(tmp_path):
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(base, params={"output_format": "pcm_24000"}, json=body, headers=headers)
            assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm", r.text[:300]
            assert_same_audio(r.content, reference)
            r = await client.post(base + "/stream", params={"output_format": "pcm_24000"}, json=body, headers=headers)
            assert r.status_code == 200
            assert_same_audio(r.content, reference)
            r = await client.post(
                base + "/stream/with-timestamps", params={"output_format": "pcm_24000"}, json=body, headers=headers
            )
            assert r.status_code == 200, r.text[:300]
            lines = [json.loads(line) for line in r.text.splitlines() if line]
            assert_same_audio(b"".join(base64.b64decode(x["audio_base64"]) for x in lines), reference)
            chars = "".join("".join(x["alignment"]["characters"]) for x in lines if x.get("alignment"))
            assert chars == text
            ends = [t for x in lines if x.get("alignment") for t in x["alignment"]["character_end_times_seconds"]]
            assert ends == sorted(ends) and ends[-1] <= len(reference) / 2 / 24000 + 0.001
            # Errors as every door gives them: no key 401, an unknown format or voice 400.
            r = await client.post(base, json=body)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            r = await client.post(base, params={"output_format": "wav_1"}, json=body, headers=headers)
            assert r.status_code == 400, r.text[:300]
            r = await client.post(f"{app_url}/v1/text-to-speech/no-such-voice", json=body, headers=headers)
            assert r.status_code in (400, 404) and r.json()["error"]["code"], r.text[:300]
