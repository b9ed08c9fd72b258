"""How many tokens a segment takes, and its speed tag.

Random weights never emit end-of-speech, so each segment stops at ``expected_tokens(text)``: a
fixed function of its text at about the real model's speaking rate (one GPT token = 512 samples
at 24 kHz, ~46.9 tokens per second of audio). Real weights stop at their own end-of-speech but
never later than ``max_new_tokens`` (a cap derived from the same estimate: no runaway babbling).

Rates (at ChatTTS's default [speed_5]): a CJK character ~0.21 s, a Latin letter or digit ~0.065 s,
a pause mark (。，！？.,!?;:、) ~0.2 s, a break tag ([uv_break], [break_N], [lbreak]) ~0.3 s.
"""

from __future__ import annotations

import math

from .audio import SAMPLE_RATE
from .config import SegmentConfig
from .text.chars import SAYABLE_CJK_RE
from .text.tags import BREAK_TAG_RE, CONTROL_TAG_RE

SAMPLES_PER_TOKEN = 512  # one GPT token = 2 mel frames
TOKENS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_TOKEN
TOKEN_SECONDS = 1.0 / TOKENS_PER_SECOND  # audio per token: 21.3 ms

_PAUSE_CHARS = set("。，！？.,!?;:；：、…")

CJK_SECONDS = 0.21
LATIN_SECONDS = 0.065
PAUSE_SECONDS = 0.2
BREAK_SECONDS = 0.3
MIN_SECONDS = 0.3


def speed_tag_level(speed: float) -> int:
    """OpenAI ``speed`` (0.25..4, 1 = normal) -> ChatTTS ``[speed_N]`` level (0..9, 5 = normal).

    Two levels per doubling: 0.25 -> 1, 0.5 -> 3, 1 -> 5, 2 -> 7, 4 -> 9.
    """
    level = 5 + 2 * math.log2(max(speed, 1e-3))
    return int(min(9, max(0, round(level))))


def speed_factor(level: int) -> float:
    """How much faster than [speed_5] a level speaks (inverse of ``speed_tag_level``)."""
    return 2 ** ((level - 5) / 2)


def expected_seconds(text: str, speed_level: int = 5) -> float:
    breaks = len(BREAK_TAG_RE.findall(text))
    plain = CONTROL_TAG_RE.sub("", text)
    cjk = len(SAYABLE_CJK_RE.findall(plain))  # the ideographs ChatTTS says; it drops the others
    latin = sum(1 for c in plain if c.isascii() and c.isalnum())
    pauses = sum(1 for c in plain if c in _PAUSE_CHARS)
    seconds = cjk * CJK_SECONDS + latin * LATIN_SECONDS + pauses * PAUSE_SECONDS + breaks * BREAK_SECONDS
    return max(MIN_SECONDS, seconds) / speed_factor(speed_level)


def expected_tokens(text: str, speed_level: int = 5) -> int:
    """Tokens a segment should take: the random-weights length and the basis of the cap."""
    return max(1, round(expected_seconds(text, speed_level) * TOKENS_PER_SECOND))


def max_new_tokens(text: str, limits: SegmentConfig, speed_level: int = 5) -> int:
    """Hard cap of a segment's generation, real or random weights."""
    cap = int(limits.cap_factor * expected_tokens(text, speed_level)) + limits.cap_slack
    return min(limits.max_new_token, cap)
