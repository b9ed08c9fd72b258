"""What crosses a stage boundary: plain data, no torch.

The Ingress sends the text and its ``SynthesisOptions`` to the TextNormalizer and gets a
``Plan`` (its ``SegmentRequest`` rows) back; it hands the plan to the Vocoder, which sends the
segments to the Acoustic stage and receives ``WireChunk`` hidden states back, and ends each
stream with a ``StreamSummary`` for the Ingress (docs/architecture.md, "What crosses each
boundary"). Every stage imports this module, so it must stay light: dataclasses, pydantic,
numpy, the standard library (the Ingress and TextNormalizer replicas never import torch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from .audio import GAIN_DB_RANGE, SAMPLE_RATE
from .strict import StrictModel
from .text import CONTROL_TAG_RE
from .text.lexicon import Pronunciations

# The longest voice string any schema takes. A ChatTTS speaker string (the longest kind of voice
# string) is base16384 of a raw LZMA2 stream of 768 float16 values (1536 bytes): the largest such
# stream ``lzma.compress`` makes is an uncompressed chunk, 1536 + 3 header + 1 end byte = 1540
# bytes, 880 characters (real speakers compress to ~840). 1024 leaves a margin and keeps the
# bytes ``engine/voices.decode_speaker`` reads small (it checks this bound before decoding).
MAX_SPEAKER_CHARS = 1024


# What a request's ``lexicon`` may be: a lexicon id (``storage.lexicons``), or "none".
LEXICON_REF_PATTERN = r"^(lex_[0-9a-f]{24}|none)$"


# The client of the rows the service makes for itself (an Ingress replica's warm-up): they never
# count as another client being present, so a replica starting does not cap the clients' rows.
INTERNAL_CLIENT = "internal"


class SynthesisOptions(StrictModel):
    """What a caller may choose about one synthesis: the one home of these defaults and ranges.

    The HTTP/handle request (``protocol.SpeechRequest``) extends it and converts itself with
    ``to_options()``; the planner reads it; ``SegmentRequest``'s defaults come from it.
    """

    voice: str = Field(
        default="alloy",
        max_length=MAX_SPEAKER_CHARS,
        description="OpenAI voice, seed:<n>, or a ChatTTS speaker string.",
    )
    seed: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    temperature: float = Field(default=0.3, ge=0.01, le=2.0)
    top_p: float = Field(default=0.7, ge=0.01, le=1.0)
    top_k: int = Field(default=20, ge=1, le=625)
    prompt: str = Field(
        default="", max_length=256, description="ChatTTS control tags, e.g. [oral_2][laugh_0][break_6]."
    )
    normalize: bool = True
    text_normalization: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="on: numbers, units and symbols read as words; off: the text as written (digits one by one, "
        "symbols ChatTTS cannot say dropped); auto: as 'normalize' says (on by default).",
    )
    lexicon: Optional[str] = Field(
        default=None,
        pattern=LEXICON_REF_PATTERN,
        description="A pronunciation lexicon's id (POST /v1/audio/lexicons); 'none': not even the API key's "
        "default lexicon.",
    )
    # The lexicon's entries, put here by the Ingress (from ``lexicon`` or the key's default): what
    # the TextNormalizer applies and the cache keys. Not the API's to set (``ApiOptions``).
    pronunciations: SkipJsonSchema[Optional[Pronunciations]] = None
    lang: Optional[Literal["zh", "en"]] = None
    priority: int = Field(default=0, ge=-10, le=10)
    volume: float = Field(
        default=0.0, ge=GAIN_DB_RANGE[0], le=GAIN_DB_RANGE[1], description="Gain in dB applied to the audio."
    )

    @field_validator("prompt")
    @classmethod
    def _only_control_tags(cls, v: str) -> str:
        # Only the whitelisted prosody tags: internal tokens like [spk_emb] must not get in.
        if CONTROL_TAG_RE.sub("", v).strip():
            raise ValueError("prompt may only contain ChatTTS control tags such as [oral_2][laugh_0][break_6]")
        return v


DEFAULT_OPTIONS = SynthesisOptions()


@dataclass
class SegmentRequest:
    """One segment to decode. Text is already normalised; prompt carries control tags.

    The speaker is either a ChatTTS speaker string (``spk_emb``) or a seed to sample one from
    (``spk_seed``): sampling needs torch, so the stage that runs the GPT resolves it
    (``voices.SpeakerSampler``, called by ``AcousticEngine.submit``).
    """

    text: str
    spk_emb: Optional[str]
    seed: int
    max_new_tokens: int  # hard cap, real or random weights
    min_new_tokens: int = 1  # end-of-speech is masked before this many tokens
    target_tokens: Optional[int] = None  # random weights: the segment's length (see pacing.py)
    prompt: str = "[speed_5]"
    temperature: float = DEFAULT_OPTIONS.temperature
    top_p: float = DEFAULT_OPTIONS.top_p
    top_k: int = DEFAULT_OPTIONS.top_k
    repetition_penalty: float = 1.05  # ChatTTS's default; not a request option
    priority: int = DEFAULT_OPTIONS.priority  # higher first
    first_chunk_tokens: Optional[int] = None
    chunk_tokens: Optional[int] = None
    spk_seed: Optional[int] = None
    # A reference clip (ChatTTS's zero-shot prompt): its audio codes as ChatTTS's prompt string
    # (``Chat.sample_audio_speaker``) and its transcript, used with or without ``spk_emb``.
    spk_smp: Optional[str] = None
    txt_smp: Optional[str] = None
    # Who asked (the Ingress's caller id: an API key's id, or ``ip:<addr>`` without keys; "" =
    # anonymous; ``INTERNAL_CLIENT``: the service's own work). The Acoustic stage shares its
    # queue and slots fairly between clients.
    client: str = ""
    # A listener plays this request's audio at 1x as it arrives (a streamed answer: a voice agent,
    # a phone line, the web page), so its rows are scheduled by their playback deadline
    # (``AcousticConfig.scheduling``: least slack first). False (whole-file answers, jobs, bulk):
    # no deadline, the batch's remaining capacity, shared fairly between clients. Every segment of
    # one request carries the same value (the engine reads the first).
    realtime: bool = False
    # With ``realtime``: audio its listener already holds before this request's (a WebSocket
    # session's next segment: what the session has sent and the listener has not played yet).
    # The request continues a stream: its first audio is due when that runs out, it keeps the
    # stream's claim on the replica's capacity and is never refused for it. 0: a new stream.
    ahead_s: float = 0.0


@dataclass(frozen=True)
class Voice:
    """A resolved voice: where its speaker comes from."""

    name: str  # what the caller asked for (a speaker string is abbreviated)
    seed: Optional[int]  # the speaker is sampled from this seed ...
    spk_emb: Optional[str] = None  # ... or given as a ChatTTS speaker string
    spk_smp: Optional[str] = None  # a reference clip's audio codes (ChatTTS prompt string) ...
    txt_smp: Optional[str] = None  # ... and its transcript

    @property
    def cache_id(self) -> str:
        """What identifies the speaker in a cache key: its content, never its name (a stored
        voice can be deleted and re-created under the same name with other content)."""
        if self.spk_smp is not None:
            content = "\0".join((self.spk_emb or "", self.spk_smp, self.txt_smp or ""))
            return "smp:" + hashlib.sha256(content.encode()).hexdigest()[:32]
        if self.spk_emb is not None:
            return "spk:" + hashlib.sha256(self.spk_emb.encode()).hexdigest()[:32]
        return f"seed:{self.seed}"


@dataclass(frozen=True)
class ScriptPart:
    """One stretch of a script in one voice and speed: an SSML piece, a dialogue turn, or both.
    The Ingress makes them (it resolves voices, instructions and SSML); the planner cuts each
    into segments that all decode together, in order."""

    text: str  # plain text for the front end
    voice: Voice
    speed: float = 1.0
    prompt: str = ""  # control tags (a request's prompt with its instructions' tags)
    # Where ``text`` is in the caller's input: ``offset`` when it is that input verbatim from
    # there (its segments then get their own spans), else ``span`` for every segment of it.
    offset: Optional[int] = None
    span: Optional[tuple[int, int]] = None
    pause_before: float = 0.0  # silence before it (an SSML break, the pause between turns)
    speaker: Optional[str] = None  # for captions and segment events
    turn: Optional[int] = None  # a dialogue's turn


@dataclass
class Plan:
    voice: Voice
    segments: list[SegmentRequest]
    texts: list[str]  # the normalised segment texts
    # Per segment, aligned with ``segments`` (empty: none): where its text came from in the input
    # (character offsets), the silence after it (seconds: a pause between turns, an SSML break),
    # and who speaks it (a voice's name, for captions of several voices).
    spans: list[Optional[tuple[int, int]]] = field(default_factory=list)
    pauses: list[float] = field(default_factory=list)
    speakers: list[Optional[str]] = field(default_factory=list)
    # What captions show for each segment: the input's own text where the segment has a span of
    # its own (a piece that had to be cut again shows its normalised parts).
    sources: list[str] = field(default_factory=list)
    turns: list[Optional[int]] = field(default_factory=list)
    # How the audio is shaped: a gain (dB), silence before the first segment (an SSML break there),
    # and a loudness target for the whole answer (LUFS: the audio is then sent once it is all made).
    gain_db: float = 0.0
    lead_in: float = 0.0
    loudness: Optional[float] = None
    # The TextNormalizer's own time on this plan (ms): the Ingress logs the call's cost beside it.
    planned_ms: float = 0.0

    def pause_after(self, i: int) -> float:
        return self.pauses[i] if i < len(self.pauses) else 0.0

    def span_of(self, i: int) -> Optional[tuple[int, int]]:
        return self.spans[i] if i < len(self.spans) else None

    def speaker_of(self, i: int) -> Optional[str]:
        return self.speakers[i] if i < len(self.speakers) else None

    def turn_of(self, i: int) -> Optional[int]:
        return self.turns[i] if i < len(self.turns) else None

    def source_of(self, i: int) -> str:
        return self.sources[i] if i < len(self.sources) else self.texts[i]


@dataclass
class WireChunk:
    """A hidden-state chunk between stages: fp16 halves the bytes."""

    segment: int
    hidden: np.ndarray  # (n, 768) float16
    final: bool
    finish_reason: Optional[str] = None
    batch_rows: int = 0  # rows decoding together when this chunk left (for logs)
    # The stream's first chunk only: where its time went in the Acoustic process (ms, measured there).
    hops: Optional[dict] = None


@dataclass(frozen=True)
class SegmentMark:
    """Where a segment's audio lies in its stream, in samples at ``SAMPLE_RATE`` (after speed
    and the vocoder's hold-back: the samples emitted for it), sent once its audio is complete.
    A pause after it (``Plan.pauses``) follows ``end`` and belongs to no segment."""

    index: int
    start: int
    end: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


@dataclass
class StreamSummary:
    """The last item of a Vocoder stream: what the Ingress logs and reports."""

    audio_seconds: float
    segments: int
    batch_rows: int  # rows in the acoustic batch when this request's first chunk was decoded
    vocode_seconds: float
    encode_seconds: float
    # Where the first audio's time went in the Vocoder and Acoustic processes (ms, each measured
    # inside its own process): the Ingress logs it with the request (docs/architecture.md, "First audio, hop by hop").
    first_audio: Optional[dict] = None
    # A listener playing the stream at 1x from its first audio (engine/playback.py), as the stage
    # that sent it infers: the silence it heard (s) and how close it came to silence (s; None: no
    # audio reached its playback). None where nobody listens (a whole file made in-process).
    stall_s: Optional[float] = None
    min_slack_s: Optional[float] = None
