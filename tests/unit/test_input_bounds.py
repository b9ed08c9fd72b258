"""Hostile speaker strings and clips: each refused with its typed error, in bounded time and memory,
while every real input is taken unchanged. No Ray, no model.

Time and memory are measured in a forked child (``_bounded``): its CPU time (what an input costs
the process, unlike wall time on a shared machine) and its peak RSS growth over its RSS at the
fork, with its address space capped 2 GiB above that (a regression fails the test instead of
taking the machine). The attack inputs are built here, by hand where PyAV would not write them.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import lzma
import os
import resource
import struct
import subprocess
import sys
import time

import av
import numpy as np
import pybase16384 as b14
import pytest
from pydantic import ValidationError
from support.clips import encode, speechlike
from support.hostile import CHATTTS, MiB, ima_adpcm_wav, raw_lzma, speaker_bombs, speaker_vec
from support.speakers import encode_speaker

from serve_app.engine.clips import MAX_PACKETS_PER_SECOND, ClipLimits, decode_clip
from serve_app.engine.errors import InvalidVoiceError, UnknownVoiceError
from serve_app.engine.types import MAX_SPEAKER_CHARS, SynthesisOptions
from serve_app.engine.voices import (
    SPEAKER_BYTES,
    VoiceResolver,
    decode_speaker,
    inflate_exact,
)
from serve_app.protocol import SessionStart, SpeechRequest

MAX_GROWTH_MB = 50  # the brief's bound on what one hostile input may make the process grow
MAX_SECONDS = 0.5  # ... and on its CPU time ("well under a second")


# ------------------------------------------------------------------ measuring in a forked child


def _bounded(fn, *args, cwd: str | None = None) -> dict:
    """``fn(*args)`` in a forked child: {"error": type name or None, "message", "seconds" (CPU),
    "wall_seconds", "growth_mb"}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            if cwd:
                os.chdir(cwd)
            vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # RSS at the fork (KiB)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                fn(*args)
                error, message = None, ""
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                error, message = type(exc).__name__, str(exc)
            seconds, wall = time.process_time() - c0, time.perf_counter() - t0
            growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
            os.write(
                w,
                json.dumps(
                    {
                        "error": error,
                        "message": message[:500],
                        "seconds": seconds,
                        "wall_seconds": wall,
                        "growth_mb": growth,
                    }
                ).encode(),
            )
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    assert out, f"the child died: wait status {status} (signal {signal})"
    return json.loads(out)


def _refused(result: dict, error: str, match: str) -> None:
    assert result["error"] == error, result
    assert match in result["message"], result
    assert result["seconds"] < MAX_SECONDS, result
    assert result["growth_mb"] < MAX_GROWTH_MB, result


# ------------------------------------------------------------------ speaker strings


def _uncompressed_chunks(data: bytes) -> bytes:
    """A raw LZMA2 stream of one-byte uncompressed chunks (4 bytes each): valid, and the
    longest stream for its output that any encoder could be made to write."""
    out = b""
    for i, byte in enumerate(data):
        out += bytes([0x01 if i == 0 else 0x02, 0, 0, byte])  # dictionary reset first, then none
    return out + b"\x00"


def test_the_length_bound_holds_the_longest_speaker_lzma_writes():
    """MAX_SPEAKER_CHARS is derived from the largest stream ``lzma.compress`` makes of a speaker:
    1536 incompressible bytes go out as one uncompressed chunk (1540 bytes, 880 characters)."""
    worst = raw_lzma(os.urandom(SPEAKER_BYTES), CHATTTS)
    assert len(worst) == SPEAKER_BYTES + 4
    longest = len(b14.encode_to_string(worst))
    assert longest == 880 and longest * 1.1 < MAX_SPEAKER_CHARS
    real = [len(encode_speaker(speaker_vec(s, scale))) for s, scale in ((0, 0.01), (1, 1.0), (2, 100.0))]
    assert max(real) < longest


