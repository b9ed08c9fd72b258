"""The lexicon store (memory, directory, redis), a create request's bounds, resolving a request's
``lexicon`` for its owner, and the cache key's lexicon; no Ray. Redis runs a real ``redis-server``
(skipped without one)."""

from __future__ import annotations

import pytest
from support.redis_server import needs_redis  # noqa: F401 - the marker's module registers redis_server

from serve_app.engine.text.lexicon import LexiconEntry, Pronunciations
from serve_app.engine.voices import VoiceResolver
from serve_app.errors import APIError
from serve_app.protocol import SpeechRequest
from serve_app.settings import LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.cache import request_key
from serve_app.storage.lexicons import LexiconBook, check_syllables, make_lexicon_store, parse_create

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


def made(cfg, owner: str, default: bool = False, entries=ENTRIES, name: str = "words"):
    return parse_create({"name": name, "entries": entries, "default": default}, cfg, owner)


async def test_owned_bounded_and_the_default(cfg):
    store = make_lexicon_store(cfg)
    book = LexiconBook(store)
    a = await store.create(made(cfg, "key-a", default=True))
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
    b = await store.create(made(cfg, "key-a", default=True, entries=ENTRIES[1:]))  # the newest default wins
    assert [(x.id, x.default) for x in await store.list("key-a")] == [(a.id, False), (b.id, True)]
    with pytest.raises(APIError) as e:
        await store.create(made(cfg, "key-a"))
    assert status_of(e) == (409, "lexicon_quota_exceeded")
    await store.create(made(cfg, "key-b"))
    with pytest.raises(APIError) as e:
        await store.create(made(cfg, "key-c"))
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
