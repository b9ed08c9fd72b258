"""Voices owned by keys, without Ray: the store (memory, directory, redis), the catalog a speech
request resolves through, and the voices API (``VoicesAPI``) with a stub in place of the Vocoder
stage, so a test can tell whether anything was ever encoded.

Redis tests run a real ``redis-server`` (the cache tests' ``RedisServer``); the directory tests
use real files and, for the file lock, real processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from starlette.requests import Request
from support.configs import REPO
from support.redis_server import RedisServer, needs_redis
from support.speakers import encode_speaker

from bench.lib.procs import free_port
from serve_app.engine.errors import UnknownVoiceError
from serve_app.errors import APIError
from serve_app.http.security import Caller
from serve_app.http.voices import VOICES_PATH, VoicesAPI
from serve_app.protocol import VoiceList
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import (
    ANONYMOUS,
    StoredVoice,
    VoiceCatalog,
    index_key,
    make_voice_store,
    name_key,
    stored_voice,
)

SPEAKER = encode_speaker(np.linspace(-1, 1, 768, dtype=np.float32))
ALICE, BOB, ROOT = "a1a1a1a1a1a1", "b0b0b0b0b0b0", "r00t00r00t00"  # key ids (fingerprints)


def caller(owner: str, admin: bool = False, max_voices: int | None = None) -> Caller:
    return Caller(id=owner, owner=owner, max_priority=0, max_streams=0, max_voices=max_voices, admin=admin)


@pytest.fixture(params=["memory", "directory", "redis"])
def cfg(request, tmp_path) -> VoiceStoreConfig:
    """A store config of each backend (the per-key quota 3, the store's 6)."""
    limits = {"max_voices": 6, "max_voices_per_key": 3}
    if request.param == "redis":  # a real Redis (the test is skipped without redis-server)
        return VoiceStoreConfig(backend="redis", redis_url=request.getfixturevalue("redis_server").url, **limits)
    return VoiceStoreConfig(backend=request.param, path=str(tmp_path / "voices"), **limits)


def code_of(exc_info) -> tuple[int, str]:
    return exc_info.value.status, exc_info.value.code


# ------------------------------------------------------------------ the store


async def test_each_key_sees_only_its_own_voices(cfg):
    store = make_voice_store(cfg)
    a = await store.create(stored_voice("Narrator", "seed", owner=ALICE, seed=1, speaker=SPEAKER))
    b = await store.create(stored_voice("narrator", "seed", owner=BOB, seed=2, speaker=SPEAKER))  # same name: no clash
    assert (a.owner, b.owner) == (ALICE, BOB)
    assert await store.get(a.id, ALICE) == a and await store.get(b.id, BOB) == b
    assert await store.get(b.id, ALICE) is None and await store.get(a.id, BOB) is None
    assert await store.get(a.id) is None  # the anonymous owner is an owner like any other
    assert (await store.get_by_name("NARRATOR", ALICE)).id == a.id
    assert (await store.get_by_name("narrator", BOB)).id == b.id
    assert await store.get_by_name("narrator", "c0c0c0c0c0c0") is None
    assert [v.id for v in await store.list(ALICE)] == [a.id] and [v.id for v in await store.list(BOB)] == [b.id]
    assert await store.list() == []
    # Deleting another key's voice fails as deleting a missing one does, and leaves it there.
    assert await store.delete(b.id, ALICE) is False
    assert await store.get(b.id, BOB) == b
    assert await store.delete(b.id, BOB) is True and await store.get(b.id, BOB) is None
    assert await store.get(a.id, ALICE) == a
    await store.close()


async def test_an_admin_sees_uses_and_deletes_every_voice(cfg):
    store = make_voice_store(cfg)
    a = await store.create(stored_voice("shared", "seed", owner=ALICE, seed=1))
    b = await store.create(stored_voice("shared", "seed", owner=BOB, seed=2))
    only_bob = await store.create(stored_voice("bobs", "seed", owner=BOB, seed=3))
    assert {v.id for v in await store.list(ROOT, admin=True)} == {a.id, b.id, only_bob.id}
    assert await store.list(ROOT) == []  # without the flag, an admin's key is a key like any other
    assert await store.get(b.id, ROOT, admin=True) == b
    assert await store.get_by_name("BOBS", ROOT, admin=True) == only_bob
    # By name, several owners' voices: the oldest; the admin's own first when it has one.
    assert (await store.get_by_name("shared", ROOT, admin=True)).id in {a.id, b.id}
    mine = await store.create(stored_voice("shared", "seed", owner=ROOT, seed=4))
    assert await store.get_by_name("shared", ROOT, admin=True) == mine
    assert await store.delete(only_bob.id, ROOT, admin=True) is True
    assert await store.get(only_bob.id, BOB) is None and await store.get_by_name("bobs", BOB) is None
    assert {v.id for v in await store.list(BOB)} == {b.id}
    await store.close()


async def test_names_are_unique_per_owner_and_free_again_after_a_delete(cfg):
    store = make_voice_store(cfg)
    first = await store.create(stored_voice("me", "seed", owner=ALICE, seed=1))
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("ME", "seed", owner=ALICE, seed=2))
    assert code_of(e) == (409, "voice_exists")
    await store.create(stored_voice("Me", "seed", owner=BOB, seed=2))  # another key: no squatting either way
    await store.create(stored_voice("me", "seed", seed=3))  # anonymous
    assert await store.delete(first.id, ALICE)
    again = await store.create(stored_voice("me", "seed", owner=ALICE, seed=4))
    assert (await store.get_by_name("me", ALICE)) == again
    assert sorted(v.seed for v in await store.list(ROOT, admin=True)) == [2, 3, 4]
    await store.close()


