"""Settings of the serving layer: the config file's ``args`` (``AppArgs``) and the live
``user_config`` of the Acoustic stage (``AcousticLive``).

The engine's own knobs (weights, device, decode loop, vocoder, segments) are
``engine/config.py``'s, shared with the in-process CLI; everything else a deployment reads is
here, each default once. The values these classes default to are the shipped ones:
``config/serve.yaml`` sets only what is deployment-specific (resources, replicas, weights
source, device) and a few commented knobs. Light on purpose (pydantic only): ``AppArgs``
validates the whole ``args`` when the app is built, so a typo in the config file is refused at
``serve run``, not inside a replica.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .engine.config import AcousticConfig, ModelConfig, SegmentLimits, VocoderConfig
from .engine.text.lexicon import MAX_ALIAS_CHARS, MAX_ENTRIES, MAX_ENTRY_CHARS

KiB = 1024
MiB = 1024 * KiB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in key by key at every level (lists and values replace;
    new dicts, the inputs untouched): a config's args over the defaults, a user_config over args."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class KeyGrants(_Strict):
    """What one API key may do beyond every key's defaults (``security.keys.<key id>``; a key's id
    is the non-secret fingerprint the logs show: ``chattts-serve keys id``)."""

    max_priority: Optional[int] = Field(
        default=None, ge=-10, le=10, description="Highest request priority (None: security.max_priority)."
    )
    max_streams: Optional[int] = Field(
        default=None, ge=0, description="Concurrent streams (None: security.max_streams_per_key; 0 = unlimited)."
    )
    max_voices: Optional[int] = Field(
        default=None, ge=0, description="Custom voices it may own (None: voices.max_voices_per_key)."
    )
    admin: bool = Field(default=False, description="Sees, uses and deletes every key's custom voices.")


class SecuritySettings(_Strict):
    """API keys, what each may do, per-key stream limits and CORS (``args.ingress.security``)."""

    auth: Literal["optional", "required"] = Field(
        default="optional",
        description="required: a replica refuses to start (and a live change is refused) unless keys load; "
        "optional: without keys every caller is anonymous, limited by its address (a laptop, a trusted network).",
    )
    api_keys_env: Optional[str] = Field(default="CHATTTS_API_KEYS", description="Env var with comma-separated keys.")
    api_keys_file: Optional[str] = Field(default=None, description="File with one key per line (# comments).")
    max_streams_per_key: int = Field(
        default=16,
        ge=0,
        description="Concurrent streams (HTTP speech and WebSocket sessions) per key, or per client address "
        "without keys, across all Ingress replicas; 0 = unlimited.",
    )
    max_priority: int = Field(
        default=0,
        ge=-10,
        le=10,
        description="Highest request priority a key may ask for, unless keys.<id> allows more.",
    )
    keys: dict[str, KeyGrants] = Field(default_factory=dict, description="Per-key grants by key id.")
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins; empty = CORS off.")


class WebSocketSettings(_Strict):
    """What a WebSocket session may cost while it waits or talks (``args.ingress.websocket``)."""

    first_message_s: float = Field(
        default=5.0, gt=0, description="The session.start message must arrive this soon after the handshake."
    )
    max_unstarted_per_client: int = Field(
        default=4,
        ge=1,
        description="Sockets of one client (key id from the handshake, else "
        "address) not yet started, per Ingress replica; more are refused at the handshake.",
    )
    idle_s: float = Field(
        default=60.0, gt=0, description="A session with nothing to speak and no message for this long is closed."
    )
    max_pending_cuts: int = Field(
        default=4,
        ge=1,
        description="Text cuts of one session being planned at once; a flush past it waits "
        "(text.flush floods cost one TextNormalizer call per cut, not per message).",
    )


class FrontGuardSettings(_Strict):
    """The refusal budget of the front guard (``http/front_guard.py``), the ASGI middleware that
    Serve's HTTP proxy runs before it routes a request (env ``CHATTTS_FRONT_GUARD``, JSON: the
    proxy never sees the app's args). A client is an address plus the fingerprint of its
    Authorization header; every 4xx the service answers it spends one token of its bucket, and a
    client with an empty bucket is answered 429 by the guard itself, after ``tarpit_s``, without a
    trip to the Ingress. Clients whose key the Ingress has never authenticated also share a bucket
    per address, so rotating made-up keys does not buy new budgets."""

    enabled: bool = True
    refusals_per_s: float = Field(
        default=1.0, gt=0, description="Refused requests a client may cause per second, sustained."
    )
    refusal_burst: int = Field(default=20, ge=1, description="... and at once.")
    address_refusals_per_s: float = Field(
        default=5.0, gt=0, description="Refusals per second of the never-served clients of one address."
    )
    address_refusal_burst: int = Field(default=100, ge=1)
    tarpit_s: float = Field(
        default=5.0,
        ge=0,
        le=30,
        description="How long the guard holds a refused request before it answers "
        "(a client that waits for its answer before the next attempt sends one every tarpit_s).",
    )
    max_tarpitted_per_address: int = Field(
        default=1024, ge=0, description="Held requests of one address; more are answered at once."
    )
    max_tarpitted: int = Field(default=4096, ge=0, description="Held requests in all.")
    max_clients: int = Field(
        default=65536,
        ge=16,
        description="Clients never authenticated, and addresses, remembered (least recently seen forgotten first).",
    )
    max_served_clients: int = Field(
        default=65536,
        ge=16,
        description="Clients whose key the Ingress authenticated, in their "
        "own table: only another such client pushes one out.",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1,::1",
        description="Peers whose X-Forwarded-For names the client "
        "(uvicorn's FORWARDED_ALLOW_IPS in the proxy and, with HAProxy, the replicas): only the "
        "front door. With Ray's HAProxy not wrapped by serve_app.http.front_door, none.",
    )


class FlowSettings(_Strict):
    """``args.flow``: back-pressure between the stages of a stream (``serving/flow.py``)."""

    enabled: bool = True
    window: int = Field(
        default=16,
        ge=2,
        le=4096,
        description="Items (hidden-state chunks between the Acoustic and "
        "Vocoder stages, encoded blocks after them) a stream may have sent that its consumer has not taken.",
    )


class EdgeCacheSettings(_Strict):
    """The edge cache (``http/edge_cache.py``): cache hits kept in Serve's HTTP proxy and given
    there again (env ``CHATTTS_EDGE_CACHE``, JSON: the proxy never sees the app's args)."""

    enabled: bool = True
    ttl_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How long the proxy gives an answer again: a revoked key, "
        "a deleted voice or new weights reach every client within it.",
    )
    max_bytes: int = Field(
        default=64 * MiB, ge=0, description="All entries of one proxy process (least recently used out)."
    )
    max_item_bytes: int = Field(default=4 * MiB, ge=0, description="A larger answer is not kept.")
    max_body_bytes: int = Field(
        default=64 * KiB, ge=1024, description="A larger request is not looked up (it goes on as it came)."
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A body the edge reads to look it up must be in within this "
        "of the request's start (408), as the Ingress's ingress.body_timeout_s: keep them equal.",
    )


