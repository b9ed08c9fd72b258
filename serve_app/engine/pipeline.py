"""The synthesis pipeline as plain Python: plan segments, decode, vocode, encode.

``Planner`` (``planner.py``: text front end + voices + pacing, no torch) turns one request into
segment requests; ``AudioAssembler`` turns a request's ordered hidden-state chunks into encoded
bytes; ``aordered_chunks`` reads a request's rows from an ``AcousticEngine`` segment by segment.
The Ray Serve deployments use these pieces, one per stage; ``serve_app/pipeline/local.py``'s
``LocalPipeline`` wires them together in one process (CLI, tests, tools).
"""

from __future__ import annotations

import logging
import time
from typing import AsyncIterator, Optional

import numpy as np
import torch

from .audio import SAMPLE_RATE, AudioEncoder, new_encoder
from .config import VocoderConfig
from .decode.streams import HiddenChunk, RowStream
from .errors import EmptyInputError  # noqa: F401  (re-exported: callers catch it with the planner)
from .planner import Planner, segment_seed  # noqa: F401  (re-exported)
from .types import Plan, SegmentMark, SynthesisOptions  # noqa: F401  (re-exported)
from .vocoder import Vocoder, VocoderStream

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


async def aordered_chunks(streams: list[RowStream]) -> AsyncIterator[tuple[int, HiddenChunk]]:
    try:
        for i, stream in enumerate(streams):
            async for chunk in stream:
                yield i, chunk
    finally:
        for stream in streams:
            stream.cancel()
