"""Streaming audio encoders: float32 PCM chunks in, encoded bytes out.

One encoder per response stream. ``write()`` returns whatever bytes the encoder
has produced so far (possibly ``b""``); ``close()`` flushes the rest. Compressed
formats use a single in-process PyAV (ffmpeg) muxer per stream writing into a
memory sink, so bytes leave as soon as the codec emits a packet. The telephony
formats (``ulaw``, ``alaw``) are raw G.711 at 8 kHz, resampled in the encoder.

An encoder can apply a volume gain (``gain_db``) to each chunk before it clips
to 16 bits. Loudness normalisation of a whole answer is in ``loudness.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Iterator, Literal, Optional, get_args

import numpy as np

from .wav import wav_header

SAMPLE_RATE = 24000  # ChatTTS output rate; mono throughout

TELEPHONY_RATE = 8000  # G.711's rate

# Raw G.711 at 8 kHz, as telephony media streams carry it (Twilio's media streams, ElevenLabs'
# ulaw_8000): the one output whose rate is not SAMPLE_RATE (format_sample_rate).
TelephonyFormat = Literal["ulaw", "alaw"]
TELEPHONY_FORMATS: tuple[str, ...] = get_args(TelephonyFormat)
# The formats the API serves (``protocol.ResponseFormat`` is this type); new_encoder() makes each.
AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm", TelephonyFormat]
AUDIO_FORMATS: tuple[str, ...] = get_args(AudioFormat)

CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Ogg Opus, as OpenAI's "opus"
    "aac": "audio/aac",  # ADTS
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",  # raw s16le, mono, SAMPLE_RATE
    # RFC 2046's audio/basic is exactly this: 8-bit G.711 mu-law, 8 kHz, mono, no header.
    "ulaw": "audio/basic",
    # No registered type names headerless A-law bytes (audio/PCMA, RFC 4856, is defined for
    # RTP payloads); audio/x-alaw-basic, A-law's audio/basic, is the name in common use.
    "alaw": "audio/x-alaw-basic",
}

# Raw PCM at the other rates voice-agent frameworks ask for, by ElevenLabs' output_format names
# (pcm_16000, ...): s16le mono resampled from SAMPLE_RATE in the encoder, as G.711 is. The doors
# that take a rate use them (the ElevenLabs door's pcm_<rate>, its pcm_24000 being "pcm"); they
# are not among the API's AUDIO_FORMATS (response_format), and new_encoder() makes each.
PCM_RATES: tuple[int, ...] = (8000, 16000, 22050, 32000, 44100, 48000)
RATE_FORMATS: dict[str, int] = {f"pcm_{rate}": rate for rate in PCM_RATES}
ENCODER_FORMATS: tuple[str, ...] = AUDIO_FORMATS + tuple(RATE_FORMATS)


def pcm_format(rate: int) -> str:
    """The encoder format of raw s16le PCM at ``rate`` ("pcm" at SAMPLE_RATE)."""
    if rate == SAMPLE_RATE:
        return "pcm"
    fmt = f"pcm_{rate}"
    if fmt not in RATE_FORMATS:
        raise ValueError(f"no pcm at {rate} Hz; rates: {', '.join(map(str, (SAMPLE_RATE, *PCM_RATES)))}")
    return fmt


def content_type(fmt: str) -> str:
    """The Content-Type of ``fmt``'s bytes (every pcm rate is audio/pcm)."""
    return CONTENT_TYPES["pcm"] if fmt in RATE_FORMATS else CONTENT_TYPES[fmt]


# Volume gain accepted by apply_gain() and the encoders, in dB.
GAIN_DB_RANGE = (-30.0, 20.0)


def format_sample_rate(fmt: str) -> int:
    """Samples per second of the audio ``fmt``'s bytes carry (8000 for ulaw/alaw, else SAMPLE_RATE).

    Opus streams are encoded from 24 kHz, but their decoders always output 48 kHz and their
    Ogg granule positions count 48 kHz samples.
    """
    if fmt in TELEPHONY_FORMATS:
        return TELEPHONY_RATE
    if fmt in RATE_FORMATS:
        return RATE_FORMATS[fmt]
    if fmt in AUDIO_FORMATS:
        return SAMPLE_RATE
    raise ValueError(_unknown(fmt))


def format_bytes_per_second(fmt: str) -> int | None:
    """Bytes per second of audio for the constant-rate raw formats (pcm and wav's body: 48000,
    ulaw/alaw: 8000, one byte a sample); None for the compressed ones (a stream's listener clock
    then counts its audio when a segment's summary says it)."""
    if fmt in TELEPHONY_FORMATS:
        return TELEPHONY_RATE
    if fmt in ("pcm", "wav"):
        return 2 * SAMPLE_RATE
    if fmt in RATE_FORMATS:
        return 2 * RATE_FORMATS[fmt]
    if fmt in AUDIO_FORMATS:
        return None
    raise ValueError(_unknown(fmt))


