"""Pronunciation lexicons and text_normalization through the real app (the shared Serve app with
two keys, reconfigured live): the routes, a lexicon in timed speech (captions keep the written
text, the audio changes), a key's default, another key's lexicon unknown as a missing one. What
the text path does with them: tests/unit/test_lexicon_text.py; the store: test_lexicon_store.py.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from support.app import ingress_settings
from support.disk import Filler, small_disk
from test_voice_owners_serve import ws_start

from serve_app.http.security import key_id

LEXICONS = "/v1/audio/lexicons"
TIMED = "/v1/audio/speech/with-timestamps"
KEYS = {"alice": "sk-lexicon-alice", "bob": "sk-lexicon-bob"}
ENTRIES = [{"text": "银行", "pinyin": "yin2 hang2"}, {"text": "行", "pinyin": "xing2"}]


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, f"{resp.status_code}: {resp.text[:300]}"
    return resp.json()


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, f"{resp.status_code}: {resp.text[:300]}"
    return resp.json()["error"]


async def test_lexicons_through_http(app_url, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(k + "\n" for k in KEYS.values()))
    security = {"api_keys_env": None, "api_keys_file": str(keys), "max_streams_per_key": 0, "cors_origins": []}
    with ingress_settings(security=security), httpx.Client(base_url=app_url, timeout=120) as http:
        made = ok(http.post(LEXICONS, json={"name": "banks", "entries": ENTRIES}, headers=auth("alice")))
        assert made["id"].startswith("lex_") and made["owner"] == key_id(KEYS["alice"])
        first = {k: v for k, v in made["entries"][0].items() if v is not None}
        assert (made["entry_count"], made["default"], first) == (2, False, ENTRIES[0])
        try:
            assert [x["id"] for x in ok(http.get(LEXICONS, headers=auth("alice")))["data"]] == [made["id"]]
            assert ok(http.get(LEXICONS, headers=auth("bob")))["data"] == []
            bad = error_of(
                http.post(
                    LEXICONS, json={"name": "x", "entries": [{"text": "行", "pinyin": "hang"}]}, headers=auth("alice")
                ),
                400,
            )
            assert bad["code"] == "invalid_lexicon" and bad["param"] == "entries.0"

            text = "我去银行。"
            speech = {"input": text, "response_format": "wav", "captions": "srt"}
            forced = ok(http.post(TIMED, json={**speech, "lexicon": made["id"]}, headers=auth("alice")))
            plain = ok(http.post(TIMED, json={**speech, "lexicon": "none"}, headers=auth("alice")))
            # The model read other characters (other audio); captions and segments show the written ones.
            assert forced["audio"] != plain["audio"]
            assert [s["text"] for s in forced["segments"]] == [text] and text in forced["captions"]

            # bob can neither see nor use it: the answers of an id nobody has.
            missing = "lex_" + "0" * 24
            for method in ("GET", "DELETE"):
                foreign = error_of(http.request(method, f"{LEXICONS}/{made['id']}", headers=auth("bob")), 404)
                absent = error_of(http.request(method, f"{LEXICONS}/{missing}", headers=auth("bob")), 404)
                assert foreign["message"].replace(made["id"], "ID") == absent["message"].replace(missing, "ID")
            foreign = error_of(http.post(TIMED, json={**speech, "lexicon": made["id"]}, headers=auth("bob")), 400)
            absent = error_of(http.post(TIMED, json={**speech, "lexicon": missing}, headers=auth("bob")), 400)
            assert foreign["code"] == absent["code"] == "lexicon_not_found" and foreign["param"] == "lexicon"
            assert foreign["message"].replace(made["id"], "ID") == absent["message"].replace(missing, "ID")
            event, code = await ws_start(app_url, {"lexicon": made["id"], "api_key": KEYS["bob"]})
            assert code == 4400 and event["error"]["code"] == "lexicon_not_found"
            job = {"input": text, "lexicon": made["id"], "response_format": "wav"}
            assert (
                error_of(http.post("/v1/audio/jobs", json=job, headers=auth("bob")), 400)["code"] == "lexicon_not_found"
            )
            event, code = await ws_start(app_url, {"lexicon": made["id"], "api_key": KEYS["alice"]})
            assert event["type"] == "session.created" and code == 1000, (event, code)

            # A default lexicon applies to alice's requests that name none (same entries: the cached audio).
            default = ok(
                http.post(LEXICONS, json={"name": "d", "entries": ENTRIES, "default": True}, headers=auth("alice"))
            )
            assert default["content_hash"] == made["content_hash"]
            assert ok(http.post(TIMED, json=speech, headers=auth("alice")))["audio"] == forced["audio"]
            assert ok(http.delete(f"{LEXICONS}/{default['id']}", headers=auth("alice")))["deleted"] is True
            assert ok(http.post(TIMED, json=speech, headers=auth("alice")))["audio"] == plain["audio"]

            # text_normalization: off reads digits one by one (a different length of speech).
            digits = {"input": "Room 123.", "response_format": "wav"}
            on = ok(http.post(TIMED, json={**digits, "text_normalization": "on"}, headers=auth("alice")))
            off = ok(http.post(TIMED, json={**digits, "text_normalization": "off"}, headers=auth("alice")))
            assert off["duration"] < on["duration"] and off["segments"][0]["text"] == "Room 123."
            assert error_of(
                http.post(TIMED, json={**digits, "text_normalization": "maybe"}, headers=auth("alice")), 400
            )
        finally:
            http.delete(f"{LEXICONS}/{made['id']}", headers=auth("alice"))
        assert error_of(http.post(TIMED, json={**speech, "lexicon": made["id"]}, headers=auth("alice")), 400)


def test_a_full_disk_is_507_and_stores_nothing(app_url, ray_session):
    """The session app's voice and lexicon directories on a full disk (a small tmpfs over them;
    root only): a lexicon and a voice are each 507 ``insufficient_storage`` with an OpenAI body
    (before: 503 ``*_store_unavailable``, as if a retry could help), nothing half-written is listed,
    and both work again once there is room."""
    with small_disk(Path(ray_session["cache_dir"]) / "voices", 256 * 1024) as disk:
        (disk / "lexicons").mkdir()
        filler = Filler(disk)
        with httpx.Client(base_url=app_url, timeout=120) as http:
            lexicon = {"name": "full", "entries": [{"text": "满", "alias": "man"}]}
            voice = {"name": "full-disk", "seed": 7}
            kept = ok(http.post(LEXICONS, json=lexicon))
            filler.fill(leave=0)
            for path, body in ((LEXICONS, lexicon), ("/v1/audio/voices", voice)):
                r = http.post(path, json=body)
                assert r.status_code == 507, (path, r.status_code, r.text[:300])
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"]
                assert (error["type"], error["code"]) == ("server_error", "insufficient_storage"), error
            assert [x["id"] for x in ok(http.get(LEXICONS))["data"]] == [kept["id"]]
            assert not [x for x in ok(http.get("/v1/audio/voices"))["data"] if x["name"] == "full-disk"]
            filler.release()
            again = ok(http.post(LEXICONS, json=lexicon))
            made = ok(http.post("/v1/audio/voices", json=voice))
            assert [x["id"] for x in ok(http.get(LEXICONS))["data"]] == [kept["id"], again["id"]]
            assert made["name"] == "full-disk"
