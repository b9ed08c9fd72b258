"""What the Ingress stores: the response cache (``args.cache``), the voices users make
(``args.voices``) and their pronunciation lexicons (``args.lexicons``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, model_validator

from ..engine.strict import StrictModel
from ..engine.text.lexicon import MAX_ALIAS_CHARS, MAX_ENTRIES, MAX_ENTRY_CHARS
from .units import KiB, MiB


class CacheConfig(StrictModel):
    """``args.cache``: the response cache (``storage/cache.py``)."""

    backend: Literal["memory", "redis", "none"] = "memory"
    max_bytes: int = Field(default=256 * MiB, ge=1, description="Memory backend: byte budget (LRU).")
    ttl_s: float = Field(default=3600.0, gt=0)
    jitter: float = Field(default=0.1, ge=0.0, lt=1.0, description="TTL spread: ttl * uniform(1-j, 1+j).")
    redis_url: Optional[str] = Field(default=None, description="redis://host:port/db for backend=redis.")
    max_item_bytes: int = Field(default=16 * MiB, ge=1, description="Larger responses are not cached.")
    redis_timeout_s: float = Field(default=0.2, gt=0)
    redis_backoff_s: float = Field(default=5.0, ge=0, description="Skip redis this long after a failure.")
    share_across_keys: bool = Field(
        default=False,
        description="One key's stored answers also answer another key's identical request. Off: entries are "
        "each key's own (without keys, every caller is one owner), so neither a hit nor its speed tells one key "
        "what another asked for. On (one tenant behind the keys): more hits, and X-Cache is not sent.",
    )

    @model_validator(mode="after")
    def _redis_needs_url(self) -> "CacheConfig":
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("cache backend 'redis' needs redis_url")
        return self


class VoiceStoreConfig(StrictModel):
    """``args.voices``: the store of voices users make (``storage/voices/``)."""

    backend: Literal["directory", "memory", "redis"] = "directory"
    path: Optional[str] = Field(
        default=None, description="directory backend; default $XDG_DATA_HOME/chattts-serve/voices"
    )
    redis_url: Optional[str] = Field(default=None, description="redis://host:port/db for backend=redis")
    redis_prefix: str = Field(default="chattts:voices", min_length=1, max_length=64)
    redis_timeout_s: float = Field(default=1.0, gt=0)
    max_voices: int = Field(default=1000, ge=1, description="Custom voices at most (all users together).")
    max_voices_per_key: int = Field(
        default=20,
        ge=0,
        description="Custom voices one API key may own (security.keys.<id>.max_voices overrides it); without keys "
        "every caller is 'anonymous' and they share this one quota.",
    )
    max_voice_bytes: int = Field(default=64 * KiB, ge=1024, description="A stored voice's JSON at most.")
    max_upload_bytes: int = Field(default=8 * MiB, ge=64 * KiB, description="Body limit of POST /v1/audio/voices.")
    min_clip_seconds: float = Field(default=2.0, gt=0)
    max_clip_seconds: float = Field(default=30.0, gt=0, le=60)
    max_transcript_chars: int = Field(default=500, ge=1)
    require_consent: bool = Field(
        default=False,
        description="A voice made from a clip needs the speaker's consent: the create request's 'consent' "
        "(statement) and 'consent_by' (who gave it), kept with the voice (400 without them). Off here, on in "
        "config/serve.gpu.yaml.",
    )

    @model_validator(mode="after")
    def _check(self) -> "VoiceStoreConfig":
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("voices backend 'redis' needs redis_url")
        if self.min_clip_seconds >= self.max_clip_seconds:
            raise ValueError("min_clip_seconds must be below max_clip_seconds")
        return self


class LexiconStoreConfig(StrictModel):
    """``args.lexicons``: pronunciation lexicons users make (``storage/lexicons/``) and their bounds.
    The store follows ``args.voices`` unless set: the same backend, ``<voices path>/lexicons``, the
    same Redis under its own prefix."""

    backend: Optional[Literal["directory", "memory", "redis"]] = Field(
        default=None, description="None: the voices' backend."
    )
    path: Optional[str] = Field(default=None, description="directory backend; default <voices dir>/lexicons")
    redis_url: Optional[str] = Field(default=None, description="redis backend; default voices.redis_url")
    redis_prefix: str = Field(default="chattts:lexicons", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9:_.-]+$")
    redis_timeout_s: float = Field(default=1.0, gt=0)
    max_lexicons: int = Field(default=10_000, ge=1, description="Lexicons at most (all users together).")
    max_lexicons_per_key: int = Field(default=20, ge=0, description="Lexicons one API key may own.")
    max_entries: int = Field(default=500, ge=1, le=MAX_ENTRIES, description="Entries of one lexicon at most.")
    max_entry_chars: int = Field(
        default=32, ge=1, le=MAX_ENTRY_CHARS, description="An entry's written text at most (characters)."
    )
    max_alias_chars: int = Field(
        default=128, ge=1, le=MAX_ALIAS_CHARS, description="An entry's alias (or pinyin) at most (characters)."
    )
    max_upload_bytes: int = Field(default=256 * KiB, ge=16 * KiB, description="Body limit of POST /v1/audio/lexicons.")

    def resolved(self, voices: "VoiceStoreConfig") -> "LexiconStoreConfig":
        """This config with what it leaves to the voices' store filled in."""
        backend = self.backend or voices.backend
        path = self.path
        if path is None and voices.path is not None:
            path = str(Path(voices.path).expanduser() / "lexicons")
        redis_url = self.redis_url or voices.redis_url
        if backend == "redis" and not redis_url:
            raise ValueError("lexicons backend 'redis' needs redis_url (or voices.redis_url)")
        return self.model_copy(update={"backend": backend, "path": path, "redis_url": redis_url})
