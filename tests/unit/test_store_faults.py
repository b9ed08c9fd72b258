"""The voice and lexicon stores when their backend fails under a write, and nothing lost: a full
disk (a small tmpfs; root only, else skipped saying why) is 507 ``insufficient_storage`` with
nothing stored, no half-written or unindexed file ever listed, and writes work again once there
is room; a Redis server killed and started again mid-writes is 503 ``*_store_unavailable``
(the documented degradation) meanwhile, and every write it acknowledged is there after. No Ray.
What an HTTP client gets for the 507: tests/serve/test_lexicons.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.disk import Filler, small_disk
from support.redis_server import REDIS_SERVER, RedisServer

from bench.lib.procs import free_port
from serve_app.errors import APIError
from serve_app.settings import LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.lexicons import make_lexicon_store, parse_create
from serve_app.storage.voices import make_voice_store, stored_voice

DISK = 256 * 1024


def _lexicon(cfg: LexiconStoreConfig, n: int, size: int = 8):
    entries = [{"text": f"w{n}x{i}", "alias": f"word {i} " + "a" * 60} for i in range(size)]
    return parse_create({"name": f"n{n}", "entries": entries}, cfg, "key-a")


def _kinds(root: Path, **redis):
    """(noun, store, make the n-th record) for voices and lexicons on ``root`` (or Redis)."""
    if redis:  # room for as many writes as the restart takes
        room = {"max_voices_per_key": 100_000, "max_voices": 100_000}
        vcfg = VoiceStoreConfig(backend="redis", redis_prefix="fv", **room, **redis)
        lcfg = LexiconStoreConfig(
            backend="redis", redis_prefix="fl", max_lexicons_per_key=100_000, max_lexicons=100_000, **redis
        )
    else:
        vcfg = VoiceStoreConfig(backend="directory", path=str(root / "voices"))
        lcfg = LexiconStoreConfig(backend="directory", path=str(root / "lexicons"))
    voices = make_voice_store(vcfg)
    lexicons = make_lexicon_store(lcfg)
    return [
        ("voice", voices, lambda n: stored_voice(f"v{n}", "seed", owner="key-a", seed=n)),
        ("lexicon", lexicons, lambda n: _lexicon(lcfg, n)),
    ]


def _on_disk(root: Path) -> dict[str, list[str]]:
    return {d.name: sorted(p.name for p in d.iterdir() if p.name != ".lock") for d in root.iterdir() if d.is_dir()}


async def _refused(store, record) -> APIError:
    with pytest.raises(APIError) as e:
        await store.create(record)
    return e.value


async def test_a_full_disk_is_507_stores_nothing_and_passes(tmp_path):
    with small_disk(tmp_path / "disk", DISK) as disk:
        filler = Filler(disk)
        for noun, store, make in _kinds(disk):
            kept = [await store.create(make(0))]
            # No room for the document: refused, nothing written.
            filler.fill(leave=0)
            err = await _refused(store, make(1))
            assert (err.status, err.code, err.type) == (507, "insufficient_storage", "server_error"), err.message
            assert "nothing was stored" in err.message
            assert [x.id for x in await store.list("key-a")] == [kept[0].id]
            # Room for the document, none for the index after it: the document is taken back.
            doc = make(2)
            filler.fill(leave=len(doc.to_json().encode()))
            err = await _refused(store, doc)
            assert err.status == 507, err.message
            listing = _on_disk(disk)[noun + "s"]
            assert not [n for n in listing if n.startswith(".tmp-")], listing  # no half-written file
            assert f"{doc.id}.json" not in listing, listing  # nor one the index never named
            assert await store.get(doc.id, "key-a") is None
            # A delete needs the index rewritten: 507, and the record stays.
            filler.fill(leave=0)
            with pytest.raises(APIError) as e:
                await store.delete(kept[0].id, "key-a")
            assert e.value.status == 507 and (await store.get(kept[0].id, "key-a")).id == kept[0].id
            # Room again: the same writes work.
            filler.release()
            kept.append(await store.create(make(3)))
            assert [x.id for x in await store.list("key-a")] == [x.id for x in kept]
            again = _kinds(disk)[[k[0] for k in _kinds(disk)].index(noun)][1]  # another replica reads it all
            assert [x.id for x in await again.list("key-a")] == [x.id for x in kept]
            for x in kept:
                assert json.loads((disk / f"{noun}s" / f"{x.id}.json").read_text())["id"] == x.id
            await store.close()
            await again.close()


async def _write_until(store, make, stop: asyncio.Event, acknowledged: list, refused: list) -> None:
    """Records made one after another until ``stop``: the ids the store acknowledged, the refusals."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            acknowledged.append((await store.create(make(n))).id)
        except APIError as exc:
            refused.append((exc.status, exc.code))
            await asyncio.sleep(0.05)


async def _until(test, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not test():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(120)
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server binary not found (apt-get install redis-server)")
async def test_redis_killed_and_restarted_mid_writes_loses_nothing_acknowledged(tmp_path):
    """Redis keeps what it acknowledged when its operator turns persistence on (here an
    append-only file fsynced before each reply, docs/operations.md): the stores add no loss of
    their own, and meanwhile answer the documented 503."""
    server = RedisServer(free_port(), tmp_path, persistent=True)
    server.start()
    try:
        for noun, store, make in _kinds(tmp_path, redis_url=server.url, redis_timeout_s=0.5):
            acknowledged: list[str] = []
            refused: list[tuple[int, str]] = []
            stop = asyncio.Event()
            task = asyncio.create_task(_write_until(store, make, stop, acknowledged, refused))
            await _until(lambda: len(acknowledged) >= 5)  # noqa: B023 - awaited in this iteration
            server.crash()  # mid-writes: the writer's next create finds no server
            await _until(lambda: bool(refused))  # noqa: B023
            server.start()  # the same port and files
            count = len(acknowledged)
            await _until(lambda: len(acknowledged) >= count + 5)  # noqa: B023
            stop.set()
            await task
            assert set(refused) == {(503, f"{noun}_store_unavailable")}, refused
            listed = {x.id for x in await store.list("key-a")}
            assert set(acknowledged) <= listed, set(acknowledged) - listed
            for record_id in acknowledged:
                assert (await store.get(record_id, "key-a")).id == record_id
            await store.close()
    finally:
        server.stop()
