"""What the voice and lexicon stores keep on disk and in Redis, spelled out here by hand: a store
writes exactly this layout, and reads data written in it (by an older release) back, owners,
names and defaults included. Redis runs a real ``redis-server`` (skipped without one)."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from support.redis_server import needs_redis  # noqa: F401 - the marker's module registers redis_server

from serve_app.errors import APIError
from serve_app.settings import LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.lexicons import StoredLexicon, make_lexicon_store, parse_create
from serve_app.storage.voices import ANONYMOUS, StoredVoice, make_voice_store, new_voice_id, stored_voice

ENTRIES = [{"text": "SQL", "alias": "sequel"}]


def tag(owner: str) -> str:  # the owner's hash, as every release has named it
    return hashlib.sha256(b"owner\0" + owner.encode()).hexdigest()[:16]


def name_hash(name: str) -> str:
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:32]


def lexicon(owner: str, default: bool, created_at: int) -> StoredLexicon:
    made = parse_create({"name": f"w-{owner}", "entries": ENTRIES, "default": default}, LexiconStoreConfig(), owner)
    return made.model_copy(update={"created_at": created_at})


def voice(owner: str, name: str, created_at: int) -> StoredVoice:
    return StoredVoice(id=new_voice_id(), name=name, owner=owner, kind="seed", seed=7, created_at=created_at)


async def test_directory_layouts_are_written_and_read_back(tmp_path):
    # Lexicons: <id>.json and index.json {"ids": {id: owner tag}, "defaults": {owner tag: id}}.
    root = tmp_path / "lexicons"
    root.mkdir()
    old = [lexicon("alice", True, 100), lexicon("alice", False, 101), lexicon("bob", False, 102)]
    for x in old:
        (root / f"{x.id}.json").write_text(x.to_json())
    ids = {x.id: tag(x.owner) for x in old}
    (root / "index.json").write_text(json.dumps({"ids": ids, "defaults": {tag("alice"): old[0].id}}))
    lexicons = make_lexicon_store(LexiconStoreConfig(backend="directory", path=str(root)))
    assert [(x.id, x.default) for x in await lexicons.list("alice")] == [(old[0].id, True), (old[1].id, False)]
    assert (await lexicons.default_of("alice")).id == old[0].id and await lexicons.default_of("bob") is None
    assert await lexicons.get(old[2].id, "alice") is None and (await lexicons.get(old[2].id, "bob")).id == old[2].id
    new = await lexicons.create(lexicon("bob", True, int(time.time())))
    index = json.loads((root / "index.json").read_text())
    assert index == {"ids": {**ids, new.id: tag("bob")}, "defaults": {tag("alice"): old[0].id, tag("bob"): new.id}}
    assert StoredLexicon.model_validate_json((root / f"{new.id}.json").read_text()) == new
    assert await lexicons.delete(old[0].id, "alice")
    index = json.loads((root / "index.json").read_text())
    assert old[0].id not in index["ids"] and index["defaults"] == {tag("bob"): new.id}
    assert not (root / f"{old[0].id}.json").exists()

    # Voices: <id>.json and names.json {index key: id}; anonymous's key the bare name hash.
    root = tmp_path / "voices"
    root.mkdir()
    a, b = voice(ANONYMOUS, "Old", 100), voice("alice", "Mine", 101)
    for v in (a, b):
        (root / f"{v.id}.json").write_text(v.to_json())
    names = {name_hash("old"): a.id, f"{tag('alice')}.{name_hash('mine')}": b.id}
    (root / "names.json").write_text(json.dumps(names))
    voices = make_voice_store(VoiceStoreConfig(backend="directory", path=str(root), max_voices_per_key=2))
    assert [v.id for v in await voices.list(ANONYMOUS)] == [a.id] and [v.id for v in await voices.list("alice")] == [
        b.id
    ]
    assert (await voices.get_by_name("OLD", ANONYMOUS)).id == a.id and await voices.get_by_name("old", "alice") is None
    assert (await voices.get_by_name("old", "alice", admin=True)).id == a.id
    c = await voices.create(stored_voice("Old", "seed", owner="alice", seed=3))  # names are per owner
    with pytest.raises(APIError) as e:
        await voices.create(stored_voice("third", "seed", owner="alice", seed=4))
    assert (e.value.status, e.value.code) == (409, "voice_quota_exceeded")
    assert json.loads((root / "names.json").read_text()) == {**names, f"{tag('alice')}.{name_hash('old')}": c.id}
    assert await voices.delete(a.id, ANONYMOUS) and not (root / f"{a.id}.json").exists()
    assert name_hash("old") not in json.loads((root / "names.json").read_text())


@pytest.mark.usefixtures("redis_server")
async def test_redis_layouts_are_written_and_read_back(redis_server):
    import redis

    r = redis.Redis.from_url(redis_server.url)
    # Lexicons: <prefix>:l:<id>, <prefix>:ids, <prefix>:own:<tag> (scored by creation), <prefix>:defaults.
    old = [lexicon("alice", True, 100), lexicon("alice", False, 101)]
    for i, x in enumerate(old):
        r.set(f"lx:l:{x.id}", x.to_json())
        r.zadd("lx:ids", {x.id: 1000 + i})
        r.zadd(f"lx:own:{tag('alice')}", {x.id: 1000 + i})
    r.hset("lx:defaults", tag("alice"), old[0].id)
    lexicons = make_lexicon_store(LexiconStoreConfig(backend="redis", redis_url=redis_server.url, redis_prefix="lx"))
    assert [(x.id, x.default) for x in await lexicons.list("alice")] == [(old[0].id, True), (old[1].id, False)]
    new = await lexicons.create(lexicon("alice", True, int(time.time())))
    assert StoredLexicon.model_validate_json(r.get(f"lx:l:{new.id}")) == new
    assert r.zrange(f"lx:own:{tag('alice')}", 0, -1) == [x.id.encode() for x in (*old, new)]
    assert r.hgetall("lx:defaults") == {tag("alice").encode(): new.id.encode()}
    assert await lexicons.delete(new.id, "alice") and r.hgetall("lx:defaults") == {}
    assert r.zrange("lx:ids", 0, -1) == [x.id.encode() for x in old] and r.get(f"lx:l:{new.id}") is None
    await lexicons.close()

    # Voices: <prefix>:v:<id>, <prefix>:names, <prefix>:ids, <prefix>:own:<tag>, <prefix>:owners.
    vs = make_voice_store(VoiceStoreConfig(backend="redis", redis_url=redis_server.url, redis_prefix="vx"))
    v = await vs.create(stored_voice("Mine", "seed", owner="alice", seed=5))
    key = f"{tag('alice')}.{name_hash('mine')}"
    assert StoredVoice.model_validate_json(r.get(f"vx:v:{v.id}")) == v
    assert r.hgetall("vx:names") == {key.encode(): v.id.encode()} and r.smembers("vx:owners") == {tag("alice").encode()}
    assert r.zrange("vx:ids", 0, -1) == r.zrange(f"vx:own:{tag('alice')}", 0, -1) == [v.id.encode()]
    with pytest.raises(APIError) as e:
        await vs.create(stored_voice("MINE", "seed", owner="alice", seed=6))
    assert (e.value.status, e.value.code) == (409, "voice_exists")
    assert (await vs.get_by_name("mine", "alice")).id == v.id
    assert await vs.delete(v.id, "alice") and r.hgetall("vx:names") == {} and r.zcard("vx:ids") == 0
    await vs.close()
    r.close()
