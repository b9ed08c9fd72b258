"""One rule for every surface, checked here rather than by review: each HTTP route of the Ingress
app (``deployments.ingress.ingress_app``), each WebSocket message type (``protocol.CLIENT_MESSAGES``)
and each Wyoming event the server acts on (``wyoming.handler.EVENTS``) has

(a) a body limit: the guard middleware's global or per-route one, or the reader's message or
    event limit, the one docs/operations.md names, and a request past it refused before any byte
    of it is read;
(b) an auth decision: public (``PUBLIC_PATHS`` / ``PUBLIC_PREFIXES``) or keyless (``KEYLESS_GETS``)
    with a reason, else a key, checked from the headers (401 before the app is reached);
(c) a row in docs/operations.md's "Every route and message, and what bounds it" saying so, and
    no row for a surface that is gone.

A route added later (another vendor's door, a new feature) fails here until it is documented and
decided. A route whose body may be larger than ``ingress.max_body_bytes`` names the test that
holds its work off the event loop; one of them, the voices upload's, is here. No Ray.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional

import httpx
import pytest
from fastapi.routing import _IncludedRouter
from starlette.requests import Request
from starlette.routing import BaseRoute, WebSocketRoute
from support.loop import STALL_LIMIT_S, Watched

from deployments.ingress import ingress_app
from serve_app.errors import APIError
from serve_app.http.middleware import KEYLESS_GETS, PUBLIC_PATHS, PUBLIC_PREFIXES, HttpPolicy, install_policy
from serve_app.http.security import APIKeyAuth, Caller
from serve_app.http.state import http_policy, route_body_limits
from serve_app.http.voices import VOICES_PATH, VoicesAPI
from serve_app.protocol import CLIENT_MESSAGES
from serve_app.realtime.graph import session_limits
from serve_app.realtime.messages import parse_message
from serve_app.settings import AppConfig, SecurityConfig, VoiceStoreConfig
from serve_app.wyoming import WyomingConfig
from serve_app.wyoming.events import read_event
from serve_app.wyoming.handler import EVENTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "operations.md"
SECTION = "### Every route and message, and what bounds it"
KEY = "rules-test-key"
CONFIG = AppConfig()
WS = "WS"


# ------------------------------------------------------------------ what the app has


def _flat(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes: FastAPI 0.165 keeps an included router as one ``_IncludedRouter`` entry."""
    for route in routes:
        if isinstance(route, _IncludedRouter):
            yield from _flat(route.original_router.routes)
        else:
            yield route


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route; a ``HEAD`` is its ``GET``'s, a WebSocket's method is ``WS``."""
    found = set()
    for route in _flat(ingress_app().router.routes):
        if isinstance(route, WebSocketRoute) or type(route).__name__ == "APIWebSocketRoute":
            found.add((WS, route.path))
            continue
        methods = set(route.methods or ())
        if "GET" in methods:
            methods.discard("HEAD")
        found |= {(m, route.path) for m in methods}
    return found


def concrete(path: str) -> str:
    """A path a request can take: each parameter filled with a value of its shape."""
    values = {"job_id": "job_" + "0" * 24, "chapter": "0", "name:path": "index.html"}
    return re.sub(r"\{([^}]+)\}", lambda m: values.get(m.group(1), "x" + m.group(1)), path)


# ------------------------------------------------------------------ what the docs say


class Row:
    def __init__(self, surface: str, key: str, body: str, work: str):
        self.surface, self.key, self.body, self.work = surface, key, body, work

    @property
    def limit_setting(self) -> str:
        found = re.match(r"`([\w.]+)`", self.body)
        assert found, f"{self.surface}: its body column names no setting: {self.body!r}"
        return found.group(1)


def docs_rows() -> dict[tuple[str, str], Row]:
    """The table's rows by surface: (method, path), ("message", type), ("event", type)."""
    text = DOCS.read_text()
    assert SECTION in text, f"docs/operations.md has no {SECTION!r}"
    lines = text.split(SECTION, 1)[1].splitlines()
    table = [ln for ln in lines[lines.index(next(ln for ln in lines if ln.startswith("| route"))) :]]
    rows: dict[tuple[str, str], Row] = {}
    for line in table[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, line
        surface = cells[0]
        if m := re.fullmatch(r"`(GET|POST|PUT|PATCH|DELETE|WS) (/\S*)`", surface):
            name = (m.group(1), m.group(2))
        elif m := re.fullmatch(r"WebSocket `([\w.]+)`", surface):
            name = ("message", m.group(1))
        elif m := re.fullmatch(r"Wyoming `([\w-]+)`", surface):
            name = ("event", m.group(1))
        elif surface == "Wyoming any other event":
            name = ("event", "*")
        else:
            raise AssertionError(f"a row names no route, message or event: {surface!r}")
        assert name not in rows, f"two rows for {surface}"
        rows[name] = Row(surface, *cells[1:])
    return rows


def setting(name: str) -> int:
    """A setting named as the docs name it: ``ingress.max_body_bytes``, ``wyoming.limits.max_event_bytes``."""
    head, *rest = name.split(".")
    obj: Any = WyomingConfig() if head == "wyoming" else getattr(CONFIG, head)
    for part in rest:
        obj = getattr(obj, part)
    assert isinstance(obj, int), (name, obj)
    return obj


ROWS = docs_rows()
ROUTES = sorted(app_routes())


def test_every_surface_has_a_row_and_every_row_a_surface():
    surfaces = set(ROUTES) | {("message", t) for t in CLIENT_MESSAGES} | {("event", t) for t in EVENTS}
    missing = sorted(surfaces - set(ROWS))
    assert not missing, f"undocumented in docs/operations.md ({SECTION}): {missing}"
    stale = sorted(set(ROWS) - surfaces - {("event", "*")})
    assert not stale, f"rows of docs/operations.md for routes or messages that are gone: {stale}"


def test_every_row_says_how_its_work_is_bounded_and_its_cited_tests_exist():
    for row in ROWS.values():
        assert row.work and row.work != "-", f"{row.surface}: how is its work bounded?"
        for path, name in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.work):
            assert f"def {name}(" in (ROOT / path).read_text(), f"{row.surface} cites {path}::{name}, not there"