class IngressSettings(_Strict):
    """``args.ingress``; every field also changes live through the Ingress's ``user_config``."""

    max_input_chars: int = Field(default=4096, ge=1)
    max_body_bytes: int = Field(default=64 * KiB, ge=1024)
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="A request body (any route) must arrive within this (408)."
    )
    websocket: WebSocketSettings = WebSocketSettings()
    warmup: bool = True
    security: SecuritySettings = SecuritySettings()
    request_timeout_s: float = Field(
        default=300.0, gt=0, description="A request ends (504 before audio, cut after) past this."
    )
    # Degradation switches (off by default): answer 429 "busy" / skip refine_text past these
    # numbers of segment rows waiting in the acoustic queue.
    busy_queue_rows: Optional[int] = Field(default=None, ge=1)
    skip_refine_queue_rows: Optional[int] = Field(default=None, ge=0)
    log_text: bool = Field(default=False, description="Log request text (DEBUG only); off: no user text in logs.")


class CacheConfig(_Strict):
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


class VoiceStoreConfig(_Strict):
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


class LexiconStoreConfig(_Strict):
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


class JobsSettings(_Strict):
    """``args.jobs``: long work (``POST /v1/audio/jobs``) run in the background by the
    application's job runner (``serving/jobs.py``) and kept in the job store (``storage/jobs/``)."""

    backend: Literal["directory", "fsspec"] = Field(
        default="directory",
        description="Where jobs' files (chunks' PCM, the final audio) and, without redis_url, their state live. "
        "directory: one host, or a volume every node that runs an Ingress replica or the runner mounts at the same "
        "path; fsspec: the same layout under jobs.url (an object store such as S3, shared by every node).",
    )
    path: Optional[str] = Field(
        default=None, description="directory backend; default $XDG_DATA_HOME/chattts-serve/jobs"
    )
    url: Optional[str] = Field(
        default=None,
        description="fsspec backend: s3://bucket/prefix (needs chattts-serve[s3]), another fsspec URL (gs://...), "
        "file:///path, or memory://name (one process: tests only). The store must honour exclusive creates "
        "(If-None-Match) unless redis_url keeps the state.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec backend: the filesystem's options, e.g. for an S3-compatible store "
        "{endpoint_url: ..., key: ..., secret: ...}; credentials are better left to the environment "
        "(AWS_ACCESS_KEY_ID, an instance role), since settings travel to every replica and the runner.",
    )
    redis_url: Optional[str] = Field(
        default=None,
        description="redis://host:port/db: keep each job's state and each key's job ids in Redis (creation and "
        "its quota check one transaction); the files stay on the backend above.",
    )
    redis_prefix: str = Field(default="chattts:jobs", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9:_.-]+$")
    redis_timeout_s: float = Field(default=2.0, gt=0)
    max_input_chars: int = Field(default=1_000_000, ge=1, description="A job's text at most.")
    max_upload_bytes: int = Field(
        default=8 * MiB,
        ge=64 * KiB,
        description="Body limit of POST /v1/audio/jobs "
        "(a million CJK characters are ~3 MB of UTF-8, ~6 MB as JSON escapes).",
    )
    chunk_chars: int = Field(
        default=600,
        ge=10,
        le=4000,
        description="A chunk (one synthesis) holds whole sentences "
        "up to this many characters; a paragraph is never merged with the next.",
    )
    paragraph_pause_s: float = Field(
        default=0.5, ge=0.0, le=5.0, description="Silence after a chunk that ends a paragraph."
    )
    chapter_pause_s: float = Field(
        default=2.0,
        ge=0.0,
        le=10.0,
        description="Silence after a chapter's last chunk in the whole file (jobs made with chapters).",
    )
    chunks_per_acoustic_replica: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Chunks synthesised at once for "
        "every running Acoustic replica of the app, over all jobs: jobs spread "
        "over the replicas, and more replicas finish them sooner.",
    )
    max_parallel_chunks: int = Field(
        default=64, ge=1, le=1024, description="Chunks synthesised at once at most, however many Acoustic replicas run."
    )
    priority: int = Field(
        default=-10,
        ge=-10,
        le=10,
        description="Admission priority of a job's segments (interactive requests have 0: they are admitted first).",
    )
    max_chunk_retries: int = Field(
        default=8,
        ge=0,
        description="Failed tries of one chunk (a replica died, a stage failed) before the job fails with the reason.",
    )
    retry_backoff_s: float = Field(
        default=1.0, gt=0, description="Wait before a chunk's first retry, doubled each time up to 10 s."
    )
    chunk_timeout_s: float = Field(default=900.0, gt=0, description="A chunk not done within this is tried again.")
    allow_anonymous: bool = Field(
        default=False,
        description="Jobs without an API key (security.auth 'optional' "
        "and no key loaded): every such caller is the one owner 'anonymous', who lists, "
        "fetches and deletes every other's jobs; off, the jobs routes answer 403 "
        "jobs_need_api_key to a caller without a key.",
    )
    max_submissions_at_once: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Submissions being read and planned "
        "at once per Ingress replica (a book's plan takes seconds of a thread); "
        "503 job_submissions_busy past it, and 429 to a key that has one under way.",
    )
    reservation_headroom: float = Field(
        default=0.5,
        ge=0.0,
        le=4.0,
        description="A job reserves its planned audio "
        "times 1 + this (real weights end near the planned length, not on it); "
        "its chunks' PCM past that fails it (reservation_exceeded).",
    )
    max_active_jobs_per_key: int = Field(
        default=4,
        ge=1,
        description="Jobs queued or running at once per key "
        "(with allow_anonymous and no keys, every caller is 'anonymous' and they "
        "share it): 429 past it.",
    )
    max_jobs_per_key: int = Field(
        default=100, ge=1, description="Jobs kept per key, finished ones included: 409 past it."
    )
    max_bytes_per_key: int = Field(
        default=16 * 1024 * MiB,
        ge=MiB,
        description="Bytes a key's jobs may hold (a job "
        "counts its reservation until it is done: its normalised plan's PCM with "
        "reservation_headroom, twice with chapters; its files after): 409 past it.",
    )
    ttl_s: float = Field(default=7 * 86400.0, gt=0, description="A finished job (its audio) is kept this long.")
    sweep_interval_s: float = Field(default=600.0, gt=0, description="How often the runner deletes expired jobs.")
    rescan_s: float = Field(default=5.0, gt=0, description="How often the runner looks for jobs it was not told about.")
    runner_num_cpus: float = Field(
        default=0.1,
        ge=0.0,
        description="The runner actor's CPUs (it encodes each finished job's file once; the synthesis is the stages').",
    )

    @model_validator(mode="after")
    def _check_store(self) -> "JobsSettings":
        if self.backend == "fsspec":
            if not self.url or "://" not in self.url or not self.url.split("://", 1)[0]:
                raise ValueError(
                    "jobs backend 'fsspec' needs url: s3://bucket/prefix, file:///path, memory://name, ..."
                )
            protocol = self.url.split("://", 1)[0]
            try:
                import fsspec
            except ImportError:  # make_job_store says what to install
                fsspec = None
            if fsspec is not None and protocol not in fsspec.available_protocols():
                raise ValueError(f"jobs.url: fsspec knows no {protocol!r} filesystem")
            if self.path:
                raise ValueError("jobs.path is the directory backend's; with backend 'fsspec' give url")
        else:
            if self.url or self.storage_options:
                raise ValueError("jobs.url and jobs.storage_options are the fsspec backend's: set backend: fsspec")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("jobs.redis_url must be a redis://, rediss:// or unix:// URL")
        return self


