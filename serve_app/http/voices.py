"""The voices API behind ``/v1/audio/voices`` (the Ingress's routes call it; no torch here).

``POST /v1/audio/voices`` takes JSON or a multipart form with ``name`` and exactly one of

- ``speaker``: a ChatTTS speaker string (kept as given);
- ``seed``: the speaker of ``seed:<n>``, sampled once by the Vocoder stage and kept, so the voice
  stays the same speaker whatever happens to seed sampling later;
- ``audio`` (multipart only) + ``transcript``: a reference clip of 2-30 s, decoded, checked and
  encoded by the Vocoder stage (``Vocoder.encode_clip``: the DVAE encoder).

and optionally ``consent`` (the speaker's consent statement) and ``consent_by`` (who gave it),
kept with the voice and shown in its detail; required for a clip when ``voices.require_consent``.

Every voice belongs to the caller that made it (``Caller.owner``: its API key id, or
``anonymous`` without keys): a caller lists, reads, deletes and speaks with its own voices only
(another key's id answers exactly like a missing one), an admin key every key's. Names are
unique per owner. Each key owns at most its quota (``Caller.max_voices``, else
``voices.max_voices_per_key``).

Every check that needs no model runs before any remote call (name, consent, transcript, exactly
one source, a name the caller already uses, the caller's quota and the store's limit), and nothing is
stored unless the voice is complete; the store checks the name and the limits again, atomically
with the write.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

from fastapi import Request

from ..engine.errors import VoiceError
from ..engine.voices import MAX_SEED, MAX_SPEAKER_CHARS, OPENAI_VOICES, VoiceResolver
from ..errors import APIError, as_api_error
from ..settings import VoiceStoreConfig
from ..storage.voices import (
    MAX_CONSENT_BY_CHARS,
    MAX_CONSENT_CHARS,
    VOICE_ID_RE,
    StoredVoice,
    VoiceCatalog,
    check_consent,
    check_name,
    clean_transcript,
    make_voice_store,
    stored_voice,
)
from .bodies import read_bounded
from .errors import read_form
from .security import Caller

log = logging.getLogger("ray.serve")

VOICES_PATH = "/v1/audio/voices"
# name + speaker string (at most MAX_SPEAKER_CHARS) or seed + consent and consent_by, even
# escaped (\uXXXX: 6 bytes a character), with room.
MAX_JSON_BYTES = 32 * 1024
_FIELDS = ("name", "speaker", "seed", "audio", "transcript", "consent", "consent_by")
_CONSENT_SCHEMA = {
    "consent": {
        "type": "string",
        "maxLength": MAX_CONSENT_CHARS,
        "description": "The speaker's consent statement, kept with the voice (required for a clip when "
        "voices.require_consent is on).",
    },
    "consent_by": {"type": "string", "maxLength": MAX_CONSENT_BY_CHARS, "description": "Who gave the consent."},
}

# The create route reads its body itself (JSON or a form), so FastAPI cannot infer this schema.
CREATE_VOICE_OPENAPI = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "speaker": {"type": "string", "maxLength": MAX_SPEAKER_CHARS},
                        "seed": {"type": "integer"},
                        **_CONSENT_SCHEMA,
                    },
                }
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name", "audio", "transcript"],
                    "properties": {
                        "name": {"type": "string"},
                        "audio": {"type": "string", "format": "binary"},
                        "transcript": {"type": "string"},
                        **_CONSENT_SCHEMA,
                    },
                }
            },
        }
    }
}


def _bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


async def _fields(request: Request) -> dict[str, Any]:
    """The create request's fields from a JSON body or a form (``audio``, a file part, as bytes)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await read_form(request, "voices", len(_FIELDS))
        out: dict[str, Any] = {}
        for key in _FIELDS:
            value = form.get(key)
            if value is None:
                continue
            if key == "audio":
                if isinstance(value, str):
                    raise _bad("'audio' must be a file part", param="audio")
                out[key] = await value.read()
            elif isinstance(value, str):
                out[key] = value
            else:
                raise _bad(f"'{key}' must be a text field", param=key)
        await form.close()
        return out
    if ctype in ("application/json", ""):
        # Only a clip (multipart) may be large: JSON stops early.
        raw = await read_bounded(
            request,
            MAX_JSON_BYTES,
            lambda: APIError(
                413,
                f"a JSON voice is at most {MAX_JSON_BYTES} bytes; send clips as a multipart form",
                code="body_too_large",
            ),
        )
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise _bad("request body is not valid JSON", code="invalid_json") from None
        if not isinstance(body, dict):
            raise _bad(
                'send a JSON object: {"name", "speaker"} or {"name", "seed"}, or a multipart form with '
                "'name', 'audio' and 'transcript'"
            )
        unknown = sorted(set(body) - set(_FIELDS) - {"audio"})
        if unknown:
            raise _bad(f"unknown field {unknown[0]!r}", param=unknown[0])
        if "audio" in body:
            raise _bad("send a clip as a multipart form ('name', 'audio' file, 'transcript')", param="audio")
        return body
    raise APIError(
        415,
        f"unsupported content type {ctype!r}: use application/json or multipart/form-data",
        code="unsupported_media_type",
    )