async def test_per_key_quota_then_the_store_limit(cfg):
    store = make_voice_store(cfg)  # 3 per key, 6 in all
    for i in range(3):
        await store.create(stored_voice(f"a{i}", "seed", owner=ALICE, seed=i))
    with pytest.raises(APIError) as e:
        await store.check_room(ALICE)
    assert code_of(e) == (409, "voice_quota_exceeded") and "(3)" in e.value.message
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("a3", "seed", owner=ALICE, seed=3))
    assert code_of(e) == (409, "voice_quota_exceeded")
    await store.check_room(BOB)  # another key's quota is its own
    # A key's grant (Caller.max_voices) overrides the default, up to the store's limit.
    await store.create(stored_voice("a3", "seed", owner=ALICE, seed=3), max_owned=4)
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("a4", "seed", owner=ALICE, seed=4), max_owned=4)
    assert code_of(e) == (409, "voice_quota_exceeded")
    await store.create(stored_voice("b0", "seed", owner=BOB, seed=5))
    await store.create(stored_voice("b1", "seed", owner=BOB, seed=6))  # 6: the store is full
    for check in (store.check_room(BOB), store.create(stored_voice("b2", "seed", owner=BOB, seed=7))):
        with pytest.raises(APIError) as e:
            await check
        assert code_of(e) == (409, "too_many_voices")
    # A grant of 0: this key may own none.
    with pytest.raises(APIError) as e:
        await store.check_room("c0c0c0c0c0c0", 0)
    assert code_of(e) == (409, "voice_quota_exceeded")
    # Deleting frees the owner's room (and the store's).
    victim = (await store.list(ALICE))[0]
    assert await store.delete(victim.id, ALICE)
    await store.create(stored_voice("again", "seed", owner=ALICE, seed=8), max_owned=4)
    assert len(await store.list(ALICE)) == 4 and len(await store.list(ROOT, admin=True)) == 6
    await store.close()


