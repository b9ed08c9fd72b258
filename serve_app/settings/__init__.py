"""Settings of the serving layer: the config file's ``args`` (``AppConfig``) and the live
``user_config`` of the Acoustic stage (``AcousticUserConfig``).

The engine's own knobs (weights, device, decode loop, vocoder, segments) are
``engine/config.py``'s, shared with the in-process CLI; everything else a deployment reads is
here, each default once, in a module per feature: ``front`` (API keys, the front guard, the edge
cache, flow), ``ingress``, ``stores`` (cache, voices, lexicons), ``jobs``, ``app`` (``AppConfig``,
``AcousticUserConfig``). The values these classes default to are the shipped ones:
``config/serve.yaml`` sets only what is deployment-specific (resources, replicas, weights
source, device) and a few commented knobs. Light on purpose (pydantic only): ``AppConfig``
validates the whole ``args`` when the app is built, so a typo in the config file is refused at
``serve run``, not inside a replica. Importers take every name from this package.
"""

from __future__ import annotations

from .app import LIVE_ACOUSTIC_FIELDS, AcousticUserConfig, AppConfig, merged
from .front import (
    EDGE_HEADER,
    HOOK_ENV,
    IMPORT_PATH,
    EdgeCacheConfig,
    FlowConfig,
    FrontGuardConfig,
    KeyConfig,
    SecurityConfig,
)
from .ingress import IngressConfig, WebSocketConfig
from .jobs import JobsConfig
from .stores import CacheConfig, LexiconStoreConfig, VoiceStoreConfig
from .units import KiB, MiB

__all__ = [
    "EDGE_HEADER",
    "HOOK_ENV",
    "IMPORT_PATH",
    "LIVE_ACOUSTIC_FIELDS",
    "AcousticUserConfig",
    "AppConfig",
    "CacheConfig",
    "EdgeCacheConfig",
    "FlowConfig",
    "FrontGuardConfig",
    "IngressConfig",
    "JobsConfig",
    "KeyConfig",
    "KiB",
    "LexiconStoreConfig",
    "MiB",
    "SecurityConfig",
    "VoiceStoreConfig",
    "WebSocketConfig",
    "merged",
]
