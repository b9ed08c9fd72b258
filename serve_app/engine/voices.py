"""Voices: OpenAI voice names, ``seed:<n>`` and ChatTTS speaker strings.

Two halves, so the stages that do no tensor work stay free of torch:

- ``VoiceResolver`` (no torch) reads a voice string into a ``Voice``: a seed to sample the
  speaker from, or a ChatTTS speaker string (validated by decoding it with numpy). The
  TextNormalizer, the cache key and the Ingress use it.
- ``SpeakerSampler`` (torch) turns a seed into the speaker string, in the stage that holds
  ChatTTS's speaker statistics (the Acoustic stage, or the in-process ``Synthesizer``). It
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
from .types import Voice

# Fixed seeds for OpenAI's voice names: stable forever (changing one changes a voice).
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
}
DEFAULT_VOICE = "alloy"
MAX_SEED = 2**31 - 1
SPEAKER_DIM = 768  # ChatTTS's GPT hidden size: a speaker embedding has this many values
SPEAKER_STRING_MIN_CHARS = 32  # a real encoded speaker is several hundred characters
_SEED_RE = re.compile(r"^seed:(\d{1,10})$")
# ChatTTS's own serialisation of a speaker: base16384 of a raw-LZMA2 stream of float16 values.
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def decode_speaker(value: str) -> np.ndarray:
    """A ChatTTS speaker string -> its float16 vector (what ``Speaker._decode`` does, without torch)."""
    import pybase16384 as b14

    raw = lzma.decompress(b14.decode_from_string(value), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    return np.frombuffer(raw, dtype=np.float16).copy()


def encode_speaker(vec: np.ndarray) -> str:
    """A speaker vector -> ChatTTS's speaker string (``Speaker._encode`` without torch)."""
    import pybase16384 as b14

    raw = np.asarray(vec, dtype=np.float16).tobytes()
    return b14.encode_to_string(lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


@functools.lru_cache(maxsize=256)
def sample_frames(spk_smp: str) -> int:
    """Audio code frames in a reference clip's prompt string (``Speaker.encode_prompt``: base16384
    of a ``(num_vq, frames)`` uint16 header, then the LZMA-compressed codes): its prompt length."""
    import pybase16384 as b14

    return int(np.frombuffer(b14.decode_from_string(spk_smp)[:4], dtype="<u2")[1])


def _check_speaker_string(value: str) -> None:
    try:
        vec = decode_speaker(value)
    except (lzma.LZMAError, ValueError, TypeError, UnicodeError) as exc:
        raise InvalidVoiceError("voice is not a known voice name, 'seed:<n>', or a ChatTTS speaker string") from exc
    if vec.shape != (SPEAKER_DIM,):
        raise InvalidVoiceError(f"ChatTTS speaker string decodes to {vec.shape[0]} values, expected {SPEAKER_DIM}")
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
        m = _SEED_RE.match(key)
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