@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 0.01), (2, 50.0), (3, 1e-4)])
def test_real_speaker_strings_are_taken_unchanged(seed, scale):
    vec = speaker_vec(seed, scale)
    s = encode_speaker(vec)
    assert np.array_equal(decode_speaker(s), vec)
    v = VoiceResolver().resolve(s)
    assert v.spk_emb == s and v.seed is None
    # Exactly what ChatTTS's own decoder (unbounded lzma.decompress) gives.
    raw = lzma.decompress(b14.decode_from_string(s), format=lzma.FORMAT_RAW, filters=CHATTTS)
    ref = np.frombuffer(raw, np.float16)
    assert np.array_equal(decode_speaker(s), ref)


def test_a_valid_but_padded_lzma_stream_is_read_exactly():
    """The bound is on the output, not on how the stream is cut: 1536 one-byte chunks decode."""
    vec = speaker_vec(5)
    assert inflate_exact(_uncompressed_chunks(vec.tobytes()), SPEAKER_BYTES) == vec.tobytes()


@pytest.mark.parametrize("name", list(speaker_bombs()))
def test_lzma_bombs_are_refused_in_bounded_time_and_memory(name):
    s = speaker_bombs()[name]
    assert 32 <= len(s) <= MAX_SPEAKER_CHARS, len(s)
    _refused(_bounded(VoiceResolver().resolve, s), "InvalidVoiceError", "speaker string")


def test_the_issues_16_mib_string_and_longer_ones_are_refused_before_decoding():
    issue = b14.encode_to_string(raw_lzma(b"\0" * 16 * MiB))  # the issue's 1,440 characters
    assert len(issue) == 1440
    for s in (issue, issue * 100, "一" * (8 * MiB)):
        _refused(_bounded(VoiceResolver().resolve, s), "InvalidVoiceError", f"at most {MAX_SPEAKER_CHARS}")
    # The decompression bound holds on its own, whatever reaches it.
    res = _bounded(inflate_exact, b14.decode_from_string(issue), SPEAKER_BYTES)
    _refused(res, "ValueError", f"more than {SPEAKER_BYTES} bytes")


