"""One stream's audio, assembled once for every door: ordered hidden-state chunks of a plan's
segments in, encoded bytes, segment marks and a summary out.

``AudioAssembler`` turns a request's ordered hidden-state chunks into encoded bytes (one
sliding-window vocoder stream per segment, one encoder for the response, the plan's silences,
gain and loudness). ``AudioLoop`` drives it for one stream: every torch call on the stage's torch
thread, bytes merged into messages of at least ``MIN_YIELD_BYTES`` (the first at once), a
``SegmentMark`` right after the bytes that complete its segment, and a ``StreamSummary`` at the
end. The Vocoder deployment runs it over the Acoustic stage's chunks, ``LocalPipeline`` over an
in-process engine's: the same loop, so the same tokens give the same bytes through every door.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

import numpy as np
import torch

from .audio import SAMPLE_RATE, AudioEncoder, new_encoder
from .config import VocoderConfig
from .types import Plan, SegmentMark, StreamSummary
from .vocoder import VocoderEngine, VocoderStream

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
        vocoder: VocoderEngine,
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


# After the first bytes (sent at once: time to first audio), bytes are merged up to this size
# before they leave: fewer, larger messages between processes.
MIN_YIELD_BYTES = 2048

AudioItem = Union[bytes, SegmentMark, StreamSummary]
# A segment's chunk of hidden states: (segment index, (n, hidden) states, its last chunk).
HiddenItem = tuple[int, Any, bool]
# Runs a torch call on the stage's torch thread: ``await run(fn, *args)``.
RunOnThread = Callable[..., Awaitable[Any]]


def as_wire(hidden: Any) -> torch.Tensor:
    """Hidden states as the vocoder gets them: through float16, as they cross between stages
    (``WireChunk``), so a stream vocoded in the process that decoded it sounds the same."""
    return torch.as_tensor(hidden).to(torch.float16).to(torch.float32)


class AudioLoop:
    """One stream: ``items(chunks)`` yields its audio. ``run``: the torch thread's call.
    ``batch_rows`` and ``first_audio`` go into the summary (the caller sets them as chunks
    arrive); ``first_window`` is what the first bytes cost (seconds: the feeds until then, and of
    them the vocoder's and the encoder's), set when they leave."""

    def __init__(
        self,
        vocoder: VocoderEngine,
        plan: Plan,
        response_format: str,
        cfg: Optional[VocoderConfig],
        run: RunOnThread,
        min_yield_bytes: int = MIN_YIELD_BYTES,
    ):
        self.plan = plan
        self.run = run
        self.min_yield_bytes = min_yield_bytes
        self.assembler = AudioAssembler(
            vocoder,
            response_format,
            cfg,
            pauses=plan.pauses,
            gain_db=plan.gain_db,
            lead_in=plan.lead_in,
            loudness=plan.loudness,
        )
        self.batch_rows = 0
        self.first_audio: dict = {}
        self.first_window: Optional[dict[str, float]] = None
        self.feed_seconds = 0.0
        self.yielded_samples = 0  # the audio in the bytes yielded so far (what a listener's clock counts)

    async def items(self, chunks: AsyncIterator[HiddenItem]) -> AsyncIterator[AudioItem]:
        asm = self.assembler
        pending = b""
        async for segment, hidden, final in chunks:
            t0 = time.perf_counter()
            pending += await self.run(asm.feed, segment, as_wire(hidden), final)
            self.feed_seconds += time.perf_counter() - t0
            marks = asm.take_marks()
            if pending and (marks or self.first_window is None or len(pending) >= self.min_yield_bytes):
                if self.first_window is None:
                    self.first_window = {
                        "feed": self.feed_seconds,
                        "vocode": asm.vocode_seconds,
                        "encode": asm.encode_seconds,
                    }
                self.yielded_samples = asm.samples
                yield pending
                pending = b""
            for mark in marks:  # after the bytes that complete its segment
                yield mark
        pending += await self.run(asm.close)
        if pending:
            self.yielded_samples = asm.samples
            yield pending
        for mark in asm.take_marks():
            yield mark
        yield self.summary()

    def summary(self) -> StreamSummary:
        asm = self.assembler
        return StreamSummary(
            asm.samples / SAMPLE_RATE,
            len(self.plan.segments),
            self.batch_rows,
            asm.vocode_seconds,
            asm.encode_seconds,
            first_audio=self.first_audio or None,
        )
