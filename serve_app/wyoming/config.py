"""The Wyoming server's settings: where it listens, which service it speaks through, and what one
client may hold. Defaults come from the service's own limits (``IngressConfig``), so a client
is refused here what the service would refuse anyway, before any call is made."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator

from ..engine.strict import StrictModel
from ..settings import IngressConfig

_INGRESS = IngressConfig()
DEFAULT_PORT = 10200  # the port Wyoming TTS servers use (wyoming-piper's); Home Assistant suggests it
ENV_BASE_URL = "CHATTTS_BASE_URL"
ENV_API_KEY = "CHATTTS_API_KEY"


class WyomingClientConfig(StrictModel):
    """What one Wyoming client may cost this process and the service."""

    max_text_chars: int = Field(
        default=_INGRESS.max_input_chars,
        ge=1,
        description="A synthesize's text, and a stream's text not yet handed to the service (the service's max_input_chars).",
    )
    max_event_bytes: int = Field(
        default=_INGRESS.max_body_bytes,
        ge=1024,
        description="One event's JSON header line plus its data and payload (the service's max_body_bytes).",
    )
    max_synthesize_per_connection: int = Field(
        default=2, ge=1, description="Syntheses one connection has running or waiting (they run in order)."
    )
    max_connections: int = Field(default=32, ge=1, description="Open client connections; more get an error.")
    max_connections_per_peer: int = Field(
        default=8,
        ge=1,
        description="Open connections of one peer address (every unix:// client is one peer); more get an "
        "error, so one host holding sockets open cannot take them all from Home Assistant.",
    )
    idle_timeout_s: float = Field(
        default=_INGRESS.websocket.idle_s,
        gt=0,
        description="A connection with nothing to speak and no event but pings for this long is closed "
        "(a ping keeps nothing open).",
    )
    samples_per_chunk: int = Field(default=1024, ge=1, description="The most samples in one audio-chunk event.")


class WyomingConfig(StrictModel):
    """``chattts-serve wyoming``: the command's flags over the environment."""

    uri: str = Field(default=f"tcp://0.0.0.0:{DEFAULT_PORT}", description="tcp://host:port or unix://path")
    base_url: str = Field(default="http://127.0.0.1:8000", description="The service's public base URL.")
    api_key: Optional[SecretStr] = Field(
        default=None,
        description="The service's API key (none: an open service). Not an admin key: the server refuses to "
        "start with one (any client on the network could list and speak with every key's voices).",
    )
    voice: str = Field(default="alloy", min_length=1, max_length=64, description="When the client names no voice.")
    zeroconf: bool = Field(default=False, description="Announce _wyoming._tcp over mDNS (Home Assistant discovery).")
    zeroconf_name: str = Field(default="chattts-serve", min_length=1, max_length=63)
    voices_ttl_s: float = Field(default=30.0, ge=0, description="How long the service's voice listing is reused.")
    limits: WyomingClientConfig = WyomingClientConfig()

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        parsed = urlparse(v)
        if parsed.scheme not in ("tcp", "unix"):
            raise ValueError("uri must be tcp://host:port or unix://path")
        if parsed.scheme == "tcp" and (parsed.hostname is None or parsed.port is None):
            raise ValueError("a tcp:// uri needs a host and a port")
        return v

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        if urlparse(v).scheme not in ("http", "https"):
            raise ValueError("base_url must be an http:// or https:// URL")
        return v.rstrip("/")

    @property
    def key(self) -> Optional[str]:
        return self.api_key.get_secret_value() if self.api_key is not None else None

    @classmethod
    def from_env(cls, env: Optional[dict[str, str]] = None, key_file: Optional[Path] = None, **given: Any):
        """Settings from ``env`` (the process's by default): CHATTTS_BASE_URL and CHATTTS_API_KEY,
        under what was given (flags; None means not given). A key file's first line wins over the
        variable, so a key never has to go on a command line."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if env.get(ENV_BASE_URL):
            values["base_url"] = env[ENV_BASE_URL]
        if env.get(ENV_API_KEY):
            values["api_key"] = env[ENV_API_KEY].strip()
        if key_file is not None:
            lines = Path(key_file).read_text().strip().splitlines()
            values["api_key"] = lines[0].strip() if lines else None
        limits = {k: given.pop(k) for k in list(given) if k in WyomingClientConfig.model_fields}
        values.update({k: v for k, v in given.items() if v is not None})
        values["limits"] = {k: v for k, v in limits.items() if v is not None}
        return cls.model_validate(values)