# ------------------------------------------------------------------ (b) who may call


def _is_keyless(method: str, path: str) -> bool:
    return method == "GET" and path in KEYLESS_GETS


def test_public_and_keyless_paths_are_real_routes_with_a_reason():
    paths = {p for _, p in ROUTES}
    for table in (PUBLIC_PATHS, PUBLIC_PREFIXES, KEYLESS_GETS):
        for path, reason in table.items():
            assert len(reason) > 10, f"{path}: no reason to be open"
    assert set(PUBLIC_PATHS) <= paths, set(PUBLIC_PATHS) - paths
    assert set(KEYLESS_GETS) <= {p for m, p in ROUTES if m == "GET"}
    for prefix in PUBLIC_PREFIXES:
        assert any(p.startswith(prefix) for p in paths), prefix


@pytest.mark.parametrize("method, path", ROUTES)
def test_the_docs_key_decision_is_the_middlewares(method: str, path: str):
    row = ROWS[(method, path)]
    public = HttpPolicy.is_public(path)
    if public:
        expected = "public"
    elif _is_keyless(method, path):
        expected = "keyless GET"
    else:
        expected = "key"
    assert row.key.split(" (")[0] == expected, (row.surface, row.key, expected)


@pytest.fixture
def app(monkeypatch):
    """The Ingress's app with keys on and the policy the Ingress installs (``http_policy``)."""
    monkeypatch.setenv("RULES_TEST_KEYS", KEY)
    auth = APIKeyAuth(SecurityConfig(api_keys_env="RULES_TEST_KEYS"))
    assert auth.enabled
    app = ingress_app()
    install_policy(app, http_policy(CONFIG, CONFIG.ingress, auth))
    return app


async def _call(app, method: str, path: str, headers: dict[str, str]) -> tuple[Optional[int], bool, Optional[dict]]:
    """(status, whether the app asked for any body byte, the JSON answer) of one request whose
    body never comes; (None, ...) when the request got past the guard and is waiting for its body."""
    scope = {
        "type": "websocket" if method == WS else "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET" if method == WS else method,
        "scheme": "ws" if method == WS else "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("10.0.0.7", 5000),
        "server": ("testserver", 80),
    }
    asked = False
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal asked
        asked = True  # a handshake's connect, or a body: either is the app past the guard
        return await _never()

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        await asyncio.wait_for(app(scope, receive, send), 0.5)
    except asyncio.TimeoutError:
        return None, asked, None
    if method == WS:
        close = next((m for m in sent if m["type"] == "websocket.close"), None)
        return (close["code"] if close else None), asked, None
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], asked, json.loads(body) if body else None


async def _never() -> dict:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("method, path", [r for r in ROUTES if not HttpPolicy.is_public(r[1])])
async def test_a_keyed_route_answers_401_from_the_headers(app, method: str, path: str):
    url = concrete(path)
    for headers in ({}, {"Authorization": "Bearer not-a-key"}):
        if method == WS and not headers:
            continue  # a handshake without the header: session.start's api_key is checked (test_realtime.py)
        if _is_keyless(method, path) and not headers:
            continue  # answered without a caller: what needs no key
        status, asked, body = await _call(app, method, url, headers)
        if method == WS:
            assert status == 4401 and not asked, (path, status)
        else:
            assert status == 401 and not asked and body["error"]["code"] == "invalid_api_key", (path, status, body)