# Decode-loop knobs a running engine takes from its next step; the others (CUDA graphs, and what
# the app derives from the vocoder) are read when the engine is built.
LIVE_ACOUSTIC_FIELDS = (
    "max_rows",
    "token_budget",
    "first_chunk_tokens",
    "chunk_tokens",
    "listener_margin_s",
    "continuous",
    "max_queued_rows",
    "max_queued_rows_per_client",
    "reserved_rows",
    "max_running_rows_per_client",
    "refine_max_chars",
    "refine_max_texts",
    "refine_wait_s",
)


class AcousticLive(BaseModel):
    """The Acoustic stage's ``user_config``: what changes without restarting its replicas.

    The ``@serve.batch`` admission window, plus any of ``LIVE_ACOUSTIC_FIELDS`` of
    ``AcousticConfig`` (validated with its ranges when applied: ``engine_config``)."""

    model_config = ConfigDict(extra="allow")

    max_batch_size: int = Field(default=8, ge=1, le=64, description="Requests submitted together at most.")
    # Rows join the running batch at the next step anyway (continuous batching): the window only
    # groups prefills, and every request's first audio waits for it.
    batch_wait_timeout_s: float = Field(default=0.01, ge=0.0, le=2.0)
    # A request that finds the engine idle (no row running or waiting, none in the window) is
    # submitted at once: no other request's prefill to group it with, and its first audio does
    # not wait the window (deployments/acoustic.py).
    admit_idle_at_once: bool = True

    @model_validator(mode="after")
    def _only_live_fields(self) -> "AcousticLive":
        unknown = sorted(set(self.model_extra or {}) - set(LIVE_ACOUSTIC_FIELDS))
        if unknown:
            raise ValueError(
                f"not a live Acoustic setting: {', '.join(unknown)} (live: max_batch_size, "
                f"batch_wait_timeout_s, admit_idle_at_once, {', '.join(LIVE_ACOUSTIC_FIELDS)})"
            )
        return self

    def engine_changes(self) -> dict[str, Any]:
        """The engine fields this user_config names, as given (null included: it switches a knob
        such as listener_margin_s or max_running_rows_per_client off)."""
        return dict(self.model_extra or {})

    def engine_config(self, current: AcousticConfig) -> AcousticConfig:
        """``current`` with this config's engine fields, validated as ``AcousticConfig``."""
        return AcousticConfig.model_validate({**current.model_dump(), **self.engine_changes()})


class AppArgs(_Strict):
    """The config's ``args``: the engine's knobs and the serving layer's settings."""

    model: ModelConfig = ModelConfig()
    acoustic: AcousticConfig = AcousticConfig()
    vocoder: VocoderConfig = VocoderConfig()
    segments: SegmentLimits = SegmentLimits()
    ingress: IngressSettings = IngressSettings()
    cache: CacheConfig = CacheConfig()
    voices: VoiceStoreConfig = VoiceStoreConfig()
    lexicons: LexiconStoreConfig = LexiconStoreConfig()
    flow: FlowSettings = FlowSettings()
    jobs: JobsSettings = JobsSettings()
    # Vocoder replicas never need the GPU or its dtype: CPU float32.
    vocoder_device: str = "cpu"