async def test_concurrent_creates_cannot_pass_the_quota(cfg):
    """Many creates at once (redis: each over its own connection, the directory: on worker
    threads): the quota holds, and the owner's count, listing and names agree."""
    stores = [make_voice_store(cfg) for _ in range(3)]  # three replicas sharing one backend (memory: one each)
    jobs = [stores[i % 3].create(stored_voice(f"v{i}", "seed", owner=ALICE, seed=i)) for i in range(12)]
    results = await asyncio.gather(*jobs, return_exceptions=True)
    made = [r for r in results if isinstance(r, StoredVoice)]
    refused = [r for r in results if isinstance(r, APIError)]
    assert len(made) + len(refused) == 12 and all(r.code == "voice_quota_exceeded" for r in refused), results
    if cfg.backend == "memory":
        assert [len(await s.list(ALICE)) for s in stores] == [3, 3, 3]  # 4 creates each, 3 stored
    else:
        assert len(made) == 3
        listed = await stores[0].list(ALICE)
        assert sorted(v.id for v in listed) == sorted(v.id for v in made)
        for v in made:
            assert await stores[1].get_by_name(v.name, ALICE) == v
    for s in stores:
        await s.close()


_RACE = """
import asyncio, sys
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import make_voice_store, stored_voice
from serve_app.errors import APIError
store = make_voice_store(VoiceStoreConfig(backend="directory", path=sys.argv[1], max_voices_per_key=7))
async def main():
    made = 0
    for i in range(12):
        try:
            await store.create(stored_voice(f"{sys.argv[2]}-{i}", "seed", owner="a1a1a1a1a1a1", seed=i))
            made += 1
        except APIError as e:
            assert e.code == "voice_quota_exceeded", e.message
    print(made)
asyncio.run(main())
"""


def test_replicas_on_one_host_cannot_pass_one_keys_quota_together(tmp_path):
    """Three processes create voices for one key at once: exactly its quota gets stored."""
    root = tmp_path / "shared"
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACE, str(root), f"p{n}"], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for n in range(3)
    ]
    made = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    index = json.loads((root / "names.json").read_text())
    assert sum(made) == len(index) == len(list(root.glob("voice_*.json"))) == 7, made
    store = make_voice_store(VoiceStoreConfig(backend="directory", path=str(root)))
    assert len(asyncio.run(store.list(ALICE))) == 7


async def test_another_keys_id_is_refused_before_its_document_is_read(cfg, monkeypatch):
    """A foreign id stops where a missing one does: no document is read or parsed for either,
    so the answer and its cost are the same (no existence leak)."""
    store = make_voice_store(cfg)
    theirs = await store.create(stored_voice("secret", "clip", owner=BOB, sample="s" * 20000, transcript="t"))
    parsed: list[str] = []
    original = StoredVoice.model_validate_json.__func__

    def counting(cls, data, *args, **kwargs):
        parsed.append("x")
        return original(cls, data, *args, **kwargs)

    monkeypatch.setattr(StoredVoice, "model_validate_json", classmethod(counting))
    for voice_id in (theirs.id, "voice_" + "0" * 24):
        assert await store.get(voice_id, ALICE) is None
        assert await store.delete(voice_id, ALICE) is False
    assert parsed == []
    store.parsed.forget()  # kept parsed since its create: the owner's read parses it again
    assert await store.get(theirs.id, BOB) is not None and parsed  # the owner's read parses it
    await store.close()


# ------------------------------------------------------------------ documents stored before owners


def legacy_doc(voice_id: str, name: str, seed: int) -> str:
    """A voice as the store wrote it before voices had owners."""
    return json.dumps(
        {
            "id": voice_id,
            "name": name,
            "kind": "seed",
            "created_at": 1700000000 + seed,
            "seed": seed,
            "speaker": SPEAKER,
        }
    )


LEGACY = [("voice_" + "1" * 24, "old one", 1), ("voice_" + "2" * 24, "old two", 2)]


