"""OpenAI's voice names, the unknown-voice error, and voice discovery without a key, without Ray:
the error table, the catalog, and the HTTP guard in front of the voices API (``VoicesAPI`` with
the stub Vocoder of test_voice_owners). Through the real app: tests/serve/test_voice_owners_serve.py
and tests/serve/test_serve_api.py."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Request
from test_voice_owners import SPEAKER, StubVocoder

from serve_app.engine.errors import UnknownVoiceError
from serve_app.engine.voices import OPENAI_VOICES, VoiceResolver
from serve_app.errors import to_api_error
from serve_app.http.app import make_app
from serve_app.http.middleware import HttpPolicy, caller_of
from serve_app.http.security import APIKeyAuth
from serve_app.http.voices import VOICES_PATH, VoicesAPI
from serve_app.protocol import VoiceList
from serve_app.settings import SecurityConfig, VoiceStoreConfig

KEY = "sk-discovery-test"

# Every name OpenAI's speech API accepts, each with the seed it has had since it was added: a seed
# is the voice, so none may ever change.
PINNED_SEEDS = {
    "alloy": 2222,
    "ash": 1031,
    "ballad": 7869,
    "coral": 4099,
    "echo": 6653,
    "fable": 1518,
    "onyx": 3333,
    "nova": 4444,
    "sage": 9001,
    "shimmer": 5555,
    "verse": 8128,
    "marin": 6271,
    "cedar": 3907,
}


def test_every_openai_voice_name_is_built_in_with_its_fixed_seed():
    assert OPENAI_VOICES == PINNED_SEEDS
    assert len(set(OPENAI_VOICES.values())) == len(OPENAI_VOICES)  # different names, different speakers
    for name in ("marin", "cedar", "Marin", " CEDAR "):
        voice = VoiceResolver().resolve(name)
        assert voice.seed == PINNED_SEEDS[name.strip().lower()]


def test_an_unknown_voice_is_openais_400_naming_the_voice_field():
    with pytest.raises(UnknownVoiceError) as e:
        VoiceResolver().resolve("no-such-voice")
    err = to_api_error(e.value)
    assert (err.status, err.type, err.param, err.code) == (400, "invalid_request_error", "voice", "voice_not_found")
    assert "marin" in err.message and "cedar" in err.message  # the message lists what exists


def _app(api: VoicesAPI):
    """The guard and the voices routes as the Ingress has them (deployments/ingress.py)."""
    auth = APIKeyAuth(SecurityConfig(api_keys_env="DISCOVERY_TEST_KEYS", auth="required"))
    app = make_app(HttpPolicy(max_bytes=64 * 1024, auth=auth))

    @app.get(VOICES_PATH, response_model=VoiceList)
    async def list_voices(request: Request):
        return await api.list(caller_of(request))

    @app.post(VOICES_PATH)
    async def create_voice(request: Request):
        return await api.create(request, caller_of(request))

    @app.get("/v1/audio/models")
    async def audio_models() -> dict:
        return {"models": [{"id": "tts-1"}]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app


async def test_builtin_voices_are_listed_without_a_key_and_a_keys_own_with_it(monkeypatch):
    monkeypatch.setenv("DISCOVERY_TEST_KEYS", KEY)
    api = VoicesAPI(VoiceStoreConfig(backend="memory"), StubVocoder())
    transport = httpx.ASGITransport(app=_app(api))
    key = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
        made = (await http.post(VOICES_PATH, json={"name": "narrator", "speaker": SPEAKER}, headers=key)).json()
        # Open WebUI's request: no key. The built-in voices only, in the shape it reads.
        keyless = await http.get(VOICES_PATH)
        assert keyless.status_code == 200, keyless.text
        body = keyless.json()
        assert body["voices"] == [{"id": n, "name": n} for n in PINNED_SEEDS]
        assert [c["id"] for c in body["data"]] == list(PINNED_SEEDS)
        # With the key: its own voices too, named for people, sent by id.
        keyed = (await http.get(VOICES_PATH, headers=key)).json()
        assert keyed["voices"][-1] == {"id": made["id"], "name": "narrator"}
        assert [c["id"] for c in keyed["data"]] == [v["id"] for v in keyed["voices"]]
        # A key that is sent is checked as anywhere; making a voice always needs one.
        assert (await http.get(VOICES_PATH, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await http.post(VOICES_PATH, json={"name": "x", "seed": 1})).status_code == 401
        for path in ("/v1/audio/models", "/health"):
            assert (await http.get(path)).status_code == 200, path
    await api.store.close()
