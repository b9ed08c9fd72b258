"""Voices: OpenAI voice names, ``seed:<n>`` and ChatTTS speaker strings -> a speaker embedding.

A ChatTTS speaker is a 768-d vector sampled from fixed statistics (``spk_stat``), serialised as a
base16384 string. We sample it from a private ``torch.Generator`` seeded with the voice's seed,
never from torch's global RNG, so the same voice gives the same speaker in every process.
"""

from __future__ import annotations

import lzma
import re
from dataclasses import dataclass
from typing import Any

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
_SEED_RE = re.compile(r"^seed:(\d{1,10})$")
SPEAKER_STRING_MIN_CHARS = 32  # a real encoded speaker is several hundred characters


class VoiceError(ValueError):
    """A voice string that names no voice."""


@dataclass(frozen=True)
class Voice:
    name: str  # what the caller asked for (a speaker string is abbreviated)
    spk_emb: str  # ChatTTS speaker string
    seed: int | None  # the seed the speaker came from (None for a given speaker string)


def speaker_from_seed(speaker: Any, seed: int) -> str:
    """Sample a ChatTTS speaker deterministically from ``seed`` (private generator, on CPU)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    std = speaker.std.detach().to("cpu", torch.float32)
    mean = speaker.mean.detach().to("cpu", torch.float32)
    vec = torch.randn(speaker.dim, generator=gen, dtype=torch.float32) * std + mean
    return speaker._encode(vec)


def _check_speaker_string(speaker: Any, value: str) -> None:
    try:
        vec = speaker._decode(value)
    except (lzma.LZMAError, ValueError, TypeError, UnicodeError) as exc:
        raise VoiceError("voice is not a known voice name, 'seed:<n>', or a ChatTTS speaker string") from exc
    if vec.shape != (speaker.dim,):
        raise VoiceError(f"ChatTTS speaker string decodes to {vec.shape[0]} values, expected {speaker.dim}")


class VoiceResolver:
    """Resolves voice strings against one loaded model's speaker statistics (cached)."""

    def __init__(self, speaker: Any):
        self._speaker = speaker
        self._by_seed: dict[int, str] = {}

    def _from_seed(self, seed: int) -> str:
        spk = self._by_seed.get(seed)
        if spk is None:
            spk = speaker_from_seed(self._speaker, seed)
            if len(self._by_seed) < 4096:  # bounded: seeds come from users
                self._by_seed[seed] = spk
        return spk

    def resolve(self, voice: str | None) -> Voice:
        voice = (voice or "").strip() or DEFAULT_VOICE
        key = voice.lower()
        if key in OPENAI_VOICES:
            seed = OPENAI_VOICES[key]
            return Voice(key, self._from_seed(seed), seed)
        m = _SEED_RE.match(key)
        if m:
            seed = int(m.group(1))
            if seed > MAX_SEED:
                raise VoiceError(f"seed must be between 0 and {MAX_SEED}")
            return Voice(key, self._from_seed(seed), seed)
        if len(voice) < SPEAKER_STRING_MIN_CHARS:
            raise VoiceError(
                f"unknown voice {voice[:40]!r}: use one of {', '.join(OPENAI_VOICES)}, "
                "'seed:<n>', or a ChatTTS speaker string"
            )
        _check_speaker_string(self._speaker, voice)
        return Voice(f"speaker:{voice[:8]}", voice, None)


def list_voices() -> list[dict[str, Any]]:
    return [{"id": name, "seed": seed} for name, seed in OPENAI_VOICES.items()]
