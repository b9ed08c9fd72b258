"""The lexicon store (memory, directory, redis), a create request's bounds, resolving a request's
``lexicon`` for its owner, and the cache key's lexicon; no Ray. Redis runs a real ``redis-server``
(skipped without one)."""

from __future__ import annotations

import json
import threading

import pytest
from starlette.requests import Request
from support.redis_server import needs_redis  # noqa: F401 - the marker's module registers redis_server

import serve_app.engine.text.lexicon as lexicon_text
import serve_app.http.lexicons as lexicons_http
from serve_app.callers import Caller
from serve_app.engine.planner import Planner
from serve_app.engine.text import pinyin
from serve_app.engine.text.lexicon import LexiconEntry, Pronunciations
from serve_app.engine.voices import VoiceResolver
from serve_app.errors import APIError
from serve_app.http.bodies import read_bounded
from serve_app.http.lexicons import LexiconsAPI
from serve_app.protocol import SpeechRequest
from serve_app.settings import LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.cache import request_key
from serve_app.storage.lexicons import LexiconBook, check_syllables, make_lexicon_store, parse_create
from serve_app.storage.lexicons.model import summary_of
from serve_app.storage.records import ANONYMOUS, owner_tag

ENTRIES = [{"text": "银行", "pinyin": "yin2 hang2"}, {"text": "SQL", "alias": "sequel"}]


@pytest.fixture(params=["memory", "directory", "redis"])
def cfg(request, tmp_path) -> LexiconStoreConfig:
    bounds = dict(max_lexicons=3, max_lexicons_per_key=2, max_entries=4, max_entry_chars=8, max_alias_chars=16)
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
        return LexiconStoreConfig(backend="redis", redis_url=url, **bounds)
    return LexiconStoreConfig(backend=request.param, path=str(tmp_path / "lexicons"), **bounds)


def status_of(exc_info) -> tuple[int, str]:
    return exc_info.value.status, exc_info.value.code


def made_by(cfg, owner: str, default: bool = False, entries=ENTRIES, name: str = "words"):
    return parse_create({"name": name, "entries": entries, "default": default}, cfg, owner)


async def test_owned_bounded_and_the_default(cfg):
    store = make_lexicon_store(cfg)
    book = LexiconBook(store)
    a = await store.create(made_by(cfg, "key-a", default=True))
    assert await store.get(a.id, "key-b") is None  # another key's reads as missing
    assert await store.delete(a.id, "key-b") is False
    assert (await store.get(a.id, "key-b", admin=True)).id == a.id
    with pytest.raises(APIError) as e:
        await book.pronunciations(a.id, "key-b")
    assert status_of(e) == (400, "lexicon_not_found")
    with pytest.raises(APIError) as missing:
        await book.pronunciations("lex_" + "0" * 24, "key-b")
    assert str(missing.value).replace("0" * 24, "ID") == str(e.value).replace(a.id[4:], "ID")  # the same answer
    # The default applies when a request names none; "none" turns it off.
    assert (await book.pronunciations(None, "key-a")).entries == a.entries
    assert await book.pronunciations("none", "key-a") is None
    assert await book.pronunciations(None, "key-b") is None
    b = await store.create(made_by(cfg, "key-a", default=True, entries=ENTRIES[1:]))  # the newest default wins
    assert [(x.id, x.default) for x in await store.list("key-a")] == [(a.id, False), (b.id, True)]
    with pytest.raises(APIError) as e:
        await store.create(made_by(cfg, "key-a"))
    assert status_of(e) == (409, "lexicon_quota_exceeded")
    await store.create(made_by(cfg, "key-b"))
    with pytest.raises(APIError) as e:
        await store.create(made_by(cfg, "key-c"))
    assert status_of(e) == (409, "too_many_lexicons")
    assert await store.delete(b.id, "key-a") is True
    assert await book.pronunciations(None, "key-a") is None  # its default went with it
    assert [x.id for x in await store.list("key-a")] == [a.id]
    await store.close()


def test_create_bounds():
    cfg = LexiconStoreConfig(max_entries=2, max_entry_chars=4, max_alias_chars=10)

    def refused(body) -> tuple[int, str, str]:
        with pytest.raises(APIError) as e:
            check_syllables(parse_create(body, cfg, "k"))
        return e.value.status, e.value.code, e.value.param

    ok = {"name": "n", "entries": ENTRIES}
    assert parse_create(ok, cfg, "k").entries[0].pinyin == "yin2 hang2"
    assert refused({**ok, "entries": ENTRIES * 2}) == (413, "lexicon_too_large", "entries")
    assert refused({**ok, "entries": [{"text": "12345", "alias": "x"}]}) == (400, "invalid_lexicon", "entries.0")
    assert refused({**ok, "entries": [{"text": "x", "alias": "12345678901"}]}) == (400, "invalid_lexicon", "entries.0")
    assert refused({**ok, "entries": [{"text": "行", "pinyin": "xang2"}]}) == (400, "invalid_lexicon", "entries.0")
    assert refused({**ok, "entries": [{"text": "x", "alias": "y"}, {"text": "X", "alias": "z"}]})[2] == "entries.1"
    assert refused({**ok, "extra": 1})[1] == "invalid_lexicon"
    assert refused({"entries": ENTRIES})[2] == "name"
    assert refused([1])[1] == "invalid_lexicon"


