"""The synthesis pipeline as plain Python: plan segments, decode, vocode, encode.

``Planner`` (``planner.py``: text front end + voices + pacing, no torch) turns one request into
segment requests; ``AudioAssembler`` turns a request's ordered hidden-state chunks into encoded
bytes; ``Synthesizer`` wires them to an ``AcousticEngine`` in one process (CLI, tests,
benchmarks). The Ray Serve deployments use the same pieces, one per stage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable, Iterator, Optional

import numpy as np
import torch

from .acoustic import AcousticEngine
from .audio import SAMPLE_RATE, AudioEncoder, new_encoder
from .config import EngineConfig, VocoderConfig, acoustic_heard_through
from .decode.streams import HiddenChunk, RowStream
from .errors import EmptyInputError  # noqa: F401  (re-exported: callers catch it with the planner)
from .planner import Planner, segment_seed  # noqa: F401  (re-exported)
from .threads import TorchThread, on_new_thread
from .types import Plan, SegmentMark, SynthesisOptions  # noqa: F401  (re-exported)
from .vocoder import Vocoder, VocoderStream
from .wav import with_true_length

log = logging.getLogger(__name__)


class AudioAssembler:
    """Ordered hidden chunks of a request's segments -> encoded audio bytes, as they come.

    One sliding-window vocoder stream per segment (segments are independent utterances) and
    one encoder for the whole response. It knows where each segment's audio lies in the stream
    (``take_marks``: a ``SegmentMark`` once a segment's audio is complete), puts the plan's
    silences before the first segment (``lead_in``) and after segments (``pauses``: seconds after
    segment i), applies ``gain_db`` to every chunk, and with ``loudness`` (LUFS) keeps the whole
    audio and normalises it at ``close()`` (a loudness is a property of the whole: the bytes then
    all come at the end).
    """

    def __init__(
        self,
        vocoder: Vocoder,
        fmt: str,
        vocoder_cfg: Optional[VocoderConfig] = None,
        pauses: Optional[list[float]] = None,
        gain_db: float = 0.0,
        lead_in: float = 0.0,
        loudness: Optional[float] = None,
    ):
        self.vocoder = vocoder
        self.vocoder_cfg = vocoder_cfg
        self.encoder: AudioEncoder = new_encoder(fmt, gain_db=gain_db)
        self.pauses = list(pauses or [])
        self.lead_in = lead_in
        self.loudness = loudness
        self._whole: Optional[list[np.ndarray]] = [] if loudness is not None else None
        self._stream: Optional[VocoderStream] = None
        self._segment: Optional[int] = None
        self._segment_start = 0
        self._marks: list[SegmentMark] = []
        self.samples = 0
        self.vocode_seconds = 0.0  # time in Decoder + Vocos
        self.encode_seconds = 0.0  # time in the audio encoder

    def feed(self, segment: int, hidden: torch.Tensor, final: bool) -> bytes:
        """Hidden states (n, 768) of ``segment``; ``final`` on its last chunk."""
        out = b""
        if self._segment is None and self.lead_in > 0:
            out += self._encode(_silence(self.lead_in))
        if segment != self._segment:
            out += self._end_segment()
            self._segment = segment
            self._segment_start = self.samples
            self._stream = self.vocoder.stream(self.vocoder_cfg)
        t0 = time.perf_counter()
        pcm = self._stream.push(hidden)
        if final:
            pcm = np.concatenate([pcm, self._stream.finish()])
            self._stream = None
        self.vocode_seconds += time.perf_counter() - t0
        out += self._encode(pcm)
        if final:
            out += self._close_segment()
        return out

    def _end_segment(self) -> bytes:
        if self._stream is None:
            return b""
        t0 = time.perf_counter()
        pcm = self._stream.finish()
        self.vocode_seconds += time.perf_counter() - t0
        self._stream = None
        return self._encode(pcm) + self._close_segment()

    def _close_segment(self) -> bytes:
        """The segment's audio is complete: its mark, then the silence the plan puts after it."""
        index = self._segment
        self._marks.append(SegmentMark(index, self._segment_start, self.samples))
        pause = self.pauses[index] if index is not None and index < len(self.pauses) else 0.0
        return self._encode(_silence(pause)) if pause > 0 else b""

    def take_marks(self) -> list[SegmentMark]:
        """Segments whose audio became complete since the last call, in order."""
        marks, self._marks = self._marks, []
        return marks

    def _encode(self, pcm: np.ndarray) -> bytes:
        if not len(pcm):
            return b""
        self.samples += len(pcm)
        if self._whole is not None:
            self._whole.append(pcm)
            return b""
        t0 = time.perf_counter()
        data = self.encoder.write(pcm)
        self.encode_seconds += time.perf_counter() - t0
        return data

    def close(self) -> bytes:
        tail = self._end_segment()
        t0 = time.perf_counter()
        if self._whole is not None:
            from .loudness import normalize_loudness

            whole = np.concatenate(self._whole) if self._whole else np.zeros(0, dtype=np.float32)
            self._whole = None
            if len(whole):
                tail += self.encoder.write(normalize_loudness(whole, self.loudness))
        tail += self.encoder.close()
        self.encode_seconds += time.perf_counter() - t0
        return tail


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * SAMPLE_RATE)), dtype=np.float32)


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
        from .weights.loading import load_model

        self.config = config
        # The decode thread keeps the only multi-threaded OpenMP team (threads.py): load on a thread
        # that exits, vocode on one single-threaded torch thread.
        self.model = model or on_new_thread(load_model, config.model)
        self.planner = Planner(config.segments)
        self.engine = AcousticEngine(self.model, acoustic_heard_through(config.acoustic, config.vocoder))
        self.vocoder = Vocoder(self.model, config.vocoder)
        self._vocode = TorchThread("vocoder", threads=1)
        self.engine.start()

    def close(self) -> None:
        self.engine.stop()
        self._vocode.shutdown()

    def stream(
        self,
        text: str,
        fmt: str = "wav",
        opts: SynthesisOptions = SynthesisOptions(),
        plan: Optional[Plan] = None,
        assembler: Optional[AudioAssembler] = None,
        on_tokens: Optional[Callable[[int], None]] = None,
    ) -> Iterator[bytes]:
        """Encoded audio as it is made. The CLI passes its own ``plan`` (made from ``text``) and
        ``assembler`` to report segments and samples, and ``on_tokens`` (each chunk's tokens)."""
        plan = plan or self.planner.plan(text, opts)
        assembler = assembler or AudioAssembler(self.vocoder, fmt)
        streams = self.engine.submit_all(plan.segments)
        for seg, chunk in ordered_chunks(streams):
            data = self._vocode.call(assembler.feed, seg, chunk.hidden, chunk.final)
            if on_tokens is not None:
                on_tokens(chunk.hidden.shape[0])
            if data:
                yield data
        tail = self._vocode.call(assembler.close)
        if tail:
            yield tail

    async def astream(
        self, text: str, fmt: str = "wav", opts: SynthesisOptions = SynthesisOptions()
    ) -> AsyncIterator[bytes]:
        plan = self.planner.plan(text, opts)
        assembler = AudioAssembler(self.vocoder, fmt)
        loop = asyncio.get_running_loop()
        streams = self.engine.submit_all(plan.segments, loop=loop)
        async for seg, chunk in aordered_chunks(streams):
            data = await self._vocode.acall(assembler.feed, seg, chunk.hidden, chunk.final)
            if data:
                yield data
        tail = await self._vocode.acall(assembler.close)
        if tail:
            yield tail

    def synthesize(self, text: str, fmt: str = "wav", opts: SynthesisOptions = SynthesisOptions()) -> bytes:
        return with_true_length(b"".join(self.stream(text, fmt, opts)))
