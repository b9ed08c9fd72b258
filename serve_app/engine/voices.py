"""Voices: OpenAI voice names, ``seed:<n>`` and ChatTTS speaker strings.

Two halves, so the stages that do no tensor work stay free of torch:

- ``VoiceResolver`` (no torch) reads a voice string into a ``Voice``: a seed to sample the
  speaker from, or a ChatTTS speaker string (validated by decoding it with numpy). The
  TextNormalizer, the cache key and the Ingress use it; the Ingress on its event loop, so
  decoding is bounded: at most ``MAX_SPEAKER_CHARS`` characters are read, and the LZMA stream
  is inflated to one byte more than a speaker at most (microseconds, a few KiB, whatever the
  string holds; anything else is an ``InvalidVoiceError``).
- ``SpeakerSampler`` (torch) turns a seed into the speaker string, in the stage that holds
  ChatTTS's speaker statistics (the Acoustic stage, or the in-process ``LocalPipeline``). It
  samples from a private ``torch.Generator`` seeded with the voice's seed, never from torch's
  global RNG, so the same voice gives the same speaker in every process.
"""

from __future__ import annotations

import functools
import lzma
import re
from typing import Any, Optional

import numpy as np

from .errors import InvalidVoiceError, UnknownVoiceError, VoiceError  # noqa: F401  (VoiceError re-exported)
from .types import MAX_SPEAKER_CHARS, Voice

# Fixed seeds for every voice name OpenAI's speech API accepts: stable forever (changing one
# changes a voice). New names are added at the end with a seed no other voice has.
OPENAI_VOICES: dict[str, int] = {
    "alloy": 2222,
    "ash": 1031,
    "ballad": 7869,
    "coral": 4099,
    "echo": 6653,
    "fable": 1518,
    "onyx": 3333,
    "nova": 4444,
    "sage": 9001,
    "shimmer": 5555,
    "verse": 8128,
    "marin": 6271,
    "cedar": 3907,
}
DEFAULT_VOICE = "alloy"
MAX_SEED = 2**31 - 1
SPEAKER_DIM = 768  # ChatTTS's GPT hidden size: a speaker embedding has this many values
SPEAKER_BYTES = SPEAKER_DIM * 2  # float16
SPEAKER_STRING_MIN_CHARS = 32  # a real encoded speaker is several hundred characters
# MAX_SPEAKER_CHARS (engine/types.py, every schema's bound on a voice string) is re-exported here.
_SEED_RE = re.compile(r"seed:([0-9]{1,10})")  # fullmatch; [0-9]: \d takes other scripts' digits
# ChatTTS's own serialisation of a speaker: base16384 of a raw-LZMA2 stream of float16 values.
# How ChatTTS compresses a speaker string's float16 values (Speaker._encode; the tests encode with it).
SPEAKER_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def inflate_exact(data: bytes, size: int, what: str = "data") -> bytes:
    """One raw LZMA2 stream (ChatTTS's filter) that decodes to exactly ``size`` bytes, with
    nothing after it; ``ValueError`` otherwise. Bounded whatever ``data`` holds: at most
    ``size + 1`` bytes are ever produced, and every LZMA2 chunk yields at least one byte, so the
    input read is bounded too. (``lzma.decompress`` would inflate a bomb to its end, and read
    whatever follows the end marker as more streams: ChatTTS's own decoder, in the Acoustic
    stage, does exactly that, so trailing data is refused here.)"""
    # A raw LZMA2 decoder takes only the dictionary size from its filter (lc/lp/pb come in the
    # stream), and a stream that decodes to ``size`` bytes never matches further back than that:
    # a dictionary of ``size`` (liblzma's least is 4 KiB) decodes what ChatTTS's preset-9 filter
    # does, without reserving its 64 MiB per call.
    filters = [{"id": lzma.FILTER_LZMA2, "dict_size": max(4096, size)}]
    decomp = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=filters)
    out = decomp.decompress(data, max_length=size + 1)
    if len(out) > size:
        raise ValueError(f"{what} decompresses to more than {size} bytes")
    if not decomp.eof:
        raise ValueError(f"{what} ends before its LZMA stream does ({len(out)} of {size} bytes)")
    if len(out) != size:
        raise ValueError(f"{what} decompresses to {len(out)} bytes, expected {size}")
    if decomp.unused_data:
        raise ValueError(f"{what} has {len(decomp.unused_data)} bytes after its LZMA stream")
    return out