def test_the_cache_key_takes_the_lexicons_content():
    req = SpeechRequest(input="我去银行。", lexicon="lex_" + "a" * 24)
    voice = VoiceResolver().resolve("alloy")

    def key(entries) -> str:
        opts = req.to_options()
        if entries is not None:
            opts = opts.model_copy(update={"pronunciations": Pronunciations(entries=entries)})
        return request_key(req, voice, weights_id="w", options=opts)

    hang = (LexiconEntry(text="银行", pinyin="yin2 hang2"),)
    xing = (LexiconEntry(text="银行", pinyin="yin2 xing2"),)
    assert key(hang) == key(hang) and len({key(None), key(hang), key(xing)}) == 3
    # The id is not keyed: the same entries under another id (a lexicon made again) share audio.
    other = SpeechRequest(input="我去银行。", lexicon="lex_" + "b" * 24)
    opts = other.to_options().model_copy(update={"pronunciations": Pronunciations(entries=hang)})
    assert request_key(other, voice, weights_id="w", options=opts) == key(hang)


def test_the_store_follows_the_voices_unless_told():
    voices = VoiceStoreConfig(backend="redis", redis_url="redis://h:1/0", path="/srv/voices")
    got = LexiconStoreConfig().resolved(voices)
    assert (got.backend, got.redis_url, got.path) == ("redis", "redis://h:1/0", "/srv/voices/lexicons")
    assert LexiconStoreConfig(backend="memory").resolved(voices).backend == "memory"


# ------------------------------------------------------------------ what a listing and a request cost

PINYIN = [{"text": c + "行", "pinyin": "yin2 hang2"} for c in "银商同"]


def caller(owner: str, admin: bool = False) -> Caller:
    return Caller(id=owner, owner=owner, max_priority=0, max_streams=0, max_voices=None, admin=admin)