def nominal_bytes_per_second(fmt: str) -> float | None:
    """About how many bytes a second of ``fmt``'s audio takes: exact for the raw formats, the
    codec's nominal bit rate for the constant-rate ones (mp3, aac; Opus' target), None for FLAC.
    For estimates only (where in the audio a message's bytes lie: the ElevenLabs door's alignment)."""
    exact = format_bytes_per_second(fmt)
    if exact is not None:
        return float(exact)
    rate = _CODECS[fmt].bit_rate
    return rate / 8 if rate else None


def _unknown(fmt: str) -> str:
    return f"unknown audio format {fmt!r}; expected one of {', '.join(AUDIO_FORMATS)} (or pcm_<rate>)"


def check_gain_db(db: float) -> float:
    """``db`` as a float if it is within GAIN_DB_RANGE, else ValueError."""
    lo, hi = GAIN_DB_RANGE
    db = float(db)
    if not lo <= db <= hi:  # NaN fails too
        raise ValueError(f"gain must be within {lo:g}..{hi:g} dB, got {db}")
    return db


def apply_gain(pcm: np.ndarray, db: float) -> np.ndarray:
    """Float PCM scaled by ``db`` decibels (GAIN_DB_RANGE): amplitude x 10^(db/20).

    Stateless, so chunks of a stream can go through one by one. Nothing is clipped here:
    samples past full scale are clipped where they become 16-bit (``to_int16``), as all
    the encoders do. int16 input is read as ``to_int16`` writes it (x / 32767). 0 dB
    returns the input as it is.
    """
    db = check_gain_db(db)
    a = np.asarray(pcm)
    if db == 0.0:
        return a
    if a.dtype == np.int16:
        a = a.astype(np.float32) / 32767.0
    return (a.astype(np.float32, copy=False) * np.float32(10.0 ** (db / 20.0))).astype(np.float32, copy=False)


def to_int16(pcm: np.ndarray) -> np.ndarray:
    """Mono float PCM in [-1, 1] -> int16 (clipped, scaled by 32767, rounded).

    int16 input passes through unchanged; NaN becomes silence.
    """
    a = np.asarray(pcm)
    if a.ndim != 1:
        if a.ndim == 2 and 1 in a.shape:
            a = a.reshape(-1)
        else:
            raise ValueError(f"expected mono 1-D PCM, got shape {a.shape}")
    if a.dtype == np.int16:
        return a
    a = np.nan_to_num(a.astype(np.float32, copy=False), nan=0.0)
    return np.rint(np.clip(a, -1.0, 1.0) * 32767.0).astype(np.int16)


class AudioEncoder(ABC):
    """Incremental encoder for one stream. Not thread-safe."""

    format: str
    content_type: str

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> None:
        self.format = fmt
        self.content_type = content_type(fmt)
        self.sample_rate = sample_rate  # of the PCM written in
        self.output_rate = sample_rate  # of the encoded audio (G.711: 8000)
        self.gain_db = check_gain_db(gain_db)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, pcm: np.ndarray) -> bytes:
        """Encode a chunk; returns the bytes that are ready (possibly b"")."""
        if self._closed:
            raise ValueError(f"write() on a closed {self.format} encoder")
        if self.gain_db:
            pcm = apply_gain(pcm, self.gain_db)
        return self._write(to_int16(pcm))

    def close(self) -> bytes:
        """Flush and return the final bytes. A second call returns b""."""
        if self._closed:
            return b""
        self._closed = True
        return self._close()

    @abstractmethod
    def _write(self, samples: np.ndarray) -> bytes: ...

    @abstractmethod
    def _close(self) -> bytes: ...

    def __enter__(self) -> AudioEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PcmEncoder(AudioEncoder):
    """Headerless signed 16-bit little-endian samples."""

    def _write(self, samples: np.ndarray) -> bytes:
        return samples.astype("<i2", copy=False).tobytes()

    def _close(self) -> bytes:
        return b""


class WavEncoder(PcmEncoder):
    """PCM behind a RIFF/WAVE header whose sizes are unknown up front (``wav.py``)."""

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> None:
        super().__init__(fmt, sample_rate, gain_db)
        self._header_sent = False

    def _header(self) -> bytes:
        return wav_header(self.sample_rate)

    def _write(self, samples: np.ndarray) -> bytes:
        head = b"" if self._header_sent else self._header()
        self._header_sent = True
        return head + super()._write(samples)

    def _close(self) -> bytes:
        # An empty stream still gets its header, so the result is a valid file.
        return self._write(np.zeros(0, np.int16))


