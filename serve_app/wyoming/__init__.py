"""A Wyoming protocol server (Home Assistant's voice services) in front of the service:
``chattts-serve wyoming``. A small asyncio process beside the service that speaks to it over its
public API only (HTTP for one text, the WebSocket for text that arrives in pieces), so it needs
neither Ray nor torch.

- ``config.py``: its settings and limits; ``events.py``: Wyoming events to and from the service's
  terms; ``service.py``: the service's API and its errors; ``handler.py``: one client connection;
  ``server.py``: the listener and the zeroconf announcement.
"""

from .config import WyomingClientConfig, WyomingConfig
from .server import WyomingServer, serve
from .service import KeyRefused

__all__ = ["KeyRefused", "WyomingClientConfig", "WyomingServer", "WyomingConfig", "serve"]