def request_of(body: bytes, pieces: int = 1) -> Request:
    """A POST whose body arrives in ``pieces`` messages, as Starlette hands it to a route."""
    size = max(1, -(-len(body) // pieces))
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/audio/lexicons", "headers": [], "query_string": b""}
    return Request(scope, receive)


class Parses:
    """Every pinyin entry validated (``LexiconEntry``'s check of its syllables), and on which thread."""

    def __init__(self, monkeypatch):
        self.threads: list[str] = []
        original = lexicon_text.parse_pinyin

        def counting(*args, **kwargs):
            self.threads.append(threading.current_thread().name)
            return original(*args, **kwargs)

        monkeypatch.setattr(lexicon_text, "parse_pinyin", counting)

    def on_the_loop(self) -> int:
        return self.threads.count(threading.main_thread().name)


async def test_a_listing_validates_no_entry_and_a_request_none_on_the_loop(cfg, monkeypatch):
    """Listing 20 lexicons of 500 pinyin entries was ~200 ms of the Ingress's loop (every document
    validated and hashed again per GET), and a speech request of a key with such a default lexicon
    ~11 ms. The listing reads the summaries stored at create; a request's lexicon is parsed off
    the loop, once while it is unchanged."""
    cfg = cfg.model_copy(update={"max_entries": 8, "max_lexicons": 10})
    api = LexiconsAPI(cfg)
    made = [
        await api.store.create(parse_create({"name": f"n{i}", "entries": PINYIN, "default": i == 1}, cfg, "key-a"))
        for i in range(2)
    ]
    fresh = LexiconsAPI(cfg) if cfg.backend != "memory" else api  # another replica: nothing parsed yet
    fresh.store.parsed.forget()
    parses = Parses(monkeypatch)
    listed = json.loads((await fresh.list(caller("key-a"))).body)["data"]
    assert parses.threads == [], "a listing validated entries"
    assert [(x["id"], x["entry_count"], x["default"]) for x in listed] == [
        (made[0].id, 3, False),
        (made[1].id, 3, True),
    ]
    assert [x["content_hash"] for x in listed] == [m.pronunciations().content_hash for m in made]
    assert listed == [m.model_copy(update={"default": m is made[1]}).summary() for m in made]
    book = fresh.book
    for _ in range(3):
        assert (await book.pronunciations(None, "key-a")).entries == made[1].entries
        assert (await book.pronunciations(made[0].id, "key-a")).entries == made[0].entries
    assert parses.on_the_loop() == 0 and len(parses.threads) == 2 * len(PINYIN), parses.threads  # each parsed once
    await api.store.close()
    await fresh.store.close()


async def test_a_requests_default_lexicon_reads_the_index_once(tmp_path, monkeypatch):
    cfg = LexiconStoreConfig(backend="directory", path=str(tmp_path / "lexicons"))
    store = make_lexicon_store(cfg)
    made = await store.create(made_by(cfg, "key-a", default=True))
    reads: list[int] = []
    original = type(store)._read_index
    monkeypatch.setattr(type(store), "_read_index", lambda self: reads.append(1) or original(self))
    assert (await LexiconBook(store).pronunciations(None, "key-a")).entries == made.entries
    assert len(reads) == 1
    await store.close()


async def test_a_create_past_the_quota_is_refused_before_its_body_is_read(cfg, monkeypatch):
    api = LexiconsAPI(cfg)
    for i in range(cfg.max_lexicons_per_key):
        await api.store.create(made_by(cfg, "key-a", name=f"n{i}"))
    read: list[str] = []
    monkeypatch.setattr(lexicons_http, "parse_create", lambda *a: read.append("parsed"))
    big = json.dumps({"name": "x", "entries": [{"text": "x", "alias": "y" * 9}] * 2000}).encode()
    with pytest.raises(APIError) as e:
        await api.create(request_of(big, pieces=64), caller("key-a"))
    assert status_of(e) == (409, "lexicon_quota_exceeded") and read == []
    await api.store.close()


async def test_a_body_is_read_in_linear_time_and_cut_at_its_limit():
    """Pieces kept and joined once (``raw += piece`` copied the whole body at every piece)."""
    body = b"x" * 300_000
    assert await read_bounded(request_of(body, pieces=30_000), len(body), lambda: APIError(413, "big")) == body
    with pytest.raises(APIError) as e:
        await read_bounded(request_of(body, pieces=30_000), len(body) - 1, lambda: APIError(413, "big"))
    assert e.value.status == 413


def test_pypinyins_table_is_built_at_the_start_not_in_a_request(monkeypatch, tmp_path):
    """The Ingress's lexicons API and the TextNormalizer's warm-up build it (~0.5 s) before any
    request needs it."""
    monkeypatch.setattr(pinyin, "_table", None)
    LexiconsAPI(LexiconStoreConfig(backend="memory")).warming.result(timeout=60)
    assert pinyin._table is not None
    monkeypatch.setattr(pinyin, "_table", None)
    Planner().warmup()
    assert pinyin._table is not None


async def test_without_keys_no_caller_sets_everyones_default(tmp_path):
    """Without API keys every caller is ``anonymous``: a default lexicon would change everyone's
    speech. ``default: true`` needs a key; one stored before is not applied."""
    cfg = LexiconStoreConfig(backend="directory", path=str(tmp_path / "lexicons"))
    with pytest.raises(APIError) as e:
        made_by(cfg, ANONYMOUS, default=True)
    assert (*status_of(e), e.value.param) == (400, "invalid_lexicon", "default")
    store = make_lexicon_store(cfg)
    named = await store.create(made_by(cfg, ANONYMOUS))  # a lexicon named in each request: fine
    assert (await LexiconBook(store).pronunciations(named.id, ANONYMOUS)).entries == named.entries
    # One made default before this rule, as the directory keeps it: listed, never applied.
    index = json.loads((tmp_path / "lexicons" / "index.json").read_text())
    index["defaults"] = {owner_tag(ANONYMOUS): named.id}
    (tmp_path / "lexicons" / "index.json").write_text(json.dumps(index))
    assert await LexiconBook(store).pronunciations(None, ANONYMOUS) is None
    assert [x.default for x in await store.list(ANONYMOUS)] == [False]
    await store.close()


def test_a_summary_is_read_from_the_documents_head():
    """The fields a listing shows are written before the entries: only they are parsed, whatever
    the name holds; a document stored before them is parsed whole."""
    cfg = LexiconStoreConfig()
    tricky = parse_create({"name": 'x,"entries":[1]}', "entries": ENTRIES}, cfg, "key-a")
    doc = tricky.to_json()
    assert summary_of(tricky.id, doc) == summary_of(tricky.id, doc.encode()) == tricky.summary()
    old = json.loads(doc)
    del old["entry_count"], old["content_hash"]
    assert summary_of(tricky.id, json.dumps(old)) == tricky.summary()
