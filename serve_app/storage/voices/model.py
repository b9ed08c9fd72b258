"""A stored voice and the rules every backend keeps: ids, names, owners, quotas, and the errors
they answer with."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field

from ...engine.strict import StrictModel
from ...engine.text.tags import strip_stray_brackets
from ...engine.types import Voice
from ...engine.voices import MAX_SEED, OPENAI_VOICES
from ...errors import APIError
from ..records import ANONYMOUS, MAX_OWNER_CHARS, Index, owner_tag

# Lower-case hex only: two ids never differ only in case, so none can collide with another on a
# case-insensitive filesystem. \A..\Z, not ^..$: "$" also matches before a final "\n", and
# with \Z match(), search() and fullmatch() all check the whole string.
VOICE_ID_RE = re.compile(r"\Avoice_[0-9a-f]{24}\Z")
# The same for pydantic, whose (Rust) regex has no \Z; its "$" is the text's end.
VOICE_ID_PATTERN = r"^voice_[0-9a-f]{24}$"
MAX_NAME_CHARS = 64
_RESERVED_PREFIXES = ("seed:", "voice_")
KiB = 1024
MiB = 1024 * KiB

VoiceKind = Literal["speaker", "seed", "clip"]

# A consent statement and who gave it, bounded: kept with the voice, shown in its detail.
MAX_CONSENT_CHARS = 1000
MAX_CONSENT_BY_CHARS = 200


def default_voices_dir() -> Path:
    """``$XDG_DATA_HOME/chattts-serve/voices`` (``~/.local/share/...``): user data, not a cache."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "chattts-serve" / "voices"


class VoiceConsent(StrictModel):
    """The consent recorded when a voice was made: what the speaker agreed to (``statement``, the
    request's ``consent``), who gave it (``by``, the request's ``consent_by``) and when (``at``,
    Unix seconds, the server's clock)."""

    statement: str = Field(min_length=1, max_length=MAX_CONSENT_CHARS)
    by: Optional[str] = Field(default=None, min_length=1, max_length=MAX_CONSENT_BY_CHARS)
    at: int


class StoredVoice(StrictModel):
    """One custom voice as stored. ``speaker``/``seed``: a ChatTTS speaker (a seed voice keeps
    the speaker string sampled from its seed, so it stays the same speaker); ``sample`` and
    ``transcript``: a reference clip's audio codes (ChatTTS's ``spk_smp``) and its text."""

    id: str = Field(pattern=VOICE_ID_PATTERN)
    name: str
    # The API key id that made it ("anonymous" without keys). A document stored before voices
    # had owners has none: it reads as "anonymous"'s.
    owner: str = Field(default=ANONYMOUS, min_length=1, max_length=MAX_OWNER_CHARS)
    kind: VoiceKind
    created_at: int
    speaker: Optional[str] = None
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED)
    sample: Optional[str] = None
    transcript: Optional[str] = None
    clip_seconds: Optional[float] = None
    # Documents stored before consent was recorded have none.
    consent: Optional[VoiceConsent] = None

    def voice(self) -> Voice:
        return Voice(self.name, self.seed, spk_emb=self.speaker, spk_smp=self.sample, txt_smp=self.transcript)

    def summary(self) -> dict[str, Any]:
        """What the create and list answers show (no speaker or codes: they are long). ``owner``:
        the key id it belongs to (a caller's own; an admin sees every owner's)."""
        out = {
            "id": self.id,
            "object": "voice",
            "name": self.name,
            "kind": self.kind,
            "created_at": self.created_at,
            "owner": self.owner,
        }
        if self.seed is not None:
            out["seed"] = self.seed
        if self.clip_seconds is not None:
            out["clip_seconds"] = self.clip_seconds
        return out

    def detail(self) -> dict[str, Any]:
        """``GET /v1/audio/voices/{id}``: everything a user needs to keep this voice elsewhere."""
        return {
            **self.summary(),
            "speaker": self.speaker,
            "sample": self.sample,
            "transcript": self.transcript,
            "content_hash": self.voice().cache_id,
            "consent": self.consent.model_dump() if self.consent is not None else None,
        }

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


# ------------------------------------------------------------------ validation of user input


def check_name(name: Any) -> str:
    """A usable voice name, or a 400 that says why."""
    if not isinstance(name, str) or not name:
        raise APIError(400, "a voice needs a 'name'", param="name", code="missing_required_parameter")
    problem = None
    if len(name) > MAX_NAME_CHARS:
        problem = f"at most {MAX_NAME_CHARS} characters"
    elif name != name.strip() or not name.isprintable():
        problem = "printable characters without leading or trailing spaces"
    elif name.lower() in OPENAI_VOICES or name.lower().startswith(_RESERVED_PREFIXES):
        problem = "not a built-in voice name and not starting with 'seed:' or 'voice_'"
    if problem:
        raise APIError(400, f"invalid voice name: use {problem}", param="name", code="invalid_name")
    return name


