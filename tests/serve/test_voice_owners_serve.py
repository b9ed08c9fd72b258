"""Voices owned by keys through the real app (the shared Serve app, reconfigured live with three
keys: two plain, one admin): HTTP routes, a speech request and a WebSocket session. The store and
the API without Ray: tests/unit/test_voice_owners.py.
"""

from __future__ import annotations

import json
import uuid

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from serve_app.http.security import key_id

VOICES = "/v1/audio/voices"
KEYS = {"alice": "sk-owner-alice", "bob": "sk-owner-bob", "root": "sk-owner-root"}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, f"{resp.status_code}: {resp.text[:300]}"
    return resp.json()["error"]


def customs(resp: httpx.Response) -> dict[str, str]:
    assert resp.status_code == 200, resp.text[:300]
    return {v["id"]: v["owner"] for v in resp.json()["data"] if v["kind"] != "builtin"}


async def ws_start(app_url: str, start: dict) -> tuple[dict, int]:
    """The first event a session.start gets, and the close code (1000: the client closed the
    session once it was created)."""
    url = app_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    async with connect(url, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "session.start", "response_format": "pcm", **start}))
        event = None
        try:
            while True:
                item = await ws.recv()
                if isinstance(item, str) and event is None:
                    event = json.loads(item)
                    if event.get("type") == "session.created":
                        await ws.send(json.dumps({"type": "close"}))
        except ConnectionClosed as exc:
            return event, exc.rcvd.code if exc.rcvd else None


async def test_each_key_owns_its_voices_and_an_admin_key_sees_all(app_url, tmp_path):
    from test_reliability import ingress_settings

    keys = tmp_path / "keys.txt"
    keys.write_text("".join(k + "\n" for k in KEYS.values()))
    kid = {who: key_id(k) for who, k in KEYS.items()}
    security = {
        "api_keys_env": None,
        "api_keys_file": str(keys),
        "max_streams_per_key": 0,
        "cors_origins": [],
        "keys": {kid["root"]: {"admin": True}, kid["alice"]: {"max_voices": 1}},
    }
    name = f"owned-{uuid.uuid4().hex[:8]}"
    with ingress_settings(security=security), httpx.Client(base_url=app_url, timeout=60) as http:
        mine = http.post(VOICES, json={"name": name, "seed": 3}, headers=auth("alice"))
        assert mine.status_code == 200, mine.text
        mine = mine.json()
        theirs = http.post(VOICES, json={"name": name.upper(), "seed": 4}, headers=auth("bob")).json()  # no clash
        assert (mine["owner"], theirs["owner"]) == (kid["alice"], kid["bob"])
        try:
            # alice's quota (her key's grant: 1) is full; bob's default is not.
            err = error_of(http.post(VOICES, json={"name": name + "-2", "seed": 5}, headers=auth("alice")), 409)
            assert err["code"] == "voice_quota_exceeded"
            # Each key lists only its own (and not the anonymous voices other tests made).
            assert customs(http.get(VOICES, headers=auth("alice"))) == {mine["id"]: kid["alice"]}
            # Open WebUI's discovery sends no key: the built-in voices and the model ids, nobody's
            # custom voice; a key it sends is checked (and then lists that key's voices too).
            keyless = http.get(VOICES)
            assert customs(keyless) == {} and {"marin", "cedar"} <= {v["id"] for v in keyless.json()["voices"]}
            assert http.get("/v1/audio/models").json()["models"]
            assert {"id": mine["id"], "name": name} in http.get(VOICES, headers=auth("alice")).json()["voices"]
            assert error_of(http.get(VOICES, headers={"Authorization": "Bearer sk-wrong"}), 401)["code"]
            assert error_of(http.get(f"{VOICES}/{mine['id']}"), 401)["code"] == "invalid_api_key"
            assert customs(http.get("/v1/voices", headers=auth("bob"))) == {theirs["id"]: kid["bob"]}
            # bob cannot read, delete or speak with alice's voice: 404s like an id nobody has.
            missing = "voice_" + "0" * 24
            for method in ("GET", "DELETE"):
                foreign = error_of(http.request(method, f"{VOICES}/{mine['id']}", headers=auth("bob")), 404)
                absent = error_of(http.request(method, f"{VOICES}/{missing}", headers=auth("bob")), 404)
                assert foreign["message"].replace(mine["id"], "ID") == absent["message"].replace(missing, "ID")
                assert {k: v for k, v in foreign.items() if k != "message"} == {
                    k: v for k, v in absent.items() if k != "message"
                }
            speech = {"model": "chattts", "input": "你好。", "voice": {"id": mine["id"]}, "response_format": "wav"}
            # In a speech request: OpenAI's 400 for an unknown voice, the same body as an id nobody has.
            foreign = error_of(http.post("/v1/audio/speech", json=speech, headers=auth("bob")), 400)
            absent = error_of(
                http.post("/v1/audio/speech", json={**speech, "voice": missing}, headers=auth("bob")), 400
            )
            assert foreign["message"].replace(mine["id"], "ID") == absent["message"].replace(missing, "ID")
            assert foreign["code"] == absent["code"] == "voice_not_found" and foreign["param"] == "voice"
            event, code = await ws_start(app_url, {"voice": {"id": mine["id"]}, "api_key": KEYS["bob"]})
            assert code == 4400 and event["error"]["code"] == "voice_not_found"
            # By name, bob's own voice (not alice's) speaks; alice's is still hers.
            ok = http.post("/v1/audio/speech", json={**speech, "voice": name}, headers=auth("bob"))
            assert ok.status_code == 200 and ok.content[:4] == b"RIFF"
            event, code = await ws_start(app_url, {"voice": name, "api_key": KEYS["bob"]})
            assert event["type"] == "session.created" and code == 1000, (event, code)
            assert http.get(f"{VOICES}/{mine['id']}", headers=auth("alice")).json()["speaker"]
            # The admin key lists every key's voices with their owners, and deletes any.
            listed = customs(http.get(VOICES, headers=auth("root")))
            assert listed[mine["id"]] == kid["alice"] and listed[theirs["id"]] == kid["bob"]
            assert http.get(f"{VOICES}/{theirs['id']}", headers=auth("root")).json()["owner"] == kid["bob"]
            assert http.delete(f"{VOICES}/{theirs['id']}", headers=auth("root")).json()["deleted"] is True
            assert customs(http.get(VOICES, headers=auth("bob"))) == {}
        finally:
            for voice in (mine, theirs):
                http.delete(f"{VOICES}/{voice['id']}", headers=auth("root"))
