"""Wyoming events to and from the service's terms, with no I/O but the bounded event reader:
what a ``synthesize`` asks of the service, the ``info`` that lists its voices, PCM cut into
``audio-chunk`` events, an ``APIError`` as an ``error`` event."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from ..engine.audio import SAMPLE_RATE
from ..engine.strict import StrictModel
from ..engine.types import MAX_SPEAKER_CHARS
from ..errors import APIError, invalid_value
from ..http.jsonlimits import MAX_JSON_DEPTH, JsonDepthGuard

SAMPLE_WIDTH = 2  # s16le: the service's pcm
CHANNELS = 1
LANGUAGES = ["en", "zh"]  # what ChatTTS speaks (the service's lang option)
MAX_LISTED_VOICES = 256  # an info event stays small whatever a key owns
CHATTTS = Attribution(name="2noise", url="https://github.com/2noise/ChatTTS")


# ------------------------------------------------------------------ events in


class VoiceSpec(BaseModel):
    """A synthesize's ``voice``: the name is any voice the service takes (built-in, a custom
    voice's name or id, ``seed:<n>``); a language alone picks the service's ``lang``."""

    model_config = ConfigDict(extra="ignore")

    name: Optional[str] = Field(default=None, min_length=1, max_length=MAX_SPEAKER_CHARS)
    language: Optional[str] = Field(default=None, max_length=35)  # BCP 47's longest common tags fit
    speaker: Optional[str] = Field(default=None, max_length=64)  # ChatTTS voices have one speaker: ignored


class SynthesizeStartData(BaseModel):
    """``synthesize-start``: a stream's voice and text format."""

    model_config = ConfigDict(extra="ignore")  # context: the client's own, not ours

    voice: Optional[VoiceSpec] = None
    text_format: Optional[Literal["text", "ssml"]] = None


class SynthesizeData(SynthesizeStartData):
    """``synthesize``: one text."""

    text: str


class SynthesizeChunkData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str


def parse(model: type[BaseModel], event: Event) -> Any:
    """``event.data`` as ``model``; a 400 naming the first bad field otherwise."""
    try:
        return model.model_validate(event.data)
    except ValidationError as exc:
        raise invalid_value(exc.errors(include_url=False), skip=()) from None


def check_text(text: str, max_chars: int) -> str:
    """The 413 the service would answer, before the service is asked."""
    if len(text) > max_chars:
        raise APIError(
            413, f"text is {len(text)} characters; at most {max_chars}", param="text", code="request_too_large"
        )
    if "\x00" in text:
        raise APIError(400, "text must not contain NUL characters", param="text", code="invalid_value")
    return text


def lang_of(language: Optional[str]) -> Optional[str]:
    """The service's ``lang`` for a Wyoming language tag (``en_US``, ``zh-CN``, ``en``), or None
    (the service detects it) for anything ChatTTS does not speak."""
    if not language:
        return None
    primary = language.replace("_", "-").split("-")[0].lower()
    return primary if primary in LANGUAGES else None


class SpeechOptions(StrictModel):
    """What a synthesize (or a stream) asks of the service besides its text."""

    voice: str
    lang: Optional[Literal["en", "zh"]] = None
    input_format: Optional[Literal["text", "ssml"]] = None

    def http_fields(self) -> dict[str, Any]:
        """``POST /v1/audio/speech``'s fields (beside input, voice and response_format)."""
        return {"lang": self.lang, "input_format": self.input_format}

    def session_fields(self) -> dict[str, Any]:
        """The WebSocket's ``session.start`` fields (beside voice and response_format); its text
        is plain text."""
        if self.input_format == "ssml":
            raise APIError(
                400, "a streamed synthesis takes plain text, not SSML", param="text_format", code="invalid_value"
            )
        return {"lang": self.lang}


