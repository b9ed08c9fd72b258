"""The voice store (memory, directory, redis), voice resolution and clip decoding; no Ray.

Redis tests run a real ``redis-server`` (the cache tests' ``RedisServer``); the directory tests
use real files and, for the file lock, real processes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError
from support.clips import encode, speechlike
from support.redis_server import needs_redis
from support.speakers import encode_speaker

from bench.lib.procs import REPO_ROOT as REPO
from bench.lib.procs import free_port
from serve_app.engine.clips import ClipLimits, decode_clip
from serve_app.engine.errors import InvalidClipError, UnknownVoiceError
from serve_app.errors import APIError
from serve_app.protocol import SpeechRequest
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.cache import request_key
from serve_app.storage.voices import (
    ANONYMOUS,
    VOICE_ID_RE,
    DirectoryVoiceStore,
    StoredVoice,
    VoiceCatalog,
    check_name,
    clean_transcript,
    make_voice_store,
    new_voice_id,
    stored_voice,
)

SPEAKER = encode_speaker(np.linspace(-1, 1, 768, dtype=np.float32))
OTHER_SPEAKER = encode_speaker(np.linspace(1, -1, 768, dtype=np.float32))


@pytest.fixture(params=["memory", "directory", "redis"])
def store_config(request, tmp_path) -> VoiceStoreConfig:
    if request.param == "redis":  # a real Redis (the test is skipped without redis-server)
        return VoiceStoreConfig(backend="redis", redis_url=request.getfixturevalue("redis_server").url, max_voices=3)
    return VoiceStoreConfig(backend=request.param, path=str(tmp_path / "voices"), max_voices=3)


def status_of(exc_info) -> tuple[int, str]:
    return exc_info.value.status, exc_info.value.code


async def test_create_get_list_delete(store_config):
    store = make_voice_store(store_config)
    a = await store.create(stored_voice("Anna", "speaker", speaker=SPEAKER))
    b = await store.create(stored_voice("李雷", "seed", seed=7, speaker=OTHER_SPEAKER))
    assert VOICE_ID_RE.match(a.id) and a.id != b.id
    assert (await store.get(a.id)) == a
    assert (await store.get_by_name("anna")) == a  # names ignore case
    assert (await store.get_by_name("李雷")) == b
    assert [v.id for v in await store.list()] == [a.id, b.id]
    assert await store.delete(a.id) is True
    assert await store.get(a.id) is None and await store.get_by_name("Anna") is None
    assert await store.delete(a.id) is False
    assert [v.id for v in await store.list()] == [b.id]
    # The name is free again: a new voice under it is a new id with its own content.
    c = await store.create(stored_voice("ANNA", "speaker", speaker=OTHER_SPEAKER))
    assert c.id != a.id and (await store.get_by_name("anna")).speaker == OTHER_SPEAKER
    await store.close()


_NOT_THE_ID = {
    "newline": lambda i: i + "\n",  # "$" matched before a final newline: the id's regex took it
    "upper": lambda i: i.upper(),
    "upper hex": lambda i: i[:6] + i[6:].upper(),
    "leading newline": lambda i: "\n" + i,
    "nul": lambda i: i + "\x00",
}


@pytest.mark.parametrize("variant", list(_NOT_THE_ID))
async def test_only_the_exact_lower_case_id_is_an_id(store_config, variant):
    """Ids are lower-case hex and the whole string: one differing in case (two such ids would
    name one file on a case-insensitive filesystem) or with a newline never reaches a file or a
    key, for anyone, admin included."""
    store = make_voice_store(store_config)
    voice = await store.create(stored_voice("Anna", "speaker", speaker=SPEAKER))
    other = _NOT_THE_ID[variant](voice.id)
    assert other != voice.id
    assert not VOICE_ID_RE.match(other) and not VOICE_ID_RE.search(other) and not VOICE_ID_RE.fullmatch(other)
    assert await store.get(other) is None and await store.get(other, admin=True) is None
    assert await store.delete(other, admin=True) is False
    with pytest.raises(ValidationError):
        StoredVoice.model_validate_json(voice.model_copy(update={"id": other}).to_json())
    if isinstance(store, DirectoryVoiceStore):
        with pytest.raises(ValueError, match="not a voice id"):
            store._file(other)  # before: an assert, and "id\n" passed it
    if other.strip() != voice.id:  # blanks around a voice a request names are trimmed first
        with pytest.raises(UnknownVoiceError):
            await VoiceCatalog(store).resolve(other, ANONYMOUS, admin=True)
    assert await store.get(voice.id) == voice
    await store.close()


def test_generated_ids_are_lower_case():
    ids = {new_voice_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(VOICE_ID_RE.fullmatch(i) and i == i.lower() for i in ids)


async def test_names_are_unique_and_the_count_is_bounded(store_config):
    store = make_voice_store(store_config)
    await store.create(stored_voice("a", "seed", seed=1))
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("A", "seed", seed=2))
    assert status_of(e) == (409, "voice_exists")
    await store.create(stored_voice("b", "seed", seed=2))
    await store.create(stored_voice("c", "seed", seed=3))
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("d", "seed", seed=4))
    assert status_of(e) == (409, "too_many_voices")
    assert sorted(v.name for v in await store.list()) == ["a", "b", "c"]
    await store.close()


async def test_a_voice_over_the_size_limit_is_refused_and_not_stored(store_config):
    store = make_voice_store(store_config.model_copy(update={"max_voice_bytes": 2048}))
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("big", "clip", sample="x" * 4000, transcript="t"))
    assert status_of(e) == (413, "voice_too_large")
    assert await store.list() == [] and await store.get_by_name("big") is None
    await store.close()


async def test_user_input_never_becomes_a_path_or_key(store_config, tmp_path):
    store = make_voice_store(store_config)
    for bad in (
        "../../etc/passwd",
        "voice_../../x",
        "voice_" + "0" * 23 + "/",
        "names",
        ".lock",
        "voice_ABCDEF" + "0" * 18,
    ):
        assert await store.get(bad) is None
        assert await store.delete(bad) is False
    assert await store.get_by_name("x" * 200) is None
    await store.close()


async def test_directory_store_survives_a_restart_and_leaves_no_temporary_files(tmp_path):
    cfg = VoiceStoreConfig(backend="directory", path=str(tmp_path / "v"))
    first = make_voice_store(cfg)
    made = await first.create(stored_voice("keep me", "speaker", speaker=SPEAKER))
    again = make_voice_store(cfg)  # a new replica, or the same one after a restart
    assert await again.get_by_name("Keep Me") == made
    names = sorted(p.name for p in (tmp_path / "v").iterdir())
    assert names == sorted([".lock", f"{made.id}.json", "names.json"]), names
    assert json.loads((tmp_path / "v" / f"{made.id}.json").read_text())["speaker"] == SPEAKER


async def test_directory_store_backend_failure_is_a_503(tmp_path):
    cfg = VoiceStoreConfig(backend="directory", path=str(tmp_path / "v"))
    store = make_voice_store(cfg)
    (tmp_path / "v" / "names.json").write_text("{not json")  # a corrupted index
    with pytest.raises(APIError) as e:
        await store.get_by_name("anything")
    assert status_of(e) == (503, "voice_store_unavailable") and e.value.headers["Retry-After"]


_RACE = """
import asyncio, sys
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import make_voice_store, stored_voice
from serve_app.errors import APIError
store = make_voice_store(VoiceStoreConfig(backend="directory", path=sys.argv[1], max_voices=25,
                                          max_voices_per_key=100))