# ------------------------------------------------------------------ (a) what a body may be


@pytest.mark.parametrize("method, path", [r for r in ROUTES if r[0] != WS])
async def test_a_body_past_the_documented_limit_is_413_unread(app, method: str, path: str):
    row = ROWS[(method, path)]
    limit = setting(row.limit_setting)
    policy: HttpPolicy = app.state.policy
    applied = policy.limit_for(method, concrete(path))
    assert applied == limit, (row.surface, row.limit_setting, applied)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Length": str(limit + 1), "Content-Type": "application/json"}
    status, asked, body = await _call(app, method, concrete(path), headers)
    assert status == 413 and not asked and body["error"]["code"] == "body_too_large", (row.surface, status, body)


def test_per_route_limits_are_routes_that_take_a_body():
    assert set(route_body_limits(CONFIG)) <= {r for r in ROUTES if r[0] in ("POST", "PUT", "PATCH")}


def test_the_websocket_route_and_its_messages_have_the_session_limit():
    limits = session_limits(CONFIG.ingress)
    assert setting(ROWS[(WS, "/v1/audio/speech/stream")].limit_setting) == limits.max_message_bytes


@pytest.mark.parametrize("kind", list(CLIENT_MESSAGES))
def test_each_websocket_message_past_its_limit_is_413_before_it_is_parsed(kind: str):
    limits = session_limits(CONFIG.ingress)
    assert setting(ROWS[("message", kind)].limit_setting) == limits.max_message_bytes
    text = json.dumps({"type": kind, "pad": "x" * limits.max_message_bytes})
    with pytest.raises(APIError) as refused:
        parse_message({"type": "websocket.receive", "text": text}, limits)
    assert (refused.value.status, refused.value.code) == (413, "message_too_large")
    # Nested past the API's depth: refused before any parser recurses, whatever the type.
    deep = '{"type": "' + kind + '", "x": ' + "[" * 100 + "]" * 100 + "}"
    with pytest.raises(APIError) as refused:
        parse_message({"type": "websocket.receive", "text": deep}, limits)
    assert refused.value.code == "invalid_json"


@pytest.mark.parametrize("kind", [*EVENTS, "not-for-tts"])
async def test_each_wyoming_event_past_its_limit_is_413_before_its_data_is_read(kind: str):
    limit = WyomingConfig().limits.max_event_bytes
    assert setting(ROWS[("event", kind if kind in EVENTS else "*")].limit_setting) == limit
    reader = asyncio.StreamReader()
    reader.feed_data(json.dumps({"type": kind, "data_length": limit}).encode() + b"\n")
    with pytest.raises(APIError) as refused:
        await asyncio.wait_for(read_event(reader, limit), 1)  # its data never comes: never waited for
    assert (refused.value.status, refused.value.code) == (413, "request_too_large")


# ------------------------------------------------------------------ work off the loop


class _Encoder:
    """The Vocoder stage's clip encoder as the voices API calls it (a remote call's shape)."""

    class encode_clip:  # noqa: N801
        @staticmethod
        async def remote(data: bytes, min_s: float, max_s: float) -> Any:
            return SimpleNamespace(spk_smp="codes", seconds=3.0)


async def test_the_largest_voice_upload_never_holds_the_loop():
    """A clip at ``voices.max_upload_bytes`` in the pieces a server hands the app (64 KiB): the
    form is parsed a piece at a time and its file part spooled, so the loop never stalls for
    long whatever the upload's size."""
    limit = CONFIG.voices.max_upload_bytes
    built = httpx.Request(
        "POST",
        "http://x" + VOICES_PATH,
        data={"name": "big", "transcript": "words"},
        files={"audio": ("clip.wav", b"RIFF" + b"\1" * (limit - 600), "audio/wav")},
    )
    body = built.read()
    assert limit - 1024 < len(body) <= limit
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]

    async def receive() -> dict:
        if pieces:
            piece = pieces.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(pieces)}
        return await _never()

    headers = [(k.lower().encode(), v.encode()) for k, v in built.headers.items()]
    request = Request({"type": "http", "method": "POST", "path": VOICES_PATH, "headers": headers}, receive)
    api = VoicesAPI(VoiceStoreConfig(backend="memory"), _Encoder())
    owner = Caller(id="k", owner="k", max_priority=0, max_streams=0, max_voices=None)
    async with Watched() as watch:
        voice = await api.create(request, owner)
    assert voice["name"] == "big"
    assert watch.longest < STALL_LIMIT_S, watch.longest