@dataclass(frozen=True)
class _CodecSpec:
    container: str
    codec: str
    bit_rate: int | None
    container_options: dict[str, str] = field(default_factory=dict)


_CODECS: dict[str, _CodecSpec] = {
    # Bare MPEG frames: no ID3 tag; no Xing/LAME header (it must be patched at
    # the end, impossible on a stream; ffmpeg skips it there anyway).
    "mp3": _CodecSpec("mp3", "libmp3lame", 64000, {"id3v2_version": "0", "write_xing": "0"}),
    # libopus takes 24 kHz as is. The Ogg muxer holds one complete page back (to
    # flag EOS), so latency ~ 2 pages: 60 ms pages trade ~4 kbit/s of page
    # overhead for low latency (ffmpeg's default is 1 s pages).
    "opus": _CodecSpec("ogg", "libopus", 32000, {"page_duration": "60000"}),
    "aac": _CodecSpec("adts", "aac", 64000),
    # STREAMINFO keeps total_samples=0 ("unknown") since it cannot be rewritten
    # on a non-seekable stream; decoders then read frames to EOF. Drop the 8 KiB
    # tag-editing padding block, useless on a stream.
    "flac": _CodecSpec("flac", "flac", None, {"metadata_header_padding": "0"}),
}


class _Sink:
    """Write-only, non-seekable memory file: muxers never seek back into bytes
    that have already been handed out."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


class PyAVEncoder(AudioEncoder):
    """mp3 / Ogg Opus / ADTS AAC / FLAC through one PyAV muxer per stream."""

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> None:
        import av  # imported here: the Ingress reads this module's tables without loading ffmpeg

        super().__init__(fmt, sample_rate, gain_db)
        spec = _CODECS[fmt]
        self._sink = _Sink()
        self._frame_type = av.AudioFrame
        self._container = av.open(
            self._sink,
            mode="w",
            format=spec.container,
            # Without flush_packets, packets sit in the 32 KiB AVIO buffer
            # (mp3 emitted nothing for 2 s of input); with it, each muxed packet
            # reaches the sink at once.
            container_options={"flush_packets": "1", **spec.container_options},
        )
        try:
            self._stream = self._container.add_stream(spec.codec, rate=sample_rate, layout="mono")
            ctx = self._stream.codec_context
            if spec.bit_rate:
                ctx.bit_rate = spec.bit_rate
            self._time_base = Fraction(1, sample_rate)
            ctx.time_base = self._time_base
            self._container.start_encoding()  # opens the codec, writes the header
        except Exception:
            self._container.close()
            raise
        # Codecs take fixed-size frames (mp3 576, opus 480, aac 1024, flac 2304
        # at 24 kHz); the tail waits here until more audio or close().
        self._frame_size = ctx.frame_size or 1024
        self._pending = np.zeros(0, np.int16)
        self._pts = 0

    def _encode(self, samples: np.ndarray | None) -> None:
        if samples is None:
            packets = self._stream.encode(None)
        else:
            # PyAV converts s16 to the codec's native format (s32p / flt / fltp).
            frame = self._frame_type.from_ndarray(samples[None, :], format="s16", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.time_base = self._time_base
            frame.pts = self._pts
            self._pts += len(samples)
            packets = self._stream.encode(frame)
        self._container.mux(packets)

    def _write(self, samples: np.ndarray) -> bytes:
        buf = np.concatenate((self._pending, samples)) if len(self._pending) else samples
        n = self._frame_size
        full = len(buf) - len(buf) % n
        for start in range(0, full, n):
            self._encode(buf[start : start + n])
        self._pending = buf[full:].copy()
        return self._sink.take()

    def _close(self) -> bytes:
        try:
            if len(self._pending):
                self._encode(self._pending)  # short last frame
            self._encode(None)  # drain the codec
        finally:
            self._container.close()  # trailer (e.g. final Ogg page with EOS)
        return self._sink.take()


class _Resampler:
    """One libswresample resampler per stream (``av.AudioResampler``: a windowed-sinc low-pass
    below the lower Nyquist frequency) from s16 mono at ``in_rate`` to ``out_rate``. It holds back
    its filter's delay and ``flush()`` returns it, so a stream comes out as round(n * out_rate /
    in_rate) samples (within one for very short ones), the same however the input was cut into
    chunks: each chunk's pts continues the last, so it never pads or drops at a chunk's edge.
    The one resampler of the encoders (G.711 and pcm at other rates)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        import av  # imported here: the Ingress reads this module's tables without loading ffmpeg

        self._frame_type = av.AudioFrame
        self._in_rate = in_rate
        self._time_base = Fraction(1, in_rate)
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)
        self._pts = 0

    def push(self, samples: np.ndarray) -> list:
        """s16 frames at ``out_rate`` made from ``samples`` (int16) so far."""
        if not len(samples):
            return []
        frame = self._frame_type.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = self._in_rate
        frame.time_base = self._time_base
        frame.pts = self._pts
        self._pts += len(samples)
        return self._resampler.resample(frame)

    def flush(self) -> list:
        """The filter's held-back samples."""
        return self._resampler.resample(None)


