"""Speech behind ``POST /v1/audio/speech`` and the handle API: prepare, cache, plan, stream,
errors.

Every request is prepared (``pipeline/prepare.py``: admitted for model, length, priority, voice
and lexicon, then read into its script: instructions, SSML, a dialogue's turns; on a cache miss
the busy switch and a stream slot) and planned (normalised, split) before any byte is sent, and
the first audio chunk is awaited before the response starts, so an error before audio still
gets its proper status and an OpenAI-style body. The stages are reached through the speech
pipeline over their Serve handles (``pipeline/handles.py``); the Acoustic stage also reports its
queue here, for the busy and skip-refine switches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import Response

from .. import metrics
from ..engine.types import INTERNAL_CLIENT, Plan, SegmentMark, StreamSummary
from ..engine.voices import VoiceResolver
from ..errors import APIError, as_api_error, to_api_error
from ..pipeline import Admission, AudioStream, HandlesPipeline
from ..pipeline.flow import REF_HEADER, FlowCredit, FlowRef, paced
from ..pipeline.prepare import Preparation, Prepared
from ..pipeline.script import Script
from ..protocol import DialogueRequest, SpeechRequest, SpeechSegment, TimedSpeech, TimedSpeechRequest
from ..settings import EDGE_HEADER, CacheConfig, FlowConfig, IngressConfig
from ..storage.lexicons import LexiconBook
from ..storage.voices import VoiceCatalog
from .answers import Hit, build_timed_answer, hit_items, speech_segment, whole, with_audio
from .request_log import RequestRecord
from .security import ANONYMOUS, Caller, StreamSlots
from .speech_cache import SpeechCache
from .sse import sse_stream
from .streams import OwnedStreamResponse, SynthesisStream

log = logging.getLogger("ray.serve")
_BUILTIN = VoiceResolver()


def as_request(request: Union[SpeechRequest, dict], kind: type[SpeechRequest] = SpeechRequest) -> SpeechRequest:
    """A handle caller's request (the model or a dict), validated like an HTTP body as ``kind``."""
    if isinstance(request, kind):
        return request
    try:
        return kind.model_validate(request)
    except Exception as exc:  # noqa: BLE001 - pydantic.ValidationError
        raise as_api_error(exc) from None


# The warm-up's own synthesis: no key, no slot, default priority.
WARMUP_CALLER = Caller(id=INTERNAL_CLIENT, owner="anonymous", max_priority=0, max_streams=0, max_voices=None)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chattts-serve")
    except PackageNotFoundError:
        return "dev"