async def main():
    made = 0
    for i in range(40):
        try:
            await store.create(stored_voice(f"v{i % 30}", "seed", seed=i))
            made += 1
        except APIError as e:
            assert e.status == 409, e.message
    print(made)
asyncio.run(main())
"""


def test_directory_store_is_safe_for_replicas_on_one_host(tmp_path):
    """Three processes create voices under the same names at once: names stay unique, the count
    limit holds, and the index and the files agree."""
    root = tmp_path / "shared"
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACE, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    made = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    index = json.loads((root / "names.json").read_text())
    files = sorted(p.stem for p in root.glob("voice_*.json"))
    assert sum(made) == len(index) == len(files) == 25, (made, len(index), len(files))
    assert sorted(index.values()) == files
    store = DirectoryVoiceStore(VoiceStoreConfig(backend="directory", path=str(root)))
    names = [v.name for v in asyncio.run(store.list())]
    assert len(names) == len(set(names)) == 25


@needs_redis
async def test_redis_store_outage_is_a_503_not_a_miss():
    store = make_voice_store(
        VoiceStoreConfig(backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout_s=0.2)
    )
    with pytest.raises(APIError) as e:
        await store.get_by_name("mine")
    assert status_of(e) == (503, "voice_store_unavailable")
    with pytest.raises(APIError) as e:
        await store.create(stored_voice("mine", "seed", seed=1))
    assert status_of(e) == (503, "voice_store_unavailable")


# ------------------------------------------------------------------ resolution and the cache key


async def test_catalog_resolves_every_way_to_name_a_voice(tmp_path):
    store = make_voice_store(VoiceStoreConfig(backend="memory"))
    catalog = VoiceCatalog(store)
    mine = await store.create(stored_voice("Narrator", "seed", seed=9, speaker=SPEAKER))
    clip = await store.create(stored_voice("x" * 40, "clip", sample="smp", transcript="words"))
    assert (await catalog.resolve("alloy", ANONYMOUS)).seed == 2222
    assert (await catalog.resolve("seed:5", ANONYMOUS)).seed == 5
    assert (await catalog.resolve(SPEAKER, ANONYMOUS)).spk_emb == SPEAKER
    for name in ("Narrator", "narrator", mine.id):
        v = await catalog.resolve(name, ANONYMOUS)
        assert (v.seed, v.spk_emb) == (9, SPEAKER)
    v = await catalog.resolve("x" * 40, ANONYMOUS)  # a name long enough to be read as a speaker string first
    assert (v.spk_smp, v.txt_smp, v.spk_emb) == ("smp", "words", None)
    assert (await catalog.resolve(clip.id, ANONYMOUS)) == v
    with pytest.raises(UnknownVoiceError, match="custom voice"):
        await catalog.resolve("nobody", ANONYMOUS)
    with pytest.raises(UnknownVoiceError, match="no voice with id"):
        await catalog.resolve("voice_" + "0" * 24, ANONYMOUS)
    cards = await catalog.cards(ANONYMOUS)
    assert [c["kind"] for c in cards] == ["builtin"] * 13 + ["seed", "clip"]  # 13: every name OpenAI accepts


async def test_cache_key_follows_the_voices_content_not_its_name():
    """Deleting a voice and making another under the same name must not replay the old audio."""
    store = make_voice_store(VoiceStoreConfig(backend="memory"))
    catalog = VoiceCatalog(store)
    req = SpeechRequest(input="你好", voice="mine")
    old = await store.create(stored_voice("mine", "speaker", speaker=SPEAKER))
    key_old = request_key(req, await catalog.resolve("mine", ANONYMOUS), weights_id="w")
    await store.delete(old.id)
    await store.create(stored_voice("mine", "speaker", speaker=OTHER_SPEAKER))
    key_new = request_key(req, await catalog.resolve("mine", ANONYMOUS), weights_id="w")
    assert key_old != key_new
    # The same content under another name shares entries (it is the same audio).
    await store.create(stored_voice("alias", "speaker", speaker=OTHER_SPEAKER))
    assert (
        request_key(
            SpeechRequest(input="你好", voice="alias"), await catalog.resolve("alias", ANONYMOUS), weights_id="w"
        )
        == key_new
    )


@pytest.mark.parametrize("name", ["", " pad", "pad ", "alloy", "Nova", "seed:1", "voice_abc", "a\nb", "x" * 65])
def test_bad_names_are_refused(name):
    with pytest.raises(APIError) as e:
        check_name(name)
    assert e.value.status == 400 and e.value.param == "name"


def test_transcripts_cannot_carry_internal_tokens():
    assert clean_transcript("  你好[spk_emb]世界 [laugh]  ok[Ptts] ", 100) == "你好 spk_emb 世界 [laugh] ok Ptts"
    for bad in ("", "   ", None):
        with pytest.raises(APIError, match="transcript"):
            clean_transcript(bad, 100)
    with pytest.raises(APIError, match="limit is 5"):
        clean_transcript("abcdefg", 5)


# ------------------------------------------------------------------ clips


@pytest.mark.parametrize("kind", ["wav", "mp3", "flac", "ogg", "m4a"])
@pytest.mark.parametrize("rate,channels", [(24000, 1), (44100, 2)])
def test_clips_in_every_format_decode_to_24k_mono(kind, rate, channels):
    pcm = speechlike(3.0)
    out = decode_clip(encode(pcm, kind, rate, channels))
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - len(pcm)) <= 1200  # codec priming/padding only (m4a, mp3)
    n = min(len(out), len(pcm))
    assert np.corrcoef(out[:n], pcm[:n])[0, 1] > 0.98  # the codecs here compensate their own delay
    assert abs(np.sqrt(np.mean(out**2)) - np.sqrt(np.mean(pcm**2))) < 0.01  # stereo is averaged, not summed


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "empty"),
        (b"this is not audio at all" * 100, "could not decode"),
        (encode(speechlike(1.0), "wav"), "1.0 s"),
        (encode(speechlike(31.0), "flac"), "longer than 30 s"),
        (encode(np.zeros(24000 * 3, np.float32), "wav"), "silent"),
        (encode(speechlike(3.0) * 0.001, "wav"), "silent"),
    ],
)
def test_bad_clips_say_what_is_wrong(data, message):
    with pytest.raises(InvalidClipError, match=message):
        decode_clip(data, ClipLimits(2.0, 30.0))


def test_a_long_clip_stops_decoding_at_the_limit():
    """A long file costs about the limit, not its length: decoding stops once it is too long."""
    import time

    long_file = encode(speechlike(30.0), "wav") * 1  # 30 s
    huge = encode(np.tile(speechlike(30.0), 20), "flac")  # 10 minutes
    t0 = time.perf_counter()
    with pytest.raises(InvalidClipError):
        decode_clip(long_file, ClipLimits(2.0, 5.0))
    t_long = time.perf_counter() - t0
    t0 = time.perf_counter()
    with pytest.raises(InvalidClipError):
        decode_clip(huge, ClipLimits(2.0, 5.0))
    t_huge = time.perf_counter() - t0
    assert t_huge < 5 * t_long + 0.05, (t_long, t_huge)