def _s16_bytes(frames: list) -> bytes:
    return b"".join(f.to_ndarray().astype("<i2", copy=False).tobytes() for f in frames)


class ResampledPcmEncoder(AudioEncoder):
    """Headerless s16le mono at one of ``PCM_RATES`` (``pcm_<rate>``), resampled from the PCM
    written in (``_Resampler``)."""

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> None:
        super().__init__(fmt, sample_rate, gain_db)
        self.output_rate = RATE_FORMATS[fmt]
        self._resampler = _Resampler(sample_rate, self.output_rate)

    def _write(self, samples: np.ndarray) -> bytes:
        return _s16_bytes(self._resampler.push(samples))

    def _close(self) -> bytes:
        return _s16_bytes(self._resampler.flush())


class G711Encoder(AudioEncoder):
    """Raw G.711 (``ulaw``: pcm_mulaw, ``alaw``: pcm_alaw), 8 kHz mono, one byte a sample, no
    container: what telephony media streams carry.

    The PCM goes through the encoders' resampler (``_Resampler``: flat to 3.4 kHz, aliases from
    4.5 kHz up below -60 dB), so a stream decodes to round(n * 8000 / sample_rate) samples
    (within one for very short ones), the same bytes however the input was cut into chunks.
    """

    _CODEC_NAMES = {"ulaw": "pcm_mulaw", "alaw": "pcm_alaw"}

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> None:
        import av  # imported here: the Ingress reads this module's tables without loading ffmpeg

        super().__init__(fmt, sample_rate, gain_db)
        self.output_rate = TELEPHONY_RATE
        self._resampler = _Resampler(sample_rate, TELEPHONY_RATE)
        ctx = av.CodecContext.create(self._CODEC_NAMES[fmt], "w")
        ctx.sample_rate = TELEPHONY_RATE
        ctx.layout = "mono"
        ctx.format = "s16"
        ctx.time_base = Fraction(1, TELEPHONY_RATE)
        ctx.open()
        self._codec = ctx

    def _encode(self, frames: list) -> bytes:
        return b"".join(bytes(p) for f in frames for p in self._codec.encode(f))

    def _write(self, samples: np.ndarray) -> bytes:
        return self._encode(self._resampler.push(samples))

    def _close(self) -> bytes:
        tail = self._encode(self._resampler.flush())  # the filter's held-back samples
        return tail + b"".join(bytes(p) for p in self._codec.encode(None))


def new_encoder(fmt: str, sample_rate: int = SAMPLE_RATE, gain_db: float = 0.0) -> AudioEncoder:
    """A fresh streaming encoder for ``fmt`` (one of ENCODER_FORMATS) of mono PCM at
    ``sample_rate``, each chunk scaled by ``gain_db`` (GAIN_DB_RANGE) before it is clipped."""
    if fmt == "pcm":
        return PcmEncoder(fmt, sample_rate, gain_db)
    if fmt == "wav":
        return WavEncoder(fmt, sample_rate, gain_db)
    if fmt in _CODECS:
        return PyAVEncoder(fmt, sample_rate, gain_db)
    if fmt in TELEPHONY_FORMATS:
        return G711Encoder(fmt, sample_rate, gain_db)
    if fmt in RATE_FORMATS:
        return ResampledPcmEncoder(fmt, sample_rate, gain_db)
    raise ValueError(_unknown(fmt))


def encode_file(
    pieces: Iterable[np.ndarray], fmt: str, samples: Optional[int] = None, gain_db: float = 0.0
) -> Iterator[bytes]:
    """A whole file from PCM pieces in order, through one encoder, its bytes as they are made (one
    piece in memory at a time). A WAV whose length is known (``samples``) has its true sizes in its
    header from the start, so the file is written front to back; otherwise its header says
    "unknown" (``wav.with_true_length`` makes a whole one true)."""
    if fmt == "wav" and samples is not None:
        yield wav_header(SAMPLE_RATE, 2 * samples)
        fmt = "pcm"
    encoder = new_encoder(fmt, gain_db=gain_db)
    for pcm in pieces:
        if len(pcm):
            yield encoder.write(pcm)
    yield encoder.close()
