"""Loudness of whole answers (EBU R128 / ITU-R BS.1770): measure, and normalise to a target.

For a complete, non-streamed float PCM buffer only: integrated loudness needs the whole signal.
Everything runs through ffmpeg's filters in-process (PyAV filter graphs, imported lazily so
this module's constants stay light):

- ``measure_loudness``: the ``ebur128`` filter (K-weighted, gated integrated loudness, loudness
  range, true peak from an oversampled signal).
- ``normalize_loudness``: one linear gain from that measurement. Where the gain would take the
  true peak over the ceiling, the gained signal goes through ffmpeg's ``alimiter`` (5 ms
  lookahead, delay compensated) at 4x the rate so that it limits inter-sample peaks too, is
  measured again, and the gain is corrected for what limiting took off (at most
  ``_LIMIT_PASSES`` times, adding at most ``_MAX_LIMITING_DB``: past that the answer stays
  quieter than asked rather than squashed). A last linear trim keeps the true peak at or
  under the ceiling whatever the limiter left.

Why not ffmpeg's ``loudnorm``: its linear mode is this same gain, refused when the loudness
range is over its target or measured as 0 (short clips); otherwise it rides the gain over 3 s
windows at 192 kHz. Two-pass, on the noise bursts of the tests at a -16 LUFS target with a
-1.5 dBTP ceiling, it ended at -17.4..-17.7 LUFS and -1.47 dBTP; this module at -16.0..-16.1
LUFS and -1.74 dBTP (both read by ``ebur128``), in 1-1.7x loudnorm's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .audio import SAMPLE_RATE

# Accepted targets (a documented, conservative subset of what the filters take).
LOUDNESS_RANGE_LUFS = (-40.0, -5.0)
TRUE_PEAK_RANGE_DBTP = (-9.0, 0.0)
DEFAULT_TARGET_LUFS = -16.0  # streamed speech (AES TD1004 asks -16..-20), podcasts
DEFAULT_TRUE_PEAK_DBTP = -1.5  # headroom for the lossy encoders' overshoot
GATE_LUFS = -70.0  # BS.1770's absolute gate: quieter audio has no integrated loudness
BLOCK_SECONDS = 0.4  # one gating block

_OVERSAMPLE = 4
_LIMITER_MARGIN_DB = 0.3  # the limiter aims this far under the ceiling; the trim does the rest
_LIMIT_PASSES = 4
_MAX_LIMITING_DB = 6.0  # gain the passes may add beyond the first, linear one
_TOLERANCE_LU = 0.1
_FRAME_SECONDS = 1.0  # frames pushed into a graph


@dataclass(frozen=True)
class Loudness:
    """A measurement. ``integrated`` (LUFS) is -inf when no gating block is above -70 LUFS
    (silence); ``true_peak`` (dBTP) is -inf for digital silence; ``lra`` in LU."""

    integrated: float
    true_peak: float
    lra: float


def _mono_float(pcm: np.ndarray) -> np.ndarray:
    a = np.asarray(pcm)
    if a.ndim == 2 and 1 in a.shape:
        a = a.reshape(-1)
    if a.ndim != 1:
        raise ValueError(f"expected mono 1-D PCM, got shape {a.shape}")
    if a.dtype == np.int16:
        a = a.astype(np.float32) / 32767.0
    a = a.astype(np.float32)  # a copy: never the caller's buffer
    a[~np.isfinite(a)] = 0.0  # as to_int16 treats NaN: silence
    return a


def _run_graph(pcm: np.ndarray, rate: int, filters: list[tuple[str, str]]) -> tuple[np.ndarray, dict[str, str]]:
    """``pcm`` (float32 mono at ``rate``) through ``filters``, each ``(name, args)``; returns the
    output samples (float32 mono) and the metadata of the last output frame that had any (the
    frames a filter flushes at the end may carry none: ebur128's last one, for some lengths)."""
    import av
    import av.filter

    graph = av.filter.Graph()
    src = graph.add_abuffer(format="flt", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))
    nodes = [src] + [graph.add(name, args) for name, args in filters]
    nodes.append(graph.add("aformat", "sample_fmts=flt:channel_layouts=mono"))
    nodes.append(graph.add("abuffersink"))
    for a, b in zip(nodes, nodes[1:]):
        a.link_to(b)
    graph.configure()
    sink = nodes[-1]
    out: list[np.ndarray] = []
    meta: dict[str, str] = {}

    def drain() -> None:
        nonlocal meta
        while True:
            try:
                frame = sink.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                return
            out.append(frame.to_ndarray().reshape(-1))
            meta = dict(frame.metadata) or meta

    step = max(1, int(rate * _FRAME_SECONDS))
    for start in range(0, len(pcm), step):
        chunk = np.ascontiguousarray(pcm[start : start + step])
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        frame.time_base = Fraction(1, rate)
        frame.pts = start
        src.push(frame)
        drain()
    src.push(None)
    drain()
    return (np.concatenate(out).astype(np.float32, copy=False) if out else np.zeros(0, np.float32)), meta


def _db(x: float) -> float:
    return 20.0 * math.log10(x) if x > 0 else -math.inf