@functools.lru_cache(maxsize=None)
def _truncations() -> list[str]:
    s = encode_speaker(speaker_vec(9))
    return [s[:n] for n in (32, 100, len(s) // 2, len(s) - 2, len(s) - 1)]


@pytest.mark.parametrize(
    "value",
    [
        *_truncations(),
        "hello, this is plain ASCII text and no base16384 at all",
        "😀" * 200,
        "\ud800" * 40,  # a lone surrogate: not encodable
        "㴁" * 200,  # base16384's length markers only
        "\x00" * 64,
        "".join(chr(0x4E00 + (i * 7919) % 0x4000) for i in range(840)),  # base16384 characters, random bytes
    ],
)
def test_garbage_and_truncated_speaker_strings_are_invalid_voices(value):
    with pytest.raises(InvalidVoiceError, match="speaker string") as err:
        VoiceResolver().resolve(value)
    assert isinstance(err.value, ValueError)  # a 400 (errors._ERRORS), never a 500
    assert len(str(err.value)) < 300


def test_a_speaker_of_non_finite_values_is_refused():
    vec = speaker_vec(1)
    vec[3] = np.nan
    with pytest.raises(InvalidVoiceError, match="non-finite"):
        VoiceResolver().resolve(encode_speaker(vec))


def test_every_schema_bounds_the_voice_string():
    ok = "x" * MAX_SPEAKER_CHARS
    long = ok + "x"
    assert SynthesisOptions(voice=ok).voice == ok
    for make in (
        lambda v: SynthesisOptions(voice=v),
        lambda v: SpeechRequest(input="hi", voice=v),
        lambda v: SessionStart(type="session.start", voice=v),
        lambda v: SpeechRequest(input="hi", voice={"id": v[:65]}),
    ):
        with pytest.raises(ValidationError):
            make(long)


def _json_request(body: dict):
    from starlette.requests import Request

    raw = json.dumps(body).encode()

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/audio/voices",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    return Request(scope, receive)


def test_the_voices_api_bounds_its_speaker_field_and_takes_no_clip_codes():
    """``speaker`` is refused over the bound before decoding; a bomb under it is a 400; no field
    lets a user hand in a clip's codes (``sample``/``spk_smp``): only the Vocoder's encoder
    writes them."""
    from serve_app.errors import APIError
    from serve_app.http.voices import CREATE_VOICE_OPENAPI, VoicesAPI
    from serve_app.settings import VoiceStoreConfig

    api = VoicesAPI(VoiceStoreConfig(backend="memory"), encoder=None)
    schema = CREATE_VOICE_OPENAPI["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["speaker"]["maxLength"] == MAX_SPEAKER_CHARS

    from serve_app.http.security import Caller

    caller = Caller(id="k", owner="k", max_priority=0, max_streams=0, max_voices=None)

    async def create(body):
        return await api.create(_json_request(body), caller)

    t0 = time.perf_counter()
    with pytest.raises(APIError) as err:  # a JSON body past 16 KiB is refused while it is read
        asyncio.run(create({"name": "a", "speaker": "一" * 200_000}))
    assert time.perf_counter() - t0 < MAX_SECONDS
    assert (err.value.status, err.value.code) == (413, "body_too_large")
    with pytest.raises(APIError) as err:  # under that, a speaker past its bound is refused undecoded
        asyncio.run(create({"name": "a", "speaker": "一" * (MAX_SPEAKER_CHARS + 1)}))
    assert (err.value.status, err.value.code) == (400, "invalid_speaker") and "at most" in err.value.message
    with pytest.raises(APIError) as err:
        asyncio.run(create({"name": "a", "speaker": speaker_bombs()["zeros 11 MiB"]}))
    assert (err.value.status, err.value.code) == (400, "invalid_speaker")
    for field in ("sample", "spk_smp"):
        with pytest.raises(APIError) as err:
            asyncio.run(create({"name": "a", field: "x" * 100}))
        assert err.value.status == 400 and field in err.value.message
    good = encode_speaker(speaker_vec(3))
    assert asyncio.run(create({"name": "a", "speaker": good}))["kind"] == "speaker"


def test_resolving_on_the_event_loop_costs_microseconds():
    """``VoiceCatalog.resolve`` runs this on the Ingress's event loop (before: a 1,002-character
    bomb cost 60-260 ms and ~33 MB there)."""
    resolver = VoiceResolver()
    good = encode_speaker(speaker_vec(4))
    bomb = speaker_bombs()["zeros 11 MiB"]
    resolver.resolve(good)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        resolver.resolve(good)
    per_good = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        with pytest.raises(InvalidVoiceError):
            resolver.resolve(bomb)
    per_bomb = (time.perf_counter() - t0) / n
    assert per_good < 2e-3 and per_bomb < 2e-3, (per_good, per_bomb)


# ------------------------------------------------------------------ clips: hand-made hostile files


def pcm_wav(rate: int, channels: int, samples: int, data_size: int | None = None, value: int = 3000) -> bytes:
    """16-bit PCM WAV with any rate and channel count (a square wave, not silence); ``data_size``
    overrides the declared length (0xFFFFFFFF: a streamed WAV's 'unknown')."""
    block = 2 * channels
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, 16)
    data = np.repeat(np.where(np.arange(samples) % 2, value, -value).astype("<i2"), channels).tobytes()
    size = len(data) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body) if data_size is None else 0xFFFFFFFF) + body


def _crc(data: bytes, poly: int, bits: int) -> int:
    crc, top, mask = 0, 1 << (bits - 1), (1 << bits) - 1
    for byte in data:
        crc ^= byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
    return crc


def _utf8_number(n: int) -> bytes:
    return chr(n).encode("utf-8", "surrogatepass")


