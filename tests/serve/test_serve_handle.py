"""The Python API of the app: ``DeploymentHandle`` calls from the test driver and from another
Serve application (the way other Ray apps compose with chattts)."""

from __future__ import annotations

import io
import wave

import pytest
from ray import serve
from support.app import APP_NAME
from support.audio import SR, read_wav

from serve_app.protocol import SpeechRequest


def wav_samples(data: bytes) -> int:
    return len(read_wav(data))


def _caller_app():
    """A second application that reaches chattts through its app handle. Defined in a function so
    Ray pickles the class by value (replicas cannot import this test module)."""

    @serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=8)
    class Caller:
        def __init__(self):
            self.tts = serve.get_app_handle("chattts")

        async def whole(self, text: str) -> bytes:
            return await self.tts.synthesize.remote({"input": text, "response_format": "wav"})

        async def streamed(self, text: str) -> dict:
            from serve_app.protocol import SpeechRequest

            req = SpeechRequest(input=text, voice="ballad", response_format="wav")
            chunks = []
            async for data in self.tts.options(stream=True).stream.remote(req):
                chunks.append(data)
            return {"chunks": len(chunks), "sizes": [len(c) for c in chunks], "audio": b"".join(chunks)}

        async def error(self) -> dict:
            from serve_app.errors import APIError

            try:
                await self.tts.synthesize.remote({"input": "你好", "voice": "no-such-voice"})
            except APIError as exc:
                return {"type": type(exc).__name__, "status": exc.status, "code": exc.code}
            return {"type": None}

    return Caller.bind()


@pytest.mark.timeout(300)
def test_handle_from_another_application(app_url):
    handle = serve.run(_caller_app(), name="caller", route_prefix=None)
    try:
        whole = handle.whole.remote("另一个应用通过句柄调用。").result(timeout_s=120)
        assert isinstance(whole, bytes)
        assert wav_samples(whole) > SR  # > 1 s

        # A long text streams in several chunks (first audio before the rest is decoded).
        out = handle.streamed.remote("句柄流式合成测试，第一句。接下来是第二句话，说得更长一些。").result(timeout_s=120)
        assert out["chunks"] >= 3, out["sizes"]
        assert all(n > 0 for n in out["sizes"])
        assert wav_samples(out["audio"]) > 2 * SR

        # An APIError crosses two applications with its status and code.
        err = handle.error.remote().result(timeout_s=60)
        assert err["status"] == 400 and err["code"] == "voice_not_found", err
    finally:
        serve.delete("caller")
    assert "caller" not in serve.status().applications
    assert APP_NAME in serve.status().applications


def test_handle_from_driver(chattts_handle):
    text = "驱动程序直接调用。"
    data = chattts_handle.synthesize.remote({"input": text, "response_format": "wav"}).result(timeout_s=120)
    assert wav_samples(data) > SR
    # A whole answer carries its true length (a streamed WAV cannot: its sizes say "unknown").
    with wave.open(io.BytesIO(data)) as w:
        assert w.getnframes() * 2 == len(data) - 44 and w.getframerate() == SR

    # stream() with a SpeechRequest. pcm is another cache entry than the wav above, so this is a
    # second, streamed synthesis: several chunks that add up to the same samples.
    req = SpeechRequest(input=text, response_format="pcm")
    chunks = list(chattts_handle.options(stream=True).stream.remote(req))
    assert len(chunks) >= 2, [len(c) for c in chunks]
    assert b"".join(chunks) == data[44:]
