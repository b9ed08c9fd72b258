"""The Wyoming server process: a TCP (or Unix socket) listener whose connections are
``WyomingHandler``s sharing one ``ServiceClient``, and the optional zeroconf announcement."""

from __future__ import annotations

import asyncio
import logging
import signal
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from .config import WyomingConfig
from .handler import ConnectionGate, WyomingHandler
from .service import ServiceClient

log = logging.getLogger("chattts_serve.wyoming")
# The reader's buffer: an event's header line longer than this is refused (events.read_event).
HEADER_LINE_LIMIT = 64 * 1024


def package_version() -> Optional[str]:
    try:
        return version("chattts-serve")
    except PackageNotFoundError:  # pragma: no cover - run from a tree that is not installed
        return None


class WyomingServer:
    def __init__(self, settings: WyomingConfig):
        self.settings = settings
        self.service = ServiceClient(settings)
        self.gate = ConnectionGate(settings.limits.max_connections, settings.limits.max_connections_per_peer)
        self.version = package_version()
        self._server: Optional[asyncio.AbstractServer] = None
        self._handlers: set[asyncio.Task] = set()
        self._zeroconf = None

    async def start(self) -> list[tuple]:
        """Listen; the addresses bound (a tcp:// port 0 gets one from the OS)."""
        uri = urlparse(self.settings.uri)
        limit = min(HEADER_LINE_LIMIT, self.settings.limits.max_event_bytes)
        if uri.scheme == "tcp":
            self._server = await asyncio.start_server(self._connected, uri.hostname, uri.port, limit=limit)
        elif uri.scheme == "unix":
            Path(uri.path).unlink(missing_ok=True)
            self._server = await asyncio.start_unix_server(self._connected, uri.path, limit=limit)
        else:
            raise ValueError("chattts-serve wyoming listens on tcp:// or unix://")
        addresses = [sock.getsockname() for sock in self._server.sockets]
        log.info("Wyoming server on %s, speaking through %s", addresses, self.settings.base_url)
        if self.settings.zeroconf:
            await self._announce(addresses)
        return addresses

    async def _announce(self, addresses: list) -> None:
        """``_wyoming._tcp`` over mDNS, as Home Assistant discovers Wyoming services."""
        try:
            from wyoming.zeroconf import HomeAssistantZeroconf
        except ImportError:
            raise RuntimeError("--zeroconf needs the zeroconf package: pip install 'chattts-serve[zeroconf]'") from None
        uri = urlparse(self.settings.uri)
        if uri.scheme != "tcp":
            raise RuntimeError("--zeroconf announces a tcp:// server")
        port = addresses[0][1]
        host = uri.hostname if uri.hostname not in ("0.0.0.0", "::", "") else None  # None: the outgoing interface
        self._zeroconf = HomeAssistantZeroconf(port=port, name=self.settings.zeroconf_name, host=host)
        await self._zeroconf.register_server()
        log.info("zeroconf: announced %s on %s:%s", self.settings.zeroconf_name, self._zeroconf.host, port)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = WyomingHandler(reader, writer, self.service, self.settings, self.gate, self.version)
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await handler.run()
        except asyncio.CancelledError:  # stop(): the handler's own cleanup has run
            writer.close()
        except Exception:  # never the server's end: one connection's failure is logged and closed
            log.exception("connection failed")
            writer.close()
        finally:
            self._handlers.discard(task)

    async def serve_forever(self) -> None:
        assert self._server is not None, "start() first"
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._zeroconf is not None:
            await self._zeroconf._aiozc.async_close()
        await self.service.aclose()


async def serve(settings: WyomingConfig) -> None:
    """Run until SIGINT or SIGTERM. ``KeyRefused`` before it listens if the service says the key is
    an admin's (a service that cannot be asked yet is asked again before each synthesis)."""
    server = WyomingServer(settings)
    try:
        await server.service.check_key()
    except BaseException:
        await server.service.aclose()
        raise
    await server.start()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)
    try:
        await server.serve_forever()
    except asyncio.CancelledError:
        log.info("stopping")
    finally:
        await server.stop()