def constant_flac(
    rate: int,
    frames: int,
    block: int = 65535,
    channels: int = 1,
    frame_rate: int | None = None,
    first: int = 0,
    value: int = 3000,
) -> bytes:
    """FLAC frames of ``block`` samples, each channel a CONSTANT subframe (a few bytes a frame).
    STREAMINFO says ``rate``; each frame header says ``frame_rate`` (16-bit Hz) if given, else
    'as STREAMINFO'. ``first``: the first frame's number (to append frames to another file)."""
    out = b""
    if first == 0:
        bits = (rate << 44) | ((channels - 1) << 41) | (15 << 36) | (block * frames)  # 20 + 3 + 5 + 36 bits
        info = struct.pack(">HH", block, block) + b"\0" * 6 + bits.to_bytes(8, "big") + b"\0" * 16
        out = b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info
    for i in range(first, first + frames):
        rate_code = 0b1101 if frame_rate else 0b0000
        hdr = bytes([0xFF, 0xF8, (0b0111 << 4) | rate_code, ((channels - 1) << 4) | (0b100 << 1)]) + _utf8_number(i)
        hdr += struct.pack(">H", block - 1) + (struct.pack(">H", frame_rate) if frame_rate else b"")
        body = hdr + bytes([_crc(hdr, 0x07, 8)]) + (b"\x00" + struct.pack(">h", value)) * channels
        out += body + struct.pack(">H", _crc(body, 0x8005, 16))
    return out