def decode_speaker(value: str) -> np.ndarray:
    """A ChatTTS speaker string -> its 768 float16 values (what ``Speaker._decode`` does, without
    torch, and bounded: ``InvalidVoiceError`` for anything that is not exactly one speaker)."""
    import pybase16384 as b14

    if not isinstance(value, str):
        raise InvalidVoiceError("a ChatTTS speaker string must be a string")
    if len(value) > MAX_SPEAKER_CHARS:
        raise InvalidVoiceError(
            f"ChatTTS speaker string is {len(value)} characters; a speaker string is at most {MAX_SPEAKER_CHARS}"
        )
    try:
        data = b14.decode_from_string(value)
    except Exception:  # noqa: BLE001 - UnicodeError (lone surrogates), MemoryError, ...: a 400
        raise InvalidVoiceError("ChatTTS speaker string is not base16384 text") from None
    try:
        raw = inflate_exact(data, SPEAKER_BYTES, "ChatTTS speaker string")
    except ValueError as exc:  # inflate_exact's own checks
        raise InvalidVoiceError(f"{exc}; a speaker is {SPEAKER_DIM} float16 values") from None
    except Exception as exc:  # noqa: BLE001 - lzma.LZMAError, MemoryError, anything a decoder raises: a 400
        raise InvalidVoiceError(
            f"voice is not a known voice name, 'seed:<n>', or a ChatTTS speaker string ({exc.__class__.__name__})"
        ) from None
    return np.frombuffer(raw, dtype=np.float16).copy()


@functools.lru_cache(maxsize=256)
def sample_frames(spk_smp: str) -> int:
    """Audio code frames in a reference clip's prompt string (``Speaker.encode_prompt``: base16384
    of a ``(num_vq, frames)`` uint16 header, then the LZMA-compressed codes): its prompt length."""
    import pybase16384 as b14

    return int(np.frombuffer(b14.decode_from_string(spk_smp)[:4], dtype="<u2")[1])


def _check_speaker_string(value: str) -> None:
    vec = decode_speaker(value)  # InvalidVoiceError for anything that is not one speaker
    if not np.isfinite(vec).all():
        raise InvalidVoiceError("ChatTTS speaker string holds non-finite values")


def effective_seed(voice: Voice, seed: Optional[int]) -> int:
    """The seed a synthesis decodes with: the caller's, else the voice's own, else 0."""
    if seed is not None:
        return int(seed)
    return voice.seed if voice.seed is not None else 0


class VoiceResolver:
    """Voice strings -> ``Voice`` (no torch, no model)."""

    def resolve(self, voice: Optional[str]) -> Voice:
        voice = (voice or "").strip() or DEFAULT_VOICE
        key = voice.lower()
        if key in OPENAI_VOICES:
            return Voice(key, OPENAI_VOICES[key])
        m = _SEED_RE.fullmatch(key)
        if m:
            seed = int(m.group(1))
            if seed > MAX_SEED:
                raise InvalidVoiceError(f"seed must be between 0 and {MAX_SEED}")
            return Voice(key, seed)
        if len(voice) < SPEAKER_STRING_MIN_CHARS:
            raise UnknownVoiceError(
                f"unknown voice {voice[:40]!r}: use one of {', '.join(OPENAI_VOICES)}, "
                "'seed:<n>', or a ChatTTS speaker string"
            )
        _check_speaker_string(voice)
        return Voice(f"speaker:{voice[:8]}", None, voice)


def speaker_from_seed(speaker: Any, seed: int) -> str:
    """Sample a ChatTTS speaker deterministically from ``seed`` (private generator, on CPU)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    std = speaker.std.detach().to("cpu", torch.float32)
    mean = speaker.mean.detach().to("cpu", torch.float32)
    vec = torch.randn(speaker.dim, generator=gen, dtype=torch.float32) * std + mean
    return speaker._encode(vec)


class SpeakerSampler:
    """Speaker strings for voices, from one loaded model's speaker statistics (cached per seed)."""

    MAX_CACHED = 4096  # bounded: seeds come from users

    def __init__(self, speaker: Any):
        self._speaker = speaker
        self._by_seed: dict[int, str] = {}

    def from_seed(self, seed: int) -> str:
        spk = self._by_seed.get(seed)
        if spk is None:
            spk = speaker_from_seed(self._speaker, seed)
            if len(self._by_seed) < self.MAX_CACHED:
                self._by_seed[seed] = spk
        return spk

    def embedding(self, voice: Voice) -> Optional[str]:
        return voice.spk_emb if voice.spk_emb is not None else self.from_seed(voice.seed)


def list_voices() -> list[dict[str, Any]]:
    return [{"id": name, "seed": seed} for name, seed in OPENAI_VOICES.items()]
