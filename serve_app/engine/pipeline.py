"""The synthesis pipeline as plain Python: plan segments, decode, vocode, encode.

``Planner`` (text front end + voices + pacing) turns one request into segment requests;
``AudioAssembler`` turns a request's ordered hidden-state chunks into encoded bytes;
``Synthesizer`` wires them to an ``AcousticEngine`` in one process (CLI, tests, benchmarks).
The Ray Serve deployments use the same pieces, one per stage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator, Optional

import numpy as np

from .acoustic import AcousticEngine, HiddenChunk, RowStream, SegmentRequest
from .audio import AudioEncoder, new_encoder
from .config import EngineConfig, SegmentLimits, VocoderConfig
from .pacing import expected_tokens, max_new_tokens, speed_tag_level
from .text import TextFrontend
from .threads import TorchThread, on_new_thread
from .vocoder import Vocoder, VocoderStream
from .voices import MAX_SEED, Voice, VoiceResolver

log = logging.getLogger(__name__)


class EmptyInputError(ValueError):
    """The text has nothing speakable (only punctuation, tags or whitespace)."""


@dataclass
class SynthesisOptions:
    """What a caller may choose about one synthesis (the HTTP/handle layer validates ranges)."""

    voice: str = "alloy"
    seed: Optional[int] = None
    speed: float = 1.0
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    prompt: str = ""  # ChatTTS control tags, e.g. "[oral_2][laugh_0][break_6]"
    normalize: bool = True
    lang: Optional[str] = None
    priority: int = 0


@dataclass
class Plan:
    voice: Voice
    segments: list[SegmentRequest]
    texts: list[str]  # the normalised segment texts


def segment_seed(seed: int, index: int) -> int:
    """Each segment of a request gets its own, reproducible seed."""
    return (seed + index * 7919) % (MAX_SEED + 1)


class Planner:
    """Text -> segment requests. Needs only the speaker statistics, not the GPT weights."""

    def __init__(self, speaker, limits: SegmentLimits = SegmentLimits(), frontend: Optional[TextFrontend] = None):
        self.limits = limits
        self.frontend = frontend or TextFrontend()
        self.voices = VoiceResolver(speaker)

    def warmup(self) -> None:
        self.frontend.warmup()

    def plan(self, text: str, opts: SynthesisOptions) -> Plan:
        segments = self.frontend.process(
            text, lang=opts.lang, normalize=opts.normalize, max_chars=self.limits.max_chars,
            max_seconds=self.limits.max_seconds,
        )
        return self.plan_texts([s.text for s in segments], opts)

    def plan_texts(self, texts: list[str], opts: SynthesisOptions) -> Plan:
        """Segment requests for already normalised segment texts (e.g. after refine_text)."""
        voice = self.voices.resolve(opts.voice)
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise EmptyInputError("input has nothing to speak (only punctuation, tags or whitespace)")
        level = speed_tag_level(opts.speed)
        prompt = f"[speed_{level}]{opts.prompt}"
        seed = opts.seed if opts.seed is not None else (voice.seed if voice.seed is not None else 0)
        reqs = [
            SegmentRequest(
                text=text,
                spk_emb=voice.spk_emb,
                seed=segment_seed(seed, i),
                target_tokens=expected_tokens(text, level),
                max_new_tokens=max_new_tokens(text, self.limits, level),
                prompt=prompt,
                temperature=opts.temperature,
                top_p=opts.top_p,
                top_k=opts.top_k,
                priority=opts.priority,
            )
            for i, text in enumerate(texts)
        ]
        return Plan(voice, reqs, texts)


class AudioAssembler:
    """Ordered hidden chunks of a request's segments -> encoded audio bytes, as they come.

    One sliding-window vocoder stream per segment (segments are independent utterances) and
    one encoder for the whole response.
    """

    def __init__(self, vocoder: Vocoder, fmt: str, vocoder_cfg: Optional[VocoderConfig] = None):
        self.vocoder = vocoder
        self.vocoder_cfg = vocoder_cfg
        self.encoder: AudioEncoder = new_encoder(fmt)
        self._stream: Optional[VocoderStream] = None
        self._segment: Optional[int] = None
        self.samples = 0
        self.vocode_seconds = 0.0  # time in Decoder + Vocos
        self.encode_seconds = 0.0  # time in the audio encoder

    def feed(self, segment: int, chunk: HiddenChunk) -> bytes:
        out = b""
        if segment != self._segment:
            out += self._end_segment()
            self._segment = segment
            self._stream = self.vocoder.stream(self.vocoder_cfg)
        t0 = time.perf_counter()
        pcm = self._stream.push(chunk.hidden)
        if chunk.final:
            pcm = np.concatenate([pcm, self._stream.finish()])
            self._stream = None
        self.vocode_seconds += time.perf_counter() - t0
        return out + self._encode(pcm)

    def _end_segment(self) -> bytes:
        if self._stream is None:
            return b""
        t0 = time.perf_counter()
        pcm = self._stream.finish()
        self.vocode_seconds += time.perf_counter() - t0
        self._stream = None
        return self._encode(pcm)

    def _encode(self, pcm: np.ndarray) -> bytes:
        if not len(pcm):
            return b""
        self.samples += len(pcm)
        t0 = time.perf_counter()
        data = self.encoder.write(pcm)
        self.encode_seconds += time.perf_counter() - t0
        return data

    def close(self) -> bytes:
        tail = self._end_segment()
        t0 = time.perf_counter()
        tail += self.encoder.close()
        self.encode_seconds += time.perf_counter() - t0
        return tail


def ordered_chunks(streams: list[RowStream]) -> Iterator[tuple[int, HiddenChunk]]:
    """Chunks of several rows, segment by segment (later rows decode meanwhile and queue up)."""
    try:
        for i, stream in enumerate(streams):
            for chunk in stream:
                yield i, chunk
    finally:
        for stream in streams:
            stream.cancel()


async def aordered_chunks(streams: list[RowStream]) -> AsyncIterator[tuple[int, HiddenChunk]]:
    try:
        for i, stream in enumerate(streams):
            async for chunk in stream:
                yield i, chunk
    finally:
        for stream in streams:
            stream.cancel()


class Synthesizer:
    """Everything in one process: text in, encoded audio bytes out (streamed)."""

    def __init__(self, config: EngineConfig = EngineConfig(), model=None):
        from .weights import load_model

        self.config = config
        # The decode thread keeps the only multi-threaded OpenMP team (threads.py): load on a thread
        # that exits, vocode on one single-threaded torch thread.
        self.model = model or on_new_thread(load_model, config.model)
        self.planner = Planner(self.model.chat.speaker, config.segments)
        self.engine = AcousticEngine(self.model, config.acoustic)
        self.vocoder = Vocoder(self.model, config.vocoder)
        self._vocode = TorchThread("vocoder", threads=1)
        self.engine.start()

    def close(self) -> None:
        self.engine.stop()
        self._vocode.shutdown()

    def stream(self, text: str, fmt: str = "wav", opts: SynthesisOptions = SynthesisOptions(),
               plan: Optional[Plan] = None, assembler: Optional[AudioAssembler] = None,
               on_tokens: Optional[Callable[[int], None]] = None) -> Iterator[bytes]:
        """Encoded audio as it is made. The CLI passes its own ``plan`` (made from ``text``) and
        ``assembler`` to report segments and samples, and ``on_tokens`` (each chunk's tokens)."""
        plan = plan or self.planner.plan(text, opts)
        assembler = assembler or AudioAssembler(self.vocoder, fmt)
        streams = self.engine.submit_all(plan.segments)
        for seg, chunk in ordered_chunks(streams):
            data = self._vocode.call(assembler.feed, seg, chunk)
            if on_tokens is not None:
                on_tokens(chunk.hidden.shape[0])
            if data:
                yield data
        tail = self._vocode.call(assembler.close)
        if tail:
            yield tail

    async def astream(self, text: str, fmt: str = "wav", opts: SynthesisOptions = SynthesisOptions()) -> AsyncIterator[bytes]:
        plan = self.planner.plan(text, opts)
        assembler = AudioAssembler(self.vocoder, fmt)
        loop = asyncio.get_running_loop()
        streams = self.engine.submit_all(plan.segments, loop=loop)
        async for seg, chunk in aordered_chunks(streams):
            data = await self._vocode.acall(assembler.feed, seg, chunk)
            if data:
                yield data
        tail = await self._vocode.acall(assembler.close)
        if tail:
            yield tail

    def synthesize(self, text: str, fmt: str = "wav", opts: SynthesisOptions = SynthesisOptions()) -> bytes:
        return b"".join(self.stream(text, fmt, opts))