async def check_legacy_voices_are_anonymous(store) -> None:
    ids = [voice_id for voice_id, _, _ in LEGACY]
    assert [v.id for v in await store.list()] == ids
    assert all(v.owner == ANONYMOUS for v in await store.list())
    assert (await store.get_by_name("OLD ONE")).id == ids[0] and (await store.get(ids[1])).seed == 2
    assert await store.get(ids[0], ALICE) is None and await store.get_by_name("old one", ALICE) is None
    assert {v.owner for v in await store.list(ROOT, admin=True)} == {ANONYMOUS}
    # They count toward anonymous's quota (3): one more fits, then none.
    await store.create(stored_voice("new", "seed", seed=3))
    with pytest.raises(APIError) as e:
        await store.check_room(ANONYMOUS)
    assert code_of(e) == (409, "voice_quota_exceeded")
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("old one", "seed", seed=4), max_owned=10)
    assert code_of(e) == (409, "voice_exists")  # the old index entry still names it
    await store.create(stored_voice("old one", "seed", owner=ALICE, seed=5))  # another owner's name: free
    assert await store.delete(ids[0]) and await store.get_by_name("old one") is None
    assert len(await store.list()) == 2


def test_a_document_without_owner_reads_as_anonymous():
    voice = StoredVoice.model_validate_json(legacy_doc(*LEGACY[0]))
    assert voice.owner == ANONYMOUS and voice.summary()["owner"] == ANONYMOUS