def _seed(value: Any) -> int:
    try:
        seed = int(value) if not isinstance(value, (bool, float)) else None
    except (TypeError, ValueError):
        seed = None
    if seed is None or not 0 <= seed <= MAX_SEED:
        raise _bad(f"seed must be an integer from 0 to {MAX_SEED}", param="seed")
    return seed


class VoicesAPI:
    """The store plus the Vocoder stage's encoder (``encode_clip``, ``speaker_for_seed``)."""

    def __init__(self, cfg: VoiceStoreConfig, encoder: Any):
        """``encoder``: the Vocoder stage's handle (it encodes clips and samples seeds' speakers)."""
        self.cfg = cfg
        self.store = make_voice_store(cfg)
        self.catalog = VoiceCatalog(self.store)
        self.encoder = encoder

    async def _remote(self, call: Any) -> Any:
        try:
            return await call
        except Exception as exc:  # noqa: BLE001
            raise as_api_error(exc, "voice encoding failed", "voice_encoding_failed") from None

    def _quota(self, caller: Caller) -> int:
        return self.store.owned_limit(caller.max_voices)

    async def create(self, request: Request, caller: Caller) -> dict[str, Any]:
        """A voice owned by ``caller``. Its name, its quota and the store's limit are checked
        before the Vocoder stage is asked anything (and again when the voice is stored)."""
        fields = await _fields(request)
        name = check_name(fields.get("name"))
        sources = [k for k in ("speaker", "seed", "audio") if fields.get(k) not in (None, "", b"")]
        if len(sources) != 1:
            if not sources and "transcript" in fields:
                raise _bad("a clip voice needs its 'audio' file", param="audio", code="missing_audio")
            raise _bad(
                "give exactly one of 'speaker' (a ChatTTS speaker string), 'seed', or 'audio' (a clip, "
                "with its 'transcript')",
                param=sources[1] if len(sources) > 1 else None,
                code="missing_required_parameter",
            )
        source = sources[0]
        # Required for a clip (a person's recorded voice) when the server says so; kept when given.
        kind = "clip" if source == "audio" else source
        consent = check_consent(fields.get("consent"), fields.get("consent_by"), self.cfg.require_consent, kind)
        # Before any encoding; the store checks both again, atomically with the write. Names are
        # the caller's own (an admin's too): another key's voice of that name is no conflict.
        if await self.store.get_by_name(name, caller.owner) is not None:
            raise APIError(
                409,
                f"a voice named {name!r} exists already; delete it first or pick another name",
                param="name",
                code="voice_exists",
            )
        quota = self._quota(caller)
        await self.store.check_room(caller.owner, quota)
        if source == "speaker":
            speaker = fields["speaker"]
            try:
                if not isinstance(speaker, str):
                    raise VoiceError("speaker must be a string")
                if len(speaker) > MAX_SPEAKER_CHARS:  # before any decoding (engine/voices.decode_speaker)
                    raise VoiceError(f"a ChatTTS speaker string is at most {MAX_SPEAKER_CHARS} characters")
                resolved = VoiceResolver().resolve(speaker)
            except VoiceError as exc:
                raise _bad(f"invalid speaker: {exc}", param="speaker", code="invalid_speaker") from None
            if resolved.spk_emb is None:  # a built-in name or seed:<n>, not a speaker string
                raise _bad(
                    "speaker must be a ChatTTS speaker string; for a seed send 'seed'",
                    param="speaker",
                    code="invalid_speaker",
                )
            voice = stored_voice(name, "speaker", owner=caller.owner, speaker=speaker, consent=consent)
        elif source == "seed":
            seed = _seed(fields["seed"])
            speaker = await self._remote(self.encoder.speaker_for_seed.remote(seed))
            voice = stored_voice(name, "seed", owner=caller.owner, seed=seed, speaker=speaker, consent=consent)
        else:
            transcript = clean_transcript(fields.get("transcript"), self.cfg.max_transcript_chars)
            clip = await self._remote(
                self.encoder.encode_clip.remote(fields["audio"], self.cfg.min_clip_seconds, self.cfg.max_clip_seconds)
            )
            voice = stored_voice(
                name,
                "clip",
                owner=caller.owner,
                sample=clip.spk_smp,
                transcript=transcript,
                clip_seconds=round(clip.seconds, 2),
                consent=consent,
            )
        await self.store.create(voice, quota)
        log.info(json.dumps({"event": "voice_created", "id": voice.id, "kind": voice.kind, "owner": voice.owner}))
        return voice.summary()

    async def list(self, caller: Optional[Caller]) -> dict[str, Any]:
        """The built-in voices and the caller's (an admin: every owner's); with no caller (no key
        sent where keys are on, as Open WebUI asks) the built-in voices only. ``data``: the cards;
        ``voices``: each one's id and name, the shape Open WebUI reads (``protocol.VoiceList``);
        ``every_owner``: an admin's listing (every key's voices)."""
        if caller is None:
            cards = self.catalog.builtin_cards()
        else:
            cards = await self.catalog.cards(caller.owner, admin=caller.admin)
        voices = [{"id": c["id"], "name": c["name"]} for c in cards]
        return {"object": "list", "data": cards, "voices": voices, "every_owner": bool(caller and caller.admin)}

    async def get(self, voice_id: str, caller: Caller) -> dict[str, Any]:
        seed = OPENAI_VOICES.get(voice_id.lower())
        if seed is not None:  # a built-in voice: its speaker string too, so it can be kept
            speaker = await self._remote(self.encoder.speaker_for_seed.remote(seed))
            return {
                "id": voice_id.lower(),
                "object": "voice",
                "name": voice_id.lower(),
                "kind": "builtin",
                "seed": seed,
                "speaker": speaker,
            }
        return (await self._stored(voice_id, caller)).detail()

    async def delete(self, voice_id: str, caller: Caller) -> dict[str, Any]:
        if voice_id.lower() in OPENAI_VOICES:
            raise _bad("built-in voices cannot be deleted", param="voice_id", code="builtin_voice")
        voice = await self._stored(voice_id, caller)
        if not await self.store.delete(voice.id, caller.owner, admin=caller.admin):
            raise self._not_found(voice_id)
        log.info(json.dumps({"event": "voice_deleted", "id": voice.id, "owner": voice.owner, "by": caller.owner}))
        return {"id": voice.id, "object": "voice.deleted", "deleted": True}

    async def _stored(self, voice_id: str, caller: Caller) -> StoredVoice:
        """The caller's voice (an admin: anyone's); a 404 alike for another key's and for none."""
        voice = None
        if VOICE_ID_RE.match(voice_id):
            voice = await self.store.get(voice_id, caller.owner, admin=caller.admin)
        if voice is None:
            raise self._not_found(voice_id)
        return voice

    @staticmethod
    def _not_found(voice_id: str) -> APIError:
        return APIError(404, f"no voice with id {voice_id[:64]!r}", param="voice_id", code="voice_not_found")
