"""``WS /v1/audio/speech/stream`` where only the server can answer: voices from the store, the
Ingress's admission (model, voice, API keys, streams per key), the project's Python client. The
session app on the session's Ray Serve through Serve's HTTP proxy, with a real WebSocket client.
The session scenarios (audio, barge-in, bad messages), in-process and through Serve:
tests/serve/test_ws_sessions.py.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import httpx
import pytest
from support.app import ingress_settings
from support.ws import Served, assert_same_audio, deltas, http_pcm

from serve_app.settings import SecurityConfig

TEXT = "".join(Served.sentences)
LONG = "".join(Served.long_sentences)


@pytest.fixture
def served(app_url) -> Served:
    return Served(app_url)


# ---------------------------------------------------------------------------------------- voices


async def test_custom_voice_by_id_or_name(app_url, served):
    r = await asyncio.to_thread(
        httpx.post, app_url + "/v1/audio/voices", json={"name": "ws-narrator", "seed": 4321}, timeout=60
    )
    assert r.status_code in (200, 201), r.text[:300]
    voice_id = r.json()["id"]
    try:
        reference = await asyncio.to_thread(http_pcm, app_url, "A custom voice.", voice=voice_id, seed=8)
        for voice in ({"id": voice_id}, "ws-narrator"):
            async with served.session(voice=voice, seed=8, response_format="pcm") as s:
                await s.until("session.created")
                await s.send(type="text.append", text="A custom voice.")
                await s.send(type="close")
                assert await s.closed() == 1000
            assert_same_audio(bytes(s.audio), reference)
    finally:
        await asyncio.to_thread(httpx.delete, app_url + f"/v1/audio/voices/{voice_id}", timeout=60)


# Errors at session.start (an unknown voice or model: the error event, the close code, no audio)
# are checked through every front door in test_error_contract.py.


# ---------------------------------------------------------------------------------------- keys


async def test_api_keys_and_stream_limit(served, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-ws-one\n")
    security = {
        **SecurityConfig().model_dump(),
        "api_keys_env": None,
        "api_keys_file": str(keys),
        "max_streams_per_key": 1,
    }
    with ingress_settings(security=security):
        async with served.session() as s:  # no key
            assert await s.closed() == 4401
            assert s.of("error")[0]["error"]["code"] == "invalid_api_key"
        async with served.session(api_key="sk-wrong") as s:
            assert await s.closed() == 4401
        # The key in the handshake's header, or in the first message.
        async with served.session(headers={"Authorization": "Bearer sk-ws-one"}, response_format="pcm") as s:
            await s.until("session.created")
            async with served.session(api_key="sk-ws-one") as second:  # one stream per key
                assert await second.closed() == 4429
                assert second.of("error")[0]["error"]["code"] == "too_many_streams"
            await s.send(type="text.append", text="Keyed.")
            await s.send(type="close")
            assert await s.closed() == 1000
        async with served.session(api_key="sk-ws-one", response_format="pcm") as s:  # the slot was released
            await s.until("session.created")
            await s.send(type="close")
            assert await s.closed() == 1000


# ---------------------------------------------------------------------------------------- client


async def test_python_client_stream_text_and_session(app_url):
    from serve_app.client import AsyncSpeechClient, SpeechError

    async def llm() -> AsyncIterator[str]:
        for d in deltas(TEXT, seed=3):
            yield d
            await asyncio.sleep(0.005)

    reference = await asyncio.to_thread(http_pcm, app_url, TEXT, voice="sage", seed=5)
    events: list[dict] = []
    async with AsyncSpeechClient(app_url) as client:
        audio = b"".join([b async for b in client.stream_text(llm(), voice="sage", seed=5, on_event=events.append)])
        assert_same_audio(audio, reference)
        assert [e["type"] for e in events][-1] == "done" and len(
            [e for e in events if e["type"] == "segment.done"]
        ) == 2

        with pytest.raises(SpeechError) as info:
            async for _ in client.stream_text(llm(), voice="nobody"):
                pass
        assert info.value.status == 400 and info.value.code == "voice_not_found"

        async def broken() -> AsyncIterator[str]:
            yield "The source fails "
            raise RuntimeError("the LLM stream broke")

        with pytest.raises(RuntimeError, match="LLM stream broke"):  # the source's error, not a close
            async for _ in client.stream_text(broken()):
                pass

        # Barge-in through the session API: cancel, then more text in the same session.
        async with client.session(voice="sage", clause_seconds=1.0) as s:
            await s.append(LONG)
            items = s.receive()
            assert (await items.__anext__())["type"] == "session.created"
            while not isinstance(await items.__anext__(), bytes):
                pass
            await s.cancel()
            while (event := await items.__anext__()) is not None and not (
                isinstance(event, dict) and event["type"] == "cancelled"
            ):
                pass
            await s.append("After the cancel.")
            await s.close()
            after = [item async for item in items]
        assert after[0] == {"type": "segment.start", "index": 4, "text": "After the cancel."}
        assert after[-1]["type"] == "done" and after[-1]["segments"] == 1
