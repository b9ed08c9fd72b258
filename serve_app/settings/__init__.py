"""Settings of the serving layer: the config file's ``args`` (``AppArgs``) and the live
``user_config`` of the Acoustic stage (``AcousticLive``).

The engine's own knobs (weights, device, decode loop, vocoder, segments) are
``engine/config.py``'s, shared with the in-process CLI; everything else a deployment reads is
here, each default once, in a module per feature: ``front`` (API keys, the front guard, the edge
cache, flow), ``ingress``, ``stores`` (cache, voices, lexicons), ``jobs``, ``app`` (``AppArgs``,
``AcousticLive``). The values these classes default to are the shipped ones:
``config/serve.yaml`` sets only what is deployment-specific (resources, replicas, weights
source, device) and a few commented knobs. Light on purpose (pydantic only): ``AppArgs``
validates the whole ``args`` when the app is built, so a typo in the config file is refused at
``serve run``, not inside a replica. Importers take every name from this package.
"""

from __future__ import annotations

from .app import LIVE_ACOUSTIC_FIELDS, AcousticLive, AppArgs, merged
from .front import (
    EDGE_HEADER,
    HOOK_ENV,
    IMPORT_PATH,
    EdgeCacheSettings,
    FlowSettings,
    FrontGuardSettings,
    KeyGrants,
    SecuritySettings,
)
from .ingress import IngressSettings, WebSocketSettings
from .jobs import JobsSettings
from .stores import CacheConfig, LexiconStoreConfig, VoiceStoreConfig
from .units import KiB, MiB

__all__ = [
    "EDGE_HEADER",
    "HOOK_ENV",
    "IMPORT_PATH",
    "LIVE_ACOUSTIC_FIELDS",
    "AcousticLive",
    "AppArgs",
    "CacheConfig",
    "EdgeCacheSettings",
    "FlowSettings",
    "FrontGuardSettings",
    "IngressSettings",
    "JobsSettings",
    "KeyGrants",
    "KiB",
    "LexiconStoreConfig",
    "MiB",
    "SecuritySettings",
    "VoiceStoreConfig",
    "WebSocketSettings",
    "merged",
]
