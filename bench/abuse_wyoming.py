"""The abuse bench's Wyoming floods (``python -m bench abuse --wyoming-floods N``): the app's Wyoming
server (``chattts-serve wyoming``, ``serve_app/wyoming``) started beside it, then one peer holding
many connections that only ping, and another sending an event header nested deeper than the
server parses, within the event size limit.

The server runs as its own process (``python -m bench.abuse_wyoming URI BASE_URL IDLE_S``, this
module's ``main``: the command's settings with a shorter idle timeout, so a phase sees it), with
the attacking key: what reaches the service through it is that key's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .lib.attack import ATTACKER_KEY, Tally
from .lib.procs import ManagedProcess, child_env, free_port

FLOOD_PEER = "127.0.0.1"  # every pinging connection's address: one peer
OTHER_PEER = "127.0.0.2"  # the deep header's (loopback is all of 127/8): not refused for the flood's count
EVENT_LIMIT = 64 * 1024  # WyomingClientConfig.max_event_bytes' default (ingress.max_body_bytes)


def deep_header(depth: int = 20_000) -> bytes:
    """An event header line nested ``depth`` deep in its data, under ``EVENT_LIMIT`` (json.loads
    recurses per level: 20,000 raised RecursionError in a server that parsed it)."""
    line = b'{"type": "describe", "data": {"x": ' + b"[" * depth + b"]" * depth + b"}}\n"
    assert len(line) < EVENT_LIMIT, len(line)
    return line


async def read_event(reader: asyncio.StreamReader) -> Optional[dict[str, Any]]:
    """One Wyoming event, ``{"type", "data"}`` (its data inline or after the header); None at the end."""
    line = await reader.readline()
    if not line:
        return None
    header = json.loads(line)
    data = dict(header.get("data") or {})
    if header.get("data_length"):
        data.update(json.loads(await reader.readexactly(header["data_length"])))
    if header.get("payload_length"):
        await reader.readexactly(header["payload_length"])
    return {"type": header.get("type"), "data": data}


def _send(writer: asyncio.StreamWriter, event_type: str, data: Optional[dict] = None) -> None:
    writer.write(json.dumps({"type": event_type, "data": data or {}}).encode() + b"\n")


def _outcome(event: Optional[dict[str, Any]]) -> str:
    if event is None:
        return "closed without an event"
    if event["type"] == "error":
        return f"error {event['data'].get('code')}"
    return str(event["type"])


async def _connect(port: int, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(peer, 0), limit=2 * EVENT_LIMIT)


async def pinger(port: int, ping_s: float, stop: asyncio.Event, tally: Tally) -> None:
    """One connection of the flood's peer that pings every ``ping_s`` until the server ends it:
    counted by the server's last event (``error idle_timeout`` with the seconds held, or the
    refusal ``error too_many_connections_from_peer`` at once)."""
    t0 = time.perf_counter()
    reader, writer = await _connect(port, FLOOD_PEER)
    pending: Optional[asyncio.Task] = None
    try:
        next_ping = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= next_ping:
                next_ping = time.monotonic() + ping_s
                try:
                    _send(writer, "ping", {"text": "still here"})
                    await writer.drain()
                except ConnectionError:
                    pass  # ended by the server: its last event is still to be read
            pending = pending or asyncio.ensure_future(read_event(reader))
            done, _ = await asyncio.wait({pending}, timeout=max(0.01, next_ping - time.monotonic()))
            if not done:
                continue
            event, pending = pending.result(), None
            if event is None or event["type"] != "pong":
                tally.add(_outcome(event), time.perf_counter() - t0)
                return
        tally.add("held to the phase's end", time.perf_counter() - t0)
    finally:
        if pending is not None:
            pending.cancel()
        writer.close()


async def deep_header_client(port: int, tally: Tally) -> None:
    """From another peer: ``describe`` (the server still answers it during the flood), then, on a
    connection of its own, the deep header (an ``error`` event expected, ``invalid_json``, and
    the connection ended)."""
    for what, line in (("other peer describe", b'{"type": "describe"}\n'), ("deep header", deep_header())):
        reader, writer = await _connect(port, OTHER_PEER)
        try:
            t0 = time.perf_counter()
            writer.write(line)
            await writer.drain()
            event = await asyncio.wait_for(read_event(reader), 30)
            tally.add(f"{what}: {_outcome(event)}", time.perf_counter() - t0)
        finally:
            writer.close()


async def wyoming_floods(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """``--wyoming-floods`` pinging connections of one peer, each reopened as the server ends it,
    and one client of another peer sending the deep header again and again."""
    port = a.wyoming_port
    if not port:
        raise RuntimeError("the Wyoming server was not started (abuse.py starts it when --wyoming-floods > 0)")

    async def again(attempt, pause_s: float) -> None:
        while not stop.is_set():
            try:
                await attempt()
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                tally.add(exc.__class__.__name__)
            if not stop.is_set():
                await asyncio.sleep(pause_s)

    floods = [again(lambda: pinger(port, a.wyoming_ping_s, stop, tally), 0.5) for _ in range(a.wyoming_floods)]
    await asyncio.gather(*floods, again(lambda: deep_header_client(port, tally), 0.5))


# ---------------------------------------------------------------------------------------- the server


def start_server(base_url: str, idle_s: float, log_dir: Path) -> tuple[ManagedProcess, int]:
    """The Wyoming server on a free loopback port, speaking to ``base_url`` with the attacking
    key; returned once it accepts connections."""
    port = free_port()
    env = child_env(CHATTTS_API_KEY=ATTACKER_KEY)
    argv = [sys.executable, "-m", "bench.abuse_wyoming", f"tcp://127.0.0.1:{port}", base_url, str(idle_s)]
    proc = ManagedProcess("wyoming", argv, log_dir / "wyoming.log", env=env)
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        if not proc.alive():
            raise RuntimeError(f"the Wyoming server ended: {proc.log_path.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.stop()
    raise RuntimeError("the Wyoming server did not listen within 60 s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wyoming-idle-s", type=float, default=5.0, help="the bench's Wyoming server's idle_timeout_s")
    p.add_argument("--wyoming-ping-s", type=float, default=1.0, help="how often each flood connection pings")


def main(argv: list[str]) -> None:
    """The server: ``chattts-serve wyoming``'s settings (CHATTTS_API_KEY from the environment), at
    ``URI``, in front of ``BASE_URL``, idle connections closed after ``IDLE_S``."""
    import logging

    from serve_app.wyoming import WyomingConfig, serve

    uri, base_url, idle_s = argv
    logging.basicConfig(level=logging.INFO)
    settings = WyomingConfig.from_env(uri=uri, base_url=base_url, idle_timeout_s=float(idle_s))
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