def tiny_packets(packets: int, rate: int = 8000) -> bytes:
    """Matroska PCM cut into one-sample packets (8 bytes each in the file)."""
    buf = io.BytesIO()
    x = np.where(np.arange(packets) % 2, 3000, -3000).astype(np.int16)
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=rate, layout="mono")
        for i in range(packets):
            frame = av.AudioFrame.from_ndarray(x[None, i : i + 1], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, i
            for p in stream.encode(frame):
                out.mux(p)
        for p in stream.encode(None):
            out.mux(p)
    return buf.getvalue()


def many_streams(n: int, seconds: float = 3.0) -> bytes:
    """Matroska with ``n`` PCM streams: the first a speech-like clip, the rest 10 ms each."""
    buf = io.BytesIO()
    clip = (speechlike(seconds, 8000) * 32767).astype(np.int16)
    with av.open(buf, "w", format="matroska") as out:
        streams = [out.add_stream("pcm_s16le", rate=8000, layout="mono") for _ in range(n)]
        for k, stream in enumerate(streams):
            pcm = clip if k == 0 else clip[:80]
            for start in range(0, len(pcm), 4000):
                frame = av.AudioFrame.from_ndarray(pcm[None, start : start + 4000], format="s16", layout="mono")
                frame.sample_rate, frame.pts = 8000, start
                for p in stream.encode(frame):
                    out.mux(p)
            for p in stream.encode(None):
                out.mux(p)
    return buf.getvalue()


def webm_opus(pcm: np.ndarray, frame_ms: float = 20) -> bytes:
    """What a browser's MediaRecorder sends: WebM with Opus at 48 kHz (20 ms frames; Opus's
    shortest are 2.5 ms)."""
    pcm48 = np.interp(np.arange(len(pcm) * 2) / 2, np.arange(len(pcm)), pcm).astype(np.float32)
    step = int(48 * frame_ms)
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm") as out:
        stream = out.add_stream("libopus", rate=48000, layout="mono", options={"frame_duration": f"{frame_ms:g}"})
        for start in range(0, len(pcm48), step):
            frame = av.AudioFrame.from_ndarray(pcm48[None, start : start + step], format="flt", layout="mono")
            frame.sample_rate, frame.pts = 48000, start
            for p in stream.encode(frame):
                out.mux(p)
        for p in stream.encode(None):
            out.mux(p)
    return buf.getvalue()


def test_the_issues_adpcm_wav_is_refused_before_decoding():
    """8 KB declaring 10 Hz: one 4089-sample frame would be 9.8M samples at 24 kHz (before: ~0.3 s
    and ~260 MB on the Vocoder's torch thread)."""
    data = ima_adpcm_wav(10)
    assert len(data) < 8500
    _refused(_bounded(decode_clip, data), "InvalidClipError", "sampled at 10 Hz")
    assert decode_clip(ima_adpcm_wav(8000, blocks=8)).size > 0  # the same file at a real rate decodes


_LIMITS = ClipLimits(2.0, 30.0)
_SHORT = ClipLimits(2.0, 5.0)  # where a budget scales with the limit: smaller, faster files


@pytest.mark.parametrize(
    "name,make,limits,match",
    [
        ("PCM WAV at 1 Hz", lambda: pcm_wav(1, 1, 2048), _LIMITS, "sampled at 1 Hz"),
        ("PCM WAV at 384 kHz", lambda: pcm_wav(384000, 1, 4096), _LIMITS, "sampled at 384000 Hz"),
        ("PCM WAV of 9 channels", lambda: pcm_wav(8000, 9, 24000), _LIMITS, "9 channels"),
        ("PCM WAV of 64 channels", lambda: pcm_wav(8000, 64, 8000), _LIMITS, "64 channels"),
        ("PCM WAV of 600 channels", lambda: pcm_wav(8000, 600, 100), _LIMITS, "channels"),
        (
            "FLAC at 1 Hz, 65535-sample frames (68 bytes; 6 GB at 24 kHz)",
            lambda: constant_flac(1, 2),
            _LIMITS,
            "sampled at 1 Hz",
        ),
        ("FLAC at 655350 Hz", lambda: constant_flac(655350, 2, block=4096), _LIMITS, "655350 Hz"),
        (
            "FLAC whose frames change to 1 Hz after the header's rate",
            lambda: constant_flac(44100, 3, block=4096) + constant_flac(44100, 4, block=4096, frame_rate=1, first=3),
            _LIMITS,
            "changes to 1 Hz",
        ),
        (
            "FLAC of 8 channels at 96 kHz (a few hundred bytes)",
            lambda: constant_flac(96000, 12, channels=8),
            _SHORT,
            "too much audio data",
        ),
        (
            "one-sample packets",
            lambda: tiny_packets(int(1.5 * MAX_PACKETS_PER_SECOND) + 500),
            ClipLimits(0.5, 1.0),
            "packets",
        ),
        ("a 2-minute FLAC", lambda: constant_flac(44100, 81), _LIMITS, "longer than 30 s"),
        (
            "a streamed WAV of 60 s (no declared length)",
            lambda: pcm_wav(8000, 1, 8000 * 60, data_size=0xFFFFFFFF),
            _LIMITS,
            "longer than 30 s",
        ),
        ("a WAV declaring 1 s but holding 60 s", lambda: pcm_wav(8000, 1, 8000 * 60, data_size=16000), _LIMITS, None),
        (
            "an ffconcat script naming a local file",
            lambda: b"ffconcat version 1.0\nfile 'clip.wav'\n",
            _LIMITS,
            "could not decode",
        ),
        (
            "an HLS playlist",
            lambda: b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:3,\nclip.wav\n#EXT-X-ENDLIST\n",
            _LIMITS,
            "could not decode",
        ),
    ],
)
def test_hostile_clips_are_refused_in_bounded_time_and_memory(name, make, limits, match, tmp_path):
    (tmp_path / "clip.wav").write_bytes(encode(speechlike(3.0), "wav"))  # what a concat script would read
    result = _bounded(decode_clip, make(), limits, cwd=str(tmp_path))
    if match is None:  # a lying header: decoded up to what the header says, never more
        assert result["error"] in (None, "InvalidClipError"), result
        assert result["seconds"] < MAX_SECONDS and result["growth_mb"] < MAX_GROWTH_MB, result
    else:
        _refused(result, "InvalidClipError", match)


def test_a_file_of_many_streams_costs_no_more_than_sixteen():
    """ffmpeg opens at most 16 streams here (its default: 1000, each with a decoder); a file of
    more is read only up to the first packet of a stream past them (here: 0.5 s, too short)."""
    result = _bounded(decode_clip, many_streams(600), _LIMITS)
    assert result["error"] in (None, "InvalidClipError"), result
    assert result["seconds"] < MAX_SECONDS and result["growth_mb"] < MAX_GROWTH_MB, result
    assert decode_clip(many_streams(16)).size == 3 * 24000  # up to 16 streams: read whole


def test_eight_channels_decode_without_crashing_the_process():
    """PyAV's to_ndarray of a planar frame of 8+ channels crashed the process (the Vocoder
    replica and every stream on it); frames are now read interleaved."""
    result = _bounded(decode_clip, pcm_wav(8000, 8, 3 * 8000), _LIMITS)
    assert result["error"] is None, result
    out = decode_clip(pcm_wav(16000, 8, 3 * 16000))
    assert abs(len(out) - 3 * 24000) <= 1 and np.abs(out).max() > 0.05


_LONG_CLIP = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/unit"]
import numpy as np
import test_input_bounds as t
data = t.encode(np.tile(t.speechlike(10.0), 3), "wav", 48000, 2)
print(json.dumps(t._bounded(t.decode_clip, data, t._LIMITS)))
"""


def test_a_long_valid_clip_holds_only_about_its_length_at_24k():
    """A 30 s stereo 48 kHz clip: the process grows by a small multiple of 30.5 s x 24 kHz x 4 B
    (2.9 MB), not of its source size. Measured from a fresh interpreter: forked from this one, the
    growth also depends on what the tests before left in its heap (26 MB once after the whole
    suite, 9.6 MB alone)."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _LONG_CLIP, tests_dir], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] is None, result
    assert result["growth_mb"] < 8 * 30.5 * 24000 * 4 / MiB, result
    assert result["seconds"] < 1.0, result


# ------------------------------------------------------------------ clips: every real format, unchanged


def _reference_decode(data: bytes) -> np.ndarray:
    """The decoding before these bounds (PyAV's decode, planar float at 24 kHz, channels averaged),
    without its checks: what a real clip must still decode to."""
    parts = []
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="fltp", rate=24000)
        for frame in container.decode(container.streams.audio[0]):
            parts += [out.to_ndarray().mean(axis=0) for out in resampler.resample(frame)]
        parts += [out.to_ndarray().mean(axis=0) for out in resampler.resample(None)]
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("kind", ["wav", "mp3", "flac", "ogg", "m4a"])
@pytest.mark.parametrize("rate,channels", [(8000, 1), (24000, 1), (44100, 2), (48000, 2), (96000, 1)])
def test_real_clips_decode_exactly_as_before(kind, rate, channels):
    if kind == "mp3" and rate == 96000:
        pytest.skip("MP3 has no 96 kHz")
    data = encode(speechlike(3.0), kind, rate, channels)
    assert np.array_equal(decode_clip(data), _reference_decode(data))