async def audio_only(items: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """The audio bytes of a synthesis stream (which also carries its segments' timing)."""
    async for item in items:
        if isinstance(item, bytes):
            yield item


class SpeechService:
    def __init__(
        self,
        normalizer: Any,
        vocoder: Any,
        acoustic: Any,
        voices: VoiceCatalog,
        cache: CacheConfig,
        settings: IngressConfig,
        slots: StreamSlots,
        flow: FlowConfig = FlowConfig(),
        flow_board: Optional[str] = None,
    ):
        self.flow = flow
        self.flow_board = flow_board  # None: no back-pressure (no board to report to)
        self.pipeline = HandlesPipeline(normalizer, vocoder, acoustic)
        self.acoustic = acoustic
        self.voices = voices
        self.admission = Admission(voices, slots, self.check_busy)
        self.preparation = Preparation(self.admission, settings.max_input_chars)
        self.cache = SpeechCache(cache)
        self.weights_kind = "unknown"
        self.weights_id = "unknown"  # cached audio is only valid for the same weights and engine code
        self._queue_rows = 0
        self._poll_task: Optional[asyncio.Task] = None
        self.apply(settings)

    @property
    def lexicons(self) -> Optional[LexiconBook]:
        """The Ingress's lexicon store (None: lexicons off), set once it has one."""
        return self.admission.lexicons

    @lexicons.setter
    def lexicons(self, book: Optional[LexiconBook]) -> None:
        self.admission.lexicons = book

    def apply(self, settings: IngressConfig) -> None:
        self.settings = settings
        self.preparation.max_chars = settings.max_input_chars
        needs_queue = settings.busy_queue_rows is not None or settings.skip_refine_queue_rows is not None
        if needs_queue and self._poll_task is None:
            self._poll_task = asyncio.get_event_loop().create_task(self._poll_queue())

    async def warmup(self, request_id: str) -> None:
        """Before ``/readyz`` says ready: the weights' identity (a cache-key input), then, unless
        ``ingress.warmup`` is off, one synthesis through every stage."""
        info = await self.acoustic.weights_info.remote()
        self.weights_kind = info["kind"]
        self.weights_id = f"{info['id']}:{_package_version()}"
        if self.settings.warmup:
            req = SpeechRequest(input="你好。", response_format="wav")
            audio = await self.synthesize(req, RequestRecord.start(req, request_id, client="warmup"), WARMUP_CALLER)
            if len(audio) <= 44:
                raise RuntimeError("warm-up synthesis produced no audio")

    async def _poll_queue(self) -> None:
        """Keep the acoustic queue length at hand for the degradation switches."""
        while True:
            try:
                stats = await self.acoustic.stats.remote()
                self._queue_rows = int(stats["waiting_rows"])
            except Exception:  # noqa: BLE001 - keep the last value; the stage may be restarting
                pass
            await asyncio.sleep(0.5)

    def check_busy(self) -> None:
        limit = self.settings.busy_queue_rows
        if limit is not None and self._queue_rows >= limit:
            raise APIError(
                429,
                "server busy: too many requests queued; retry shortly",
                type="rate_limit_error",
                code="busy",
                headers={"Retry-After": "2"},
            )

    # ------------------------------------------------------------------ the pipeline

    def _refine(self, req: SpeechRequest, script: Script) -> bool:
        """refine_text, unless the acoustic queue is past ``skip_refine_queue_rows`` (a script's
        parts are never refined)."""
        if not req.refine_text or script.parts is not None:
            return False
        busy = self.settings.skip_refine_queue_rows
        if busy is not None and self._queue_rows >= busy:
            log.info("queue at %d rows: skipping refine_text", self._queue_rows)
            return False
        return True

    def flow_ref(self) -> Optional[FlowRef]:
        """A new stream's edge to report on (None when back-pressure is off)."""
        if self.flow_board is None or not self.flow.enabled:
            return None
        return FlowRef.new(self.flow_board, self.flow.window)

    def open_audio(self, plan: Plan, response_format: str) -> AudioStream:
        """The pipeline's stream of ``plan``, reported as this replica takes its byte blocks."""
        return self.pipeline.audio(plan, response_format, self.flow_ref())

    async def _open(
        self, req: SpeechRequest, prepared: Prepared, rec: RequestRecord, listener: bool
    ) -> tuple[AudioStream, bytes, Plan]:
        """Plan and start a synthesis; return the stream, its first chunk and the plan. ``rec``:
        where the plan's and the first chunk's calls are timed (the call as seen here; the callee's
        own share comes back with the plan and the stream's summary). The stream slot is being
        taken meanwhile (its round trip overlaps the plan's); no stage streams before it is held
        (a stream cut here, by an error or a cancel, stops its stages itself). ``listener``: its
        segments are decoded by their playback deadline (the engine's real-time streams)."""
        try:
            t0 = time.perf_counter()
            plan = await prepared.plan(self.pipeline, self._refine(req, prepared.script))
            await prepared.admitted.held()
            t1 = time.perf_counter()
            plan.loudness = req.loudness  # the Vocoder keeps the whole audio and normalises it
            if listener:
                plan.segments = [dataclasses.replace(s, realtime=True) for s in plan.segments]
            gen = self.open_audio(plan, req.response_format)
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                first = b""
            rec.hop("plan_call", t1 - t0)
            rec.first_audio["normalizer"] = plan.planned_ms
            rec.hop("vocoder_call", time.perf_counter() - t1)
            return gen, first, plan
        except Exception as exc:  # noqa: BLE001
            raise as_api_error(exc) from None

    async def audio(
        self,
        req: SpeechRequest,
        rec: RequestRecord,
        caller: Caller,
        cache_control: str = "",
        timed: bool = False,
        listener: bool = False,
    ) -> Union[Hit, "SynthesisStream"]:
        """The request's audio: the cached answer on a hit, else a stream of its bytes and of a
        ``SpeechSegment`` once each segment's audio is complete, which holds one of the caller's
        stream slots until it ends (a hit takes none: it is one quick answer). The caller's id goes
        with every segment to the engine's fair admission. ``timed``: the caller needs the
        segments' timing, so only a hit stored with it counts. ``listener``: the answer streams to
        someone who plays it as it comes (its stalls are logged; a whole file's are nobody's).

        ``cache_control``: the request's Cache-Control header: ``no-cache`` skips the lookup (fresh
        synthesis, still stored), ``no-store`` also skips storing. Errors before the first audio
        byte raise APIError.
        """
        rec.caller = caller.id
        prepared: Optional[Prepared] = None
        try:
            # Model, length, priority, voice, lexicon, then the script (instructions, SSML, turns).
            prepared = await self.preparation.prepare(req, caller)
            script = prepared.script
            key = self.cache.key(req, prepared.voice, script, self.weights_id, caller.owner)
            key, hit = await self.cache.lookup(key, cache_control, rec, timed)
            if hit is not None:
                rec.first_byte()
                rec.finish("200")
                hit.headers = script.headers
                return hit
            self.admission.take_stream(prepared.admitted)  # the busy switch, then a stream slot
            rec.hop("ingress_checks", rec.since_start())
            try:
                gen, first, plan = await asyncio.wait_for(
                    self._open(req, prepared, rec, listener), self.settings.request_timeout_s
                )
                rec.hop("ingress_opened", rec.since_start())
            except asyncio.TimeoutError:
                raise APIError(
                    504, f"no audio within {self.settings.request_timeout_s:g}s", type="server_error", code="timeout"
                ) from None
        except BaseException as exc:
            if prepared is not None:
                prepared.admitted.release()
            api_exc = to_api_error(exc) if isinstance(exc, Exception) else None
            if api_exc is None:
                raise
            rec.finish(str(api_exc.status))
            raise api_exc from None
        rec.segments = len(plan.segments)
        stream = SynthesisStream(
            self._chain(first, gen, rec, key, plan, listener), prepared.admitted.hand_over(), gen, rec
        )
        stream.headers = script.headers
        stream.plan = plan  # what its segments are (their texts, spans, expected lengths)
        return stream

    async def _chain(
        self, first: bytes, gen: Any, rec: RequestRecord, key: Optional[str], plan: Plan, listener: bool
    ) -> AsyncIterator[Union[bytes, SpeechSegment]]:
        """Forward the stream within the deadline (marks as ``SpeechSegment``); record metrics and
        the log line; cache it with its segments."""
        status = "aborted"
        kept: Optional[list[bytes]] = [] if key else None
        segments: list[SpeechSegment] = []
        size = 0
        limit = self.cache.config.max_item_bytes
        deadline = rec.t0 + self.settings.request_timeout_s
        rec.first_byte()
        try:
            async with gen:  # left before its end (timeout, client gone, a stage failed): every stage stops
                data: Any = first
                while True:
                    if isinstance(data, StreamSummary):
                        rec.audio_s, rec.batch_rows = data.audio_seconds, data.batch_rows
                        if listener:
                            rec.stall_s, rec.min_slack_s = data.stall_s, data.min_slack_s
                        rec.first_audio.update(data.first_audio or {})
                    elif isinstance(data, SegmentMark):
                        segment = speech_segment(data, plan)
                        segments.append(segment)
                        yield segment
                    elif data:
                        if kept is not None:
                            size += len(data)
                            kept = kept if size <= limit else None
                            if kept is not None:
                                kept.append(data)
                        yield data
                    try:
                        data = await asyncio.wait_for(gen.__anext__(), max(0.001, deadline - time.perf_counter()))
                    except StopAsyncIteration:
                        break
                    except asyncio.TimeoutError:
                        status = "timeout"
                        log.warning(
                            "request %s hit its %gs timeout mid-stream",
                            rec.request_id,
                            self.settings.request_timeout_s,
                        )
                        return
            status = "200"
        except asyncio.CancelledError:
            status = "client_disconnect"
            raise
        except Exception:
            status = "error"
            log.exception("stream failed after the first byte")
            raise
        finally:
            if status == "200":
                if kept:
                    await self.cache.put(key, kept, segments, rec.audio_s)
            else:  # client gone, timeout or a stage failed (the stream stopped its stages)
                metrics.inc("tts_stream_aborted_total", reason=status)
            rec.finish(status)

    # ------------------------------------------------------------------ the two ways in

    async def synthesize(self, req: SpeechRequest, rec: RequestRecord, caller: Caller) -> bytes:
        """The whole audio file (handle API, warm-up), with its true length."""
        audio = await self.audio(req, rec, caller)
        if isinstance(audio, Hit):
            return audio.audio
        async with audio:
            return await asyncio.to_thread(whole, [b async for b in audio_only(audio)])

    async def stream(self, req: SpeechRequest, rec: RequestRecord, caller: Caller) -> AsyncIterator[bytes]:
        """Audio bytes as they are made (handle API with ``.options(stream=True)``)."""
        audio = await self.audio(req, rec, caller, listener=True)
        if isinstance(audio, Hit):
            yield audio.audio
            return
        async with audio:
            async for data in audio_only(audio):
                yield data

    @staticmethod
    def _edge_cacheable(req: SpeechRequest, caller: Caller) -> bool:
        """A plain request of a content-addressed voice (an SSML document or a dialogue may name
        stored voices inside: always answered by the Ingress) whose audio no lexicon can change:
        ``lexicon: "none"``, or none named by a caller without a key (the anonymous owner has no
        default). A key's default lexicon, or a named one, may be replaced or deleted at any time,
        and the proxy cannot know: those answers always come from the Ingress (its cache keys the
        lexicon's content)."""
        if type(req) is not SpeechRequest or req.is_ssml or not _edge_cacheable_voice(req.voice):
            return False
        return req.lexicon == "none" or (req.lexicon is None and caller.owner == ANONYMOUS)

    def answer_headers(self, rec: RequestRecord) -> dict[str, str]:
        # X-Cache only where the cache is the caller's own: on a cache shared across keys a hit
        # would tell one key what another has asked for.
        out = {"X-Weights": self.weights_kind, "Cache-Control": "no-store"}
        if not self.cache.config.share_across_keys:
            out["X-Cache"] = rec.cache
        return out

    async def timed(
        self,
        req: Union[TimedSpeechRequest, DialogueRequest],
        rec: RequestRecord,
        caller: Caller,
        cache_control: str = "",
    ) -> Response:
        """The whole audio with where each segment lies in it, and captions on request (JSON)."""
        shell, audio_b64, headers = await self._timed_parts(req, rec, caller, cache_control)
        body = await asyncio.to_thread(with_audio, shell, audio_b64)
        return Response(body, media_type="application/json", headers=headers)

    async def timed_answer(
        self,
        req: Union[TimedSpeechRequest, DialogueRequest],
        rec: RequestRecord,
        caller: Caller,
        cache_control: str = "",
    ) -> tuple[TimedSpeech, dict[str, str]]:
        """What ``timed`` answers, and its headers (the handle API returns the answer alone)."""
        shell, audio_b64, headers = await self._timed_parts(req, rec, caller, cache_control)
        return shell.model_copy(update={"audio": audio_b64.decode("ascii")}), headers

    async def _timed_parts(
        self, req: Union[TimedSpeechRequest, DialogueRequest], rec: RequestRecord, caller: Caller, cache_control: str
    ) -> tuple[TimedSpeech, bytes, dict[str, str]]:
        """The answer without its audio, the audio as base64, the headers. A long answer is tens of
        megabytes: it is joined, encoded and captioned off the event loop, in pieces."""
        audio = await self.audio(req, rec, caller, cache_control, timed=True)
        headers = {**self.answer_headers(rec), **audio.headers}
        if isinstance(audio, Hit):
            parts, segments, duration = [audio.audio], audio.segments or [], audio.duration
        else:
            parts = []
            segments = []
            async with audio:
                async for item in audio:
                    (parts if isinstance(item, bytes) else segments).append(item)
            duration = rec.audio_s
        shell, audio_b64 = await asyncio.to_thread(
            build_timed_answer, req, parts, segments, duration, not isinstance(audio, Hit)
        )
        return shell, audio_b64, headers

    async def respond(
        self, body: SpeechRequest, rec: RequestRecord, caller: Caller, cache_control: str, flow_acks: bool = False
    ) -> Response:
        """The HTTP answer: a hit's bytes as one response, else the stream (SSE-framed on request).
        ``flow_acks``: the flow middleware reports what the client's socket takes, so the stream
        stays at most a window ahead of the client (pipeline/flow.py)."""
        audio = await self.audio(body, rec, caller, cache_control, timed=body.timestamps, listener=True)
        headers = {**self.answer_headers(rec), **audio.headers}
        if isinstance(audio, Hit):
            if body.stream_format != "sse":
                # A hit goes out as one plain response: no streaming round trips through the proxy;
                # the edge cache in the proxy may give it again (deployments/proxy/edge_cache.py).
                if self._edge_cacheable(body, caller):
                    headers[EDGE_HEADER] = "1"
                return Response(audio.audio, media_type=body.content_type, headers=headers)
            items: Any = hit_items(audio)
        else:
            items = audio
        if body.stream_format == "sse":
            usage = {"input_tokens": len(body.input), "output_tokens": 0, "total_tokens": len(body.input)}
            stream = sse_stream(items, usage, timestamps=body.timestamps, captions=body.captions)
        else:
            stream = audio_only(items)
        ref = self.flow_ref() if flow_acks else None
        if ref is not None:
            headers[REF_HEADER] = ref.header()  # the middleware takes it off the answer
            stream = paced(stream, FlowCredit(ref))
        return OwnedStreamResponse(stream, items, media_type=body.content_type, headers=headers)


def _edge_cacheable_voice(name: str) -> bool:
    """A voice named by its content (built in, seed:<n>, a speaker string): what it says cannot
    change under the name, unlike a stored voice's."""
    from ..engine.errors import VoiceError

    try:
        _BUILTIN.resolve(name)
        return True
    except VoiceError:
        return False