def speech_options(data: SynthesizeStartData, default_voice: str) -> SpeechOptions:
    voice = data.voice or VoiceSpec()
    return SpeechOptions(voice=voice.name or default_voice, lang=lang_of(voice.language), input_format=data.text_format)


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Optional[Event]:
    """The next event, None at the end of the stream. Unlike ``wyoming.event.async_read_event``
    it reads no more than ``max_bytes`` for one event (its header line is already bounded by the
    reader's limit), refuses JSON nested deeper than the API's bodies may be before parsing it,
    and refuses a malformed one with a 400 instead of ending quietly."""
    try:
        line = await reader.readline()
    except ValueError:  # the line outgrew the reader's buffer limit
        raise APIError(413, "event header line too long", code="request_too_large") from None
    if not line:
        return None
    # Nesting first, in one linear scan: json.loads recurses per level, and a 40 KB header nested
    # 20,000 deep raised RecursionError (a 500 and a traceback) inside the event limit.
    JsonDepthGuard(MAX_JSON_DEPTH).feed(line)
    try:
        header = json.loads(line)
    except ValueError:
        raise APIError(400, "event header is not valid JSON", code="invalid_json") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise APIError(400, "event header needs a string 'type'", code="invalid_value")
    data = header.get("data") or {}
    lengths = [header.get("data_length") or 0, header.get("payload_length") or 0]
    if not isinstance(data, dict) or any(type(n) is not int or n < 0 for n in lengths):
        raise APIError(400, "event header: data must be an object, lengths counts of bytes", code="invalid_value")
    if len(line) + sum(lengths) > max_bytes:
        raise APIError(413, f"event larger than {max_bytes} bytes", code="request_too_large")
    data_length, payload_length = lengths
    if data_length:
        try:
            raw = await reader.readexactly(data_length)
        except asyncio.IncompleteReadError:
            return None
        JsonDepthGuard(MAX_JSON_DEPTH).feed(raw)
        try:
            extra = json.loads(raw)
        except ValueError:
            raise APIError(400, "event data is not valid JSON", code="invalid_json") from None
        if not isinstance(extra, dict):
            raise APIError(400, "event data must be a JSON object", code="invalid_value")
        data = {**data, **extra}
    payload = None
    if payload_length:
        try:
            payload = await reader.readexactly(payload_length)
        except asyncio.IncompleteReadError:
            return None
    return Event(type=header["type"], data=data, payload=payload)


# ------------------------------------------------------------------ events out


def info_event(voices: Iterable[dict[str, Any]], version: Optional[str]) -> Event:
    """``info``: one TTS program, the service's voices (``GET /v1/audio/voices`` cards), each
    speaking ChatTTS's languages, with text streaming in."""
    listed = [
        TtsVoice(
            name=card["name"],
            attribution=CHATTTS,
            installed=True,
            description=f"{card['name']} ({card.get('kind', 'builtin')})",
            version=None,
            languages=list(LANGUAGES),
        )
        for card in _unique_names(voices)[:MAX_LISTED_VOICES]
    ]
    program = TtsProgram(
        name="chattts-serve",
        attribution=CHATTTS,
        installed=True,
        description="ChatTTS text to speech (chattts-serve)",
        version=version,
        voices=listed,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program]).event()


def _unique_names(cards: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each name once (an admin key lists every owner's voices; names are unique per owner only)."""
    seen: dict[str, dict[str, Any]] = {}
    for card in cards:
        seen.setdefault(card["name"], card)
    return list(seen.values())


def error_event(err: APIError) -> Event:
    """The service's message and code (its HTTP status where it names no code)."""
    return Error(text=err.message, code=err.code or str(err.status)).event()


class PcmChunks:
    """The service's s16le bytes as ``audio-start`` / ``audio-chunk`` / ``audio-stop`` events.

    A stream's pieces need not end on a sample (HTTP chunks are bytes): an odd byte waits for
    the next piece. Every chunk goes out as soon as it comes, cut to at most ``samples_per_chunk``
    samples, stamped with its place in the audio (milliseconds)."""

    def __init__(self, samples_per_chunk: int, rate: int = SAMPLE_RATE):
        self.rate = rate
        self.max_bytes = samples_per_chunk * SAMPLE_WIDTH * CHANNELS
        self.samples = 0
        self.started = False
        self._odd = b""

    def _ms(self) -> int:
        return self.samples * 1000 // self.rate

    def start(self) -> Event:
        self.started = True
        return AudioStart(rate=self.rate, width=SAMPLE_WIDTH, channels=CHANNELS, timestamp=self._ms()).event()

    def feed(self, data: bytes) -> list[Event]:
        """The events for ``data``: ``audio-start`` first if none went out yet."""
        events = [] if self.started else [self.start()]
        data = self._odd + data
        whole = len(data) - len(data) % (SAMPLE_WIDTH * CHANNELS)
        self._odd = data[whole:]
        for at in range(0, whole, self.max_bytes):
            piece = data[at : min(at + self.max_bytes, whole)]
            events.append(
                AudioChunk(
                    rate=self.rate, width=SAMPLE_WIDTH, channels=CHANNELS, audio=piece, timestamp=self._ms()
                ).event()
            )
            self.samples += len(piece) // (SAMPLE_WIDTH * CHANNELS)
        return events

    def stop(self) -> list[Event]:
        """``audio-stop`` (an ``audio-start`` before it if there was no audio at all)."""
        events = [] if self.started else [self.start()]
        return events + [AudioStop(timestamp=self._ms()).event()]