def test_a_browser_recording_decodes_exactly_as_before():
    data = webm_opus(speechlike(3.0))
    assert np.array_equal(decode_clip(data), _reference_decode(data))


def test_the_shortest_opus_frames_fit_the_packet_budget():
    """2.5 ms Opus frames (400 a second, the finest a real codec cuts) stay under the budget."""
    data = webm_opus(speechlike(4.9), frame_ms=2.5)
    assert np.array_equal(decode_clip(data, _SHORT), _reference_decode(data))


def test_a_clip_with_a_video_stream_decodes_its_audio():
    """A phone video (MP4: H.264 and AAC): the other streams are skipped by the demuxer."""
    buf = io.BytesIO()
    pcm = speechlike(3.0)
    with av.open(buf, "w", format="mp4") as out:
        video = out.add_stream("mpeg4", rate=10)
        video.width, video.height = 64, 48
        audio = out.add_stream("aac", rate=24000, layout="mono")
        for i in range(30):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts = i
            for p in video.encode(frame):
                out.mux(p)
        for start in range(0, len(pcm), 1024):
            frame = av.AudioFrame.from_ndarray(pcm[None, start : start + 1024], format="flt", layout="mono")
            frame.sample_rate, frame.pts = 24000, start
            for p in audio.encode(frame):
                out.mux(p)
        for stream in (video, audio):
            for p in stream.encode(None):
                out.mux(p)
    data = buf.getvalue()
    assert np.array_equal(decode_clip(data), _reference_decode(data))


def test_an_unknown_voice_name_still_is_one():
    """A short string that is no voice is still an unknown voice (no decoding is tried under 32 characters)."""
    with pytest.raises(UnknownVoiceError):
        VoiceResolver().resolve("no-such-voice")
