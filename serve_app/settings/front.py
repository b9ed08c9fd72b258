"""What guards the front of the service: API keys and their grants (``args.ingress.security``),
the front guard and the edge cache that run in Serve's HTTP proxy (settings from the env, since
the proxy never sees the app's args), and how a stream goes between the stages (``args.flow``)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ..engine.strict import StrictModel
from .units import KiB, MiB

# Ray's hook, read by Serve's proxy (and each replica's own HTTP server) when it starts: set it in
# the environment of `ray start` / `serve run` (and in a RayService's pods: deployments/kuberay.py).
HOOK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
IMPORT_PATH = "deployments.proxy.front_guard:middlewares"
# The Ingress's mark on an answer the edge cache in the proxy may keep (taken off before the client sees it).
EDGE_HEADER = "x-chattts-edge"


class KeyConfig(StrictModel):
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


class SecurityConfig(StrictModel):
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
    keys: dict[str, KeyConfig] = Field(default_factory=dict, description="Per-key grants by key id.")
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins; empty = CORS off.")


class FrontGuardConfig(StrictModel):
    """The refusal budget of the front guard (``deployments/proxy/front_guard.py``), the ASGI middleware that
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
        "front door. With Ray's HAProxy not wrapped by deployments.proxy.front_door, none.",
    )


class FlowConfig(StrictModel):
    """``args.flow``: how a stream's calls and items go between the stages: their transport and
    back-pressure (``pipeline/flow.py``)."""

    transport: Literal["grpc", "object_store"] = Field(
        default="grpc",
        description="grpc: the speech path's stage calls go straight to the replica over Serve's gRPC "
        "(a few ms less per hop than Ray's actor calls, each item pickled inline, 4 MiB at most); "
        "object_store: Ray actor calls, items through the object store.",
    )
    enabled: bool = True
    window: int = Field(
        default=16,
        ge=2,
        le=4096,
        description="Items (hidden-state chunks between the Acoustic and "
        "Vocoder stages, encoded blocks after them) a stream may have sent that its consumer has not taken.",
    )


class EdgeCacheConfig(StrictModel):
    """The edge cache (``deployments/proxy/edge_cache.py``): cache hits kept in Serve's HTTP proxy and given
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