async def test_directory_documents_stored_before_owners_are_anonymous(tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    for voice_id, name, seed in LEGACY:
        (root / f"{voice_id}.json").write_text(legacy_doc(voice_id, name, seed))
    (root / "names.json").write_text(json.dumps({name_key(name): voice_id for voice_id, name, _ in LEGACY}))
    await check_legacy_voices_are_anonymous(
        make_voice_store(VoiceStoreConfig(backend="directory", path=str(root), max_voices_per_key=3))
    )


@needs_redis
async def test_redis_documents_stored_before_owners_are_anonymous(tmp_path):
    import redis

    server = RedisServer(free_port(), tmp_path)
    server.start()
    try:
        r = redis.Redis.from_url(server.url)
        for voice_id, name, seed in LEGACY:  # the layout the store wrote before owners
            r.set(f"chattts:voices:v:{voice_id}", legacy_doc(voice_id, name, seed))
            r.hset("chattts:voices:names", name_key(name), voice_id)
            r.zadd("chattts:voices:ids", {voice_id: seed})
        cfg = VoiceStoreConfig(backend="redis", redis_url=server.url, max_voices_per_key=3)
        store = make_voice_store(cfg)
        await check_legacy_voices_are_anonymous(store)
        await store.close()
        again = make_voice_store(cfg)  # another replica adopts nothing twice
        assert len(await again.list()) == 2 and len(await again.list(ROOT, admin=True)) == 3
        await again.close()
        r.close()
    finally:
        server.stop()


def test_index_keys_keep_the_old_form_for_anonymous():
    assert index_key(ANONYMOUS, "Name") == name_key("name")
    assert index_key(ALICE, "Name") != index_key(BOB, "Name") != name_key("name")
    assert index_key(ALICE, "Name").endswith("." + name_key("name"))


# ------------------------------------------------------------------ speech requests (VoiceCatalog)


async def test_speech_resolves_only_the_callers_voices(cfg):
    store = make_voice_store(cfg)
    catalog = VoiceCatalog(store)
    a = await store.create(stored_voice("twin", "seed", owner=ALICE, seed=11, speaker=SPEAKER))
    b = await store.create(stored_voice("twin", "clip", owner=BOB, sample="smp", transcript="words"))
    assert (await catalog.resolve("twin", ALICE)).seed == 11 and (await catalog.resolve(a.id, ALICE)).seed == 11
    assert (await catalog.resolve("twin", BOB)).spk_smp == "smp" and (await catalog.resolve(b.id, BOB)).spk_smp == "smp"
    missing = "voice_" + "f" * 24
    with pytest.raises(UnknownVoiceError) as foreign:
        await catalog.resolve(b.id, ALICE)
    with pytest.raises(UnknownVoiceError) as absent:
        await catalog.resolve(missing, ALICE)
    assert str(foreign.value).replace(b.id, "ID") == str(absent.value).replace(missing, "ID")
    with pytest.raises(UnknownVoiceError):
        await catalog.resolve("twin", "c0c0c0c0c0c0")
    # Built-ins stay everyone's; an admin uses anyone's voice.
    assert (await catalog.resolve("alloy", "c0c0c0c0c0c0")).seed == 2222
    assert (await catalog.resolve(b.id, ROOT, admin=True)).spk_smp == "smp"
    cards = await catalog.cards(ALICE)
    assert [c["id"] for c in cards if c["kind"] != "builtin"] == [a.id] and cards[-1]["owner"] == ALICE
    everyone = await catalog.cards(ROOT, admin=True)
    assert {(c["id"], c["owner"]) for c in everyone if c["kind"] != "builtin"} == {(a.id, ALICE), (b.id, BOB)}
    VoiceList(data=everyone)  # the route's response model shows the owner
    assert VoiceList(data=everyone).model_dump()["data"][-1]["owner"] in (ALICE, BOB)
    await store.close()


# ------------------------------------------------------------------ the voices API (no Ray)


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class StubVocoder:
    """The Vocoder stage's two methods the voices API calls, counted. ``together``: no call
    returns before that many calls are in progress (a race: they all passed the first check)."""

    def __init__(self, together: int = 0):
        self.calls: list[str] = []
        self.together = together
        self._all_in = asyncio.Event()
        self.speaker_for_seed = _Remote(self._speaker)
        self.encode_clip = _Remote(self._clip)

    async def _enter(self, what: str) -> None:
        self.calls.append(what)
        if self.together:
            if len(self.calls) >= self.together:
                self._all_in.set()
            await asyncio.wait_for(self._all_in.wait(), 60)

    async def _speaker(self, seed):
        await self._enter("speaker_for_seed")
        return SPEAKER

    async def _clip(self, data, min_s, max_s):
        await self._enter("encode_clip")
        return SimpleNamespace(spk_smp="codes", seconds=3.0)


def http_request(built: httpx.Request) -> Request:
    """A Starlette request carrying what httpx would send."""
    body = built.read()
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [(k.lower().encode(), v.encode()) for k, v in built.headers.items()]
    return Request(
        {"type": "http", "method": built.method, "path": VOICES_PATH, "headers": headers, "query_string": b""}, receive
    )


def json_create(**body) -> Request:
    return http_request(httpx.Request("POST", "http://x" + VOICES_PATH, json=body))


def clip_create(name: str) -> Request:
    return http_request(
        httpx.Request(
            "POST",
            "http://x" + VOICES_PATH,
            data={"name": name, "transcript": "words"},
            files={"audio": ("clip.wav", b"RIFF" + b"\0" * 2000, "audio/wav")},
        )
    )


def customs(listing: dict) -> list[dict]:
    return [v for v in listing["data"] if v["kind"] != "builtin"]


def api_of(cfg: VoiceStoreConfig, together: int = 0) -> VoicesAPI:
    return VoicesAPI(cfg, StubVocoder(together))


async def test_the_api_keeps_each_keys_voices_apart(cfg):
    api = api_of(cfg)
    alice, bob, root = caller(ALICE), caller(BOB), caller(ROOT, admin=True)
    mine = await api.create(json_create(name="narrator", seed=5), alice)
    theirs = await api.create(clip_create("narrator"), bob)  # the same name, another key
    assert mine["owner"] == ALICE and theirs["owner"] == BOB
    assert [v["id"] for v in customs(await api.list(alice))] == [mine["id"]]
    assert [v["id"] for v in customs(await api.list(bob))] == [theirs["id"]]
    assert (await api.get(mine["id"], alice))["speaker"] == SPEAKER
    # Another key's id: the same 404 as an id nobody has.
    missing = "voice_" + "e" * 24
    for call in (api.get, api.delete):
        with pytest.raises(APIError) as foreign:
            await call(theirs["id"], alice)
        with pytest.raises(APIError) as absent:
            await call(missing, alice)
        assert code_of(foreign) == code_of(absent) == (404, "voice_not_found")
        assert foreign.value.message.replace(theirs["id"], "ID") == absent.value.message.replace(missing, "ID")
        assert foreign.value.param == absent.value.param
    assert (await api.get(theirs["id"], bob))["sample"] == "codes"  # still there
    # An admin lists, reads and deletes every key's voices, each with its owner.
    assert {(v["id"], v["owner"]) for v in customs(await api.list(root))} == {(mine["id"], ALICE), (theirs["id"], BOB)}
    assert (await api.get(theirs["id"], root))["owner"] == BOB
    assert (await api.delete(theirs["id"], root))["deleted"] is True
    assert customs(await api.list(bob)) == []
    assert (await api.delete(mine["id"], alice))["deleted"] is True
    await api.store.close()


async def test_the_quota_is_refused_before_anything_is_encoded(cfg):
    api = api_of(cfg)  # 3 per key
    alice = caller(ALICE)
    for i in range(3):
        await api.create(json_create(name=f"s{i}", speaker=SPEAKER), alice)  # no encoding needed
    for request in (json_create(name="seeded", seed=1), clip_create("clipped")):
        with pytest.raises(APIError) as e:
            await api.create(request, alice)
        assert code_of(e) == (409, "voice_quota_exceeded")
    assert api.encoder.calls == []  # neither a seed sampled nor a clip encoded
    # A key's grant raises (or lowers) its quota.
    await api.create(json_create(name="seeded", seed=1), caller(ALICE, max_voices=4))
    with pytest.raises(APIError) as e:
        await api.create(clip_create("c"), caller(BOB, max_voices=0))
    assert code_of(e) == (409, "voice_quota_exceeded")
    assert api.encoder.calls == ["speaker_for_seed"]
    # A name the key already uses is refused before encoding too; another key's is no conflict.
    with pytest.raises(APIError) as e:
        await api.create(clip_create("S0"), caller(ALICE, max_voices=9))
    assert code_of(e) == (409, "voice_exists") and api.encoder.calls == ["speaker_for_seed"]
    await api.create(clip_create("s0"), caller(BOB))
    assert api.encoder.calls == ["speaker_for_seed", "encode_clip"]
    await api.store.close()


async def test_concurrent_api_creates_that_all_passed_the_first_check_store_only_the_quota(cfg):
    """Every create passes the check before encoding (the others are still encoding), so the
    store's own check, atomic with the write, is what holds the quota."""
    api = api_of(cfg, together=5)
    alice = caller(ALICE, max_voices=2)
    results = await asyncio.gather(*(api.create(clip_create(f"c{i}"), alice) for i in range(5)), return_exceptions=True)
    assert api.encoder.calls == ["encode_clip"] * 5  # all got past the first check
    made = [r for r in results if isinstance(r, dict)]
    assert len(made) == 2 and all(
        isinstance(r, APIError) and r.code == "voice_quota_exceeded" for r in results if not isinstance(r, dict)
    ), results
    assert len(customs(await api.list(alice))) == 2
    await api.store.close()


async def test_a_broken_form_gets_a_generic_answer_and_the_detail_goes_to_the_log(caplog):
    api = api_of(VoiceStoreConfig(backend="memory"))
    broken = httpx.Request(
        "POST",
        "http://x" + VOICES_PATH,
        content=b"--zzz\r\nContent-Disposition: form-data\r\n\r\nx",
        headers={"content-type": "multipart/form-data; boundary=zzz"},
    )
    no_boundary = httpx.Request(
        "POST", "http://x" + VOICES_PATH, content=b"whatever", headers={"content-type": "multipart/form-data"}
    )
    for built in (broken, no_boundary):
        with caplog.at_level(logging.DEBUG, logger="ray.serve"):
            caplog.clear()
            with pytest.raises(APIError) as e:
                await api.create(http_request(built), caller(ALICE))
        assert code_of(e) == (400, "invalid_form") and e.value.message == "could not read the form"
        assert any("could not read the form:" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert api.encoder.calls == []