def name_key(name: str) -> str:
    """Names are unique ignoring case; the key is a hash, so a name never becomes a path or key."""
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:32]


def index_key(owner: str, name: str) -> str:
    """The name index's key of ``owner``'s voice ``name``: ``<owner tag>.<name hash>``, so names
    are unique per owner. The anonymous owner's keys are the bare name hash, the key every voice
    had before voices had owners: an index written then reads unchanged, as anonymous's."""
    key = name_key(name)
    return key if owner == ANONYMOUS else f"{owner_tag(owner)}.{key}"


def clean_transcript(text: Any, max_chars: int) -> str:
    """The clip's transcript as ChatTTS reads it before the text (``txt_smp``): internal tokens
    such as ``[spk_emb]`` cannot get in (only control tags keep their brackets)."""
    if not isinstance(text, str) or not text.strip():
        raise APIError(
            400,
            "a voice made from a clip needs its 'transcript': the words spoken in the clip",
            param="transcript",
            code="missing_transcript",
        )
    text = " ".join(strip_stray_brackets(text.replace("\x00", " ")).split())
    if len(text) > max_chars:
        raise APIError(
            400,
            f"transcript is {len(text)} characters; the limit is {max_chars}",
            param="transcript",
            code="transcript_too_long",
        )
    return text


def _one_line(text: str) -> str:
    """``text`` on one line: control characters and runs of whitespace become one space."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())


def check_consent(
    statement: Any, by: Any, required: bool, kind: VoiceKind, now: Optional[int] = None
) -> Optional[VoiceConsent]:
    """The consent a create request records (``consent``, ``consent_by``), or None when it gives
    none; a 400 naming the field when one is malformed, too long, or missing where it is required
    (``required``: ``voices.require_consent``, for voices made from a clip: a real person's voice)."""
    fields = {"consent": (statement, MAX_CONSENT_CHARS), "consent_by": (by, MAX_CONSENT_BY_CHARS)}
    clean: dict[str, Optional[str]] = {}
    for field, (value, limit) in fields.items():
        if value is None or value == "":
            clean[field] = None
            continue
        if not isinstance(value, str):
            raise APIError(400, f"'{field}' must be text", param=field, code="invalid_value")
        if len(value) > limit:  # before any work on it
            raise APIError(400, f"'{field}' is at most {limit} characters", param=field, code="consent_too_long")
        clean[field] = _one_line(value) or None
    if required and kind == "clip":
        for field, what in (
            ("consent", "the speaker's consent statement (e.g. 'I agree that my voice is used to make this voice')"),
            ("consent_by", "who gave the consent (the speaker's name)"),
        ):
            if clean[field] is None:
                raise APIError(
                    400,
                    f"this server records consent for voices made from a clip: send '{field}', {what}",
                    param=field,
                    code="consent_required",
                )
    if clean["consent"] is None:
        if clean["consent_by"] is not None:
            raise APIError(
                400, "'consent_by' needs the 'consent' statement it gave", param="consent", code="consent_required"
            )
        return None
    return VoiceConsent(statement=clean["consent"], by=clean["consent_by"], at=int(time.time()) if now is None else now)


def new_voice_id() -> str:
    return "voice_" + secrets.token_hex(12)  # lower-case hex, as VOICE_ID_RE requires


def name_taken(name: str) -> APIError:
    return APIError(
        409,
        f"a voice named {name!r} exists already; delete it first or pick another name",
        param="name",
        code="voice_exists",
    )


def read_names(raw: dict[str, str]) -> Index:
    """``names.json`` (index key -> id) read: the key tells the owner (``index_key``), so the file
    is both the name index and every owner's ids."""
    ids = {v: (k.split(".", 1)[0] if "." in k else owner_tag(ANONYMOUS)) for k, v in raw.items()}
    return Index(ids=ids, pointers=dict(raw))


def write_names(index: Index) -> dict[str, str]:
    return index.pointers  # every voice has its name: the pointers hold every id


# ------------------------------------------------------------------ making one


def stored_voice(name: str, kind: VoiceKind, owner: str = ANONYMOUS, **fields: Any) -> StoredVoice:
    return StoredVoice(id=new_voice_id(), name=name, owner=owner, kind=kind, created_at=int(time.time()), **fields)
