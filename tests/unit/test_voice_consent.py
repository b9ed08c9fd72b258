"""Consent on voices made from a clip, without Ray: the voices API (``VoicesAPI`` with the stub
Vocoder of test_voice_owners, so a test can tell whether a clip was ever encoded) and every store
backend (memory, directory, redis), which keep the consent with the voice."""

from __future__ import annotations

import httpx
import pytest
from test_voice_owners import ALICE, SPEAKER, StubVocoder, caller, code_of, http_request, json_create

from serve_app.errors import APIError
from serve_app.http.voices import VOICES_PATH, VoicesAPI
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import (
    MAX_CONSENT_BY_CHARS,
    MAX_CONSENT_CHARS,
    StoredVoice,
    VoiceConsent,
    check_consent,
    make_voice_store,
    stored_voice,
)

STATEMENT = "I, the speaker in this clip, agree that a voice is made from it."


@pytest.fixture(params=["memory", "directory", "redis"])
def cfg(request, tmp_path) -> VoiceStoreConfig:
    if request.param == "redis":  # a real Redis (the test is skipped without redis-server)
        return VoiceStoreConfig(
            backend="redis", redis_url=request.getfixturevalue("redis_server").url, require_consent=True
        )
    return VoiceStoreConfig(backend=request.param, path=str(tmp_path / "voices"), require_consent=True)


def clip_form(name: str, **fields: str):
    return http_request(
        httpx.Request(
            "POST",
            "http://x" + VOICES_PATH,
            data={"name": name, "transcript": "words", **fields},
            files={"audio": ("clip.wav", b"RIFF" + b"\0" * 2000, "audio/wav")},
        )
    )


async def test_every_store_keeps_the_consent_and_the_detail_shows_it(cfg):
    store = make_voice_store(cfg)
    consent = VoiceConsent(statement=STATEMENT, by="Ann Example", at=1_790_000_000)
    made = await store.create(
        stored_voice("mine", "clip", owner=ALICE, sample="codes", transcript="w", consent=consent)
    )
    again = await store.get(made.id, ALICE)
    assert again.consent == consent
    assert again.detail()["consent"] == {"statement": STATEMENT, "by": "Ann Example", "at": 1_790_000_000}
    assert "consent" not in again.summary()  # the listing stays short
    # A voice made without consent (or stored before consent was recorded) has none.
    plain = await store.create(stored_voice("plain", "speaker", owner=ALICE, speaker=SPEAKER))
    assert (await store.get(plain.id, ALICE)).detail()["consent"] is None
    legacy = StoredVoice.model_validate_json(plain.model_dump_json(exclude={"consent"}))
    assert legacy.consent is None
    await store.close()


async def test_a_clip_needs_consent_when_the_server_requires_it(cfg):
    api = VoicesAPI(cfg, StubVocoder())
    alice = caller(ALICE)
    for fields, param in (({}, "consent"), ({"consent": STATEMENT}, "consent_by"), ({"consent": " \n "}, "consent")):
        with pytest.raises(APIError) as e:
            await api.create(clip_form("me", **fields), alice)
        assert code_of(e) == (400, "consent_required") and e.value.param == param, e.value.message
        assert param in e.value.message
    assert api.encoder.calls == []  # refused before the clip was encoded
    made = await api.create(clip_form("me", consent=f"  {STATEMENT}\n", consent_by="Ann\tExample"), alice)
    assert api.encoder.calls == ["encode_clip"]
    detail = await api.get(made["id"], alice)
    assert detail["consent"]["statement"] == STATEMENT and detail["consent"]["by"] == "Ann Example"
    assert isinstance(detail["consent"]["at"], int) and 0 <= made["created_at"] - detail["consent"]["at"] < 60
    # A speaker string or a seed is no one's recorded voice: no consent needed, still kept if given.
    seeded = await api.create(json_create(name="seeded", seed=3), alice)
    assert (await api.get(seeded["id"], alice))["consent"] is None
    kept = await api.create(json_create(name="kept", speaker=SPEAKER, consent=STATEMENT, consent_by="Ann"), alice)
    assert (await api.get(kept["id"], alice))["consent"]["by"] == "Ann"
    await api.store.close()


async def test_consent_is_optional_by_default_and_bounded():
    api = VoicesAPI(VoiceStoreConfig(backend="memory"), StubVocoder())
    alice = caller(ALICE)
    assert (await api.get((await api.create(clip_form("free"), alice))["id"], alice))["consent"] is None
    too_long = (
        ({"consent": "x" * (MAX_CONSENT_CHARS + 1), "consent_by": "Ann"}, "consent"),
        ({"consent": STATEMENT, "consent_by": "y" * (MAX_CONSENT_BY_CHARS + 1)}, "consent_by"),
    )
    for fields, param in too_long:
        with pytest.raises(APIError) as e:
            await api.create(clip_form("long", **fields), alice)
        assert code_of(e) == (400, "consent_too_long") and e.value.param == param
    with pytest.raises(APIError) as e:  # who gave a consent that is not there
        await api.create(clip_form("who", consent_by="Ann"), alice)
    assert code_of(e) == (400, "consent_required") and e.value.param == "consent"
    with pytest.raises(APIError) as e:  # JSON: text only
        await api.create(json_create(name="n", seed=1, consent=["yes"]), alice)
    assert code_of(e) == (400, "invalid_value") and e.value.param == "consent"
    assert api.encoder.calls == ["encode_clip"]
    await api.store.close()


def test_consent_text_is_kept_on_one_line():
    got = check_consent("I\x00 agree\r\n  to\tthis.", " Ann ", required=False, kind="clip", now=5)
    assert got == VoiceConsent(statement="I agree to this.", by="Ann", at=5)
    assert check_consent(None, None, required=True, kind="seed") is None
    assert check_consent("", "", required=False, kind="clip") is None