def measure_loudness(pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> Loudness:
    """Integrated loudness, true peak and loudness range of a whole mono clip (ffmpeg's
    ``ebur128``; mono counts as one channel, as BS.1770 has it).

    A clip shorter than one gating block (0.4 s) has no integrated loudness of its own: it is
    measured as that one block, zero-padded to 0.4 s, with the padding's share taken back out
    (+10*log10(0.4 s / its length)), i.e. the K-weighted power of the clip itself.
    """
    return _measure(_mono_float(pcm), sample_rate, peak=True)


def _measure(x: np.ndarray, sample_rate: int, peak: bool) -> Loudness:
    """measure_loudness of float32 ``x``; without ``peak``, ``true_peak`` is -inf (the
    oversampled peak meter is a fifth of ebur128's time)."""
    block = int(round(BLOCK_SECONDS * sample_rate))
    short = 0 < len(x) < block
    padded = np.concatenate([x, np.zeros(block - len(x), np.float32)]) if short else x
    if not len(padded):
        return Loudness(-math.inf, -math.inf, 0.0)
    _, meta = _run_graph(padded, sample_rate, [("ebur128", "metadata=1" + (":peak=true" if peak else ""))])
    integrated = float(meta.get("lavfi.r128.I", GATE_LUFS))
    if integrated <= GATE_LUFS:
        integrated = -math.inf
    elif short:
        integrated += 10.0 * math.log10(block / len(x))
    return Loudness(
        integrated, _db(float(meta.get("lavfi.r128.true_peak", 0.0))), float(meta.get("lavfi.r128.LRA", 0.0))
    )


def _check(name: str, value: float, bounds: tuple[float, float], unit: str) -> float:
    value = float(value)
    if not bounds[0] <= value <= bounds[1]:  # NaN fails too
        raise ValueError(f"{name} must be within {bounds[0]:g}..{bounds[1]:g} {unit}, got {value}")
    return value


def _limit(pcm: np.ndarray, rate: int, ceiling_db: float) -> np.ndarray:
    """ffmpeg's lookahead limiter at _OVERSAMPLE x ``rate`` (so it sees inter-sample peaks),
    back at ``rate``: same length, no delay (``latency=1`` compensates the lookahead)."""
    up = rate * _OVERSAMPLE
    limit = 10.0 ** (ceiling_db / 20.0)
    y, _ = _run_graph(
        pcm,
        rate,
        [
            ("aresample", str(up)),
            # level=0: no make-up gain of its own; asc off: plain release.
            ("alimiter", f"limit={limit:.6f}:attack=5:release=50:level=0:latency=1"),
            ("aresample", str(rate)),
        ],
    )
    return _fit(y, len(pcm))


def _fit(y: np.ndarray, n: int) -> np.ndarray:
    """Exactly ``n`` samples: the resamplers may round the length by a sample."""
    if len(y) >= n:
        return y[:n]
    return np.concatenate([y, np.zeros(n - len(y), np.float32)])


def normalize_loudness(
    pcm: np.ndarray,
    target_lufs: float = DEFAULT_TARGET_LUFS,
    true_peak_dbtp: float = DEFAULT_TRUE_PEAK_DBTP,
    sample_rate: int = SAMPLE_RATE,
) -> np.ndarray:
    """A whole mono clip at ``target_lufs`` integrated loudness (LOUDNESS_RANGE_LUFS), its true
    peak at most ``true_peak_dbtp`` (TRUE_PEAK_RANGE_DBTP).

    Returns float32 PCM at the same rate and of exactly the same length. A linear gain when
    the peak allows it; otherwise peaks are limited (see the module's docstring), which keeps
    the target within ~0.1 LU unless limiting has to take off more than the passes can make
    up (the result is then quieter than the target, never over the peak ceiling).

    Silence (nothing above -70 LUFS) and empty input come back unchanged. A clip under 0.4 s
    is normalised by its own power (``measure_loudness``).
    """
    target_lufs = _check("target loudness", target_lufs, LOUDNESS_RANGE_LUFS, "LUFS")
    ceiling = _check("true peak ceiling", true_peak_dbtp, TRUE_PEAK_RANGE_DBTP, "dBTP")
    x = _mono_float(pcm)
    m = _measure(x, sample_rate, peak=True)
    if not math.isfinite(m.integrated):
        return x
    gain_db = target_lufs - m.integrated
    if m.true_peak + gain_db <= ceiling:
        return x * np.float32(10.0 ** (gain_db / 20.0))
    first, last = gain_db, None
    for _ in range(_LIMIT_PASSES):
        y = _limit(x * np.float32(10.0 ** (gain_db / 20.0)), sample_rate, ceiling - _LIMITER_MARGIN_DB)
        got = _measure(y, sample_rate, peak=False)
        miss = target_lufs - got.integrated
        if abs(miss) <= _TOLERANCE_LU or not math.isfinite(miss):
            break
        # Limiting takes back part of each added dB (about half on dense noise bursts): step
        # by the slope the last two passes measured (secant), 1 for the first.
        slope = 1.0 if last is None else (got.integrated - last[1]) / (gain_db - last[0])
        last = (gain_db, got.integrated)
        step = miss / min(max(slope, 0.2), 1.0)
        gain_db = min(gain_db + step, first + _MAX_LIMITING_DB)
        if gain_db == last[0]:
            break  # at the cap: quieter than the target rather than squashed further
    peak = _measure(y, sample_rate, peak=True).true_peak
    if peak > ceiling:
        y = y * np.float32(10.0 ** ((ceiling - peak) / 20.0))
    return y
