"""Load-test a chattts-serve deployment with Locust (bench/README.md, "Locust").

    locust -f bench/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 2 -t 60s --csv out

Two users, each a closed loop (the next request when the last one ends):

- ``SpeechUser``: ``POST /v1/audio/speech``, the body streamed as it arrives;
- ``RealtimeUser``: a ``WS /v1/audio/speech/stream`` session per task: ``session.start``, the
  text in one ``text.append``, ``close``; audio frames until ``done``.

Besides each request's own entry (``POST`` / ``WS``: the whole request), every completed request
reports custom entries under the same name (``speech pcm``, ``realtime mp3``, ...), all in
Locust's millisecond columns:

- ``TTFA``: time to the first audio byte (HTTP: from sending; WebSocket: from sending the text);
- ``RTF``: wall milliseconds per second of audio (the real-time factor x 1000, as the web page and
  ``tts_rtf`` count it: under 1000 is faster than real time);
- ``AUDIO``: milliseconds of audio the request got; audio seconds per second = its average / 1000
  x its requests/s (also logged per name at the end).

Audio length: pcm is s16le mono at 24 kHz, so bytes / 48000; mp3 is counted by its MPEG frames
(samples per frame / the frame's sample rate), which includes the encoder's padding (a few
hundredths of a second). A WebSocket session checks its count against the server's ``done``
event and fails if they disagree.

Self-contained on purpose (no import of the service): it runs wherever Locust runs. Locust
monkey-patches sockets for gevent, so the WebSocket client is websocket-client (plain sockets,
made cooperative by the patch; the ``websockets`` asyncio client would need its own loop).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Optional

import websocket  # websocket-client
from locust import HttpUser, User, constant, events, task
from locust.runners import WorkerRunner

PCM_RATE = 24000  # the service's pcm: s16le, mono, 24 kHz
PCM_BYTES_PER_S = PCM_RATE * 2
FORMATS = ("pcm", "mp3")
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
CORPUS = Path(__file__).with_name("corpus.txt")
# Used when the corpus file is not there (the locustfile copied on its own).
BUILTIN_TEXTS = (
    "你好,欢迎使用语音合成服务。",
    "Hello! This is a short test of the speech service.",
    "今天天气很好,我们一起去公园散步吧。",
    "The quick brown fox jumps over the lazy dog, twice, before breakfast.",
    "请在下一个路口右转,然后直行五百米。",
    "Streaming audio starts playing before the whole sentence is made.",
)
WS_PATH = "/v1/audio/speech/stream"
# A WebSocket session's counted audio may differ from the server's done.audio_seconds by this
# much per segment: each segment is its own mp3 stream, with the encoder's delay and a padded
# last frame (at 24 kHz about 0.05-0.08 s).
WS_AUDIO_TOLERANCE_S = 0.12

log = logging.getLogger("chattts.locust")


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument(
        "--tts-format", default="pcm", help="pcm, mp3, or both comma-separated (requests take them in turn)"
    )
    parser.add_argument(
        "--tts-voice", default=",".join(OPENAI_VOICES), help="voice names, comma-separated: each request picks one"
    )
    parser.add_argument(
        "--tts-chars",
        type=int,
        default=0,
        help="text length in characters: corpus texts joined and cut to it (0: each corpus text as it is)",
    )
    parser.add_argument("--tts-corpus", default=str(CORPUS), help="request texts, one a line ('#' lines skipped)")
    parser.add_argument(
        "--tts-key", default="", env_var="CHATTTS_API_KEY", is_secret=True, help="API key (env CHATTTS_API_KEY)"
    )
    parser.add_argument(
        "--tts-cache", action="store_true", help="let the response cache answer (default: Cache-Control: no-store)"
    )
    parser.add_argument("--tts-timeout", type=float, default=300.0, help="seconds one request or session may take")


# ------------------------------------------------------------------------------------ the texts


def load_texts(path: str) -> tuple[str, ...]:
    p = Path(path)
    if not p.is_file():
        return BUILTIN_TEXTS
    lines = (line.strip() for line in p.read_text(encoding="utf-8").splitlines())
    return tuple(line for line in lines if line and not line.startswith("#")) or BUILTIN_TEXTS


def sized_texts(texts: tuple[str, ...], chars: int) -> tuple[str, ...]:
    """Texts of exactly ``chars`` characters (consecutive texts joined, then cut), one per start."""
    if chars <= 0:
        return texts
    out = []
    for start in range(len(texts)):
        text = ""
        for t in itertools.islice(itertools.cycle(texts), start, start + len(texts)):
            text = f"{text} {t}" if text else t
            if len(text) >= chars:
                break
        out.append(((text + " ") * (chars // len(text) + 1))[:chars].strip())
    return tuple(out)


class Workload:
    """What each request sends, from the command line (one per Locust process)."""

    def __init__(self, options: Any):
        self.formats = [f.strip() for f in options.tts_format.split(",") if f.strip()]
        unknown = set(self.formats) - set(FORMATS)
        if unknown or not self.formats:
            raise ValueError(f"--tts-format: one or more of {', '.join(FORMATS)}, not {options.tts_format!r}")
        self.voices = [v.strip() for v in options.tts_voice.split(",") if v.strip()]
        self.texts = sized_texts(load_texts(options.tts_corpus), options.tts_chars)
        self.key = options.tts_key or ""
        self.cache = options.tts_cache
        self.timeout = options.tts_timeout
        self._turns: dict[str, Any] = {}  # per user class: its users take the formats in turn from the start

    def next(self, user: str) -> tuple[str, str, str]:
        """(text, voice, format) of a user class's next request."""
        turn = next(self._turns.setdefault(user, itertools.count()))
        fmt = self.formats[turn % len(self.formats)]
        return random.choice(self.texts), random.choice(self.voices), fmt

    def headers(self) -> dict[str, str]:
        out = {} if self.cache else {"Cache-Control": "no-store"}
        if self.key:
            out["Authorization"] = f"Bearer {self.key}"
        return out


_WORKLOAD: dict[int, Workload] = {}


@events.init.add_listener
def _check_options(environment: Any, **_: Any) -> None:
    """A wrong option stops Locust before the first user starts."""
    if environment.parsed_options is not None:
        try:
            workload(environment)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None


def workload(environment: Any) -> Workload:
    key = id(environment)
    if key not in _WORKLOAD:
        _WORKLOAD[key] = Workload(environment.parsed_options)
    return _WORKLOAD[key]


# ------------------------------------------------------------------------------ counting audio

_MP3_KBPS = {  # bitrate index -> kbit/s, Layer III
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),  # MPEG-1
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),  # MPEG-2 / 2.5
}


class AudioCounter:
    """Seconds of audio in a stream as its bytes arrive: pcm by bytes, mp3 by MPEG frame headers."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.bytes = 0
        self._samples = 0
        self._rate = PCM_RATE
        self._rest = b""

    def feed(self, data: bytes) -> None:
        self.bytes += len(data)
        if self.fmt == "mp3":
            self._mp3(self._rest + data)

    @property
    def seconds(self) -> float:
        if self.fmt == "pcm":
            return self.bytes / PCM_BYTES_PER_S
        return self._samples / self._rate

    def _mp3(self, buf: bytes) -> None:
        i = 0
        while len(buf) - i >= 4:
            h = int.from_bytes(buf[i : i + 4], "big")
            version, layer = (h >> 19) & 3, (h >> 17) & 3  # version 3: MPEG-1, 2: MPEG-2, 0: 2.5; layer 1: III
            bitrate, rate_index, padding = (h >> 12) & 15, (h >> 10) & 3, (h >> 9) & 1
            if h >> 21 != 0x7FF or version == 1 or layer != 1 or bitrate in (0, 15) or rate_index == 3:
                i += 1  # not a frame header: look further (the stream is frames only, so this is rare)
                continue
            mpeg1 = version == 3
            rate = (44100, 48000, 32000)[rate_index] >> (0 if mpeg1 else 1 if version == 2 else 2)
            size = (144 if mpeg1 else 72) * _MP3_KBPS[mpeg1][bitrate] * 1000 // rate + padding
            if len(buf) - i < size:
                break  # the rest of this frame comes with the next bytes
            self._samples += 1152 if mpeg1 else 576
            self._rate = rate
            i += size
        self._rest = buf[i:]


def fire(environment: Any, kind: str, name: str, ms: float, length: int = 0, exception: Any = None) -> None:
    environment.events.request.fire(
        request_type=kind, name=name, response_time=ms, response_length=length, exception=exception, context={}
    )


def report_audio(environment: Any, name: str, ttfa_s: float, wall_s: float, audio: AudioCounter) -> None:
    """The custom entries of one completed request (see the module's docstring)."""
    fire(environment, "TTFA", name, ttfa_s * 1000)
    seconds = audio.seconds
    if seconds > 0:
        fire(environment, "RTF", name, wall_s / seconds * 1000)
    fire(environment, "AUDIO", name, seconds * 1000, audio.bytes)


def _error_of(body: bytes) -> str:
    try:
        err = json.loads(body)["error"]
        return f"{err.get('code')}: {err.get('message')}"
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


# ------------------------------------------------------------------------------------ the users


class SpeechUser(HttpUser):
    """``POST /v1/audio/speech``, the body read as it streams in."""

    wait_time = constant(0)

    @task
    def speech(self) -> None:
        work = workload(self.environment)
        text, voice, fmt = work.next("speech")
        name = f"speech {fmt}"
        body = {"model": "chattts", "input": text, "voice": voice, "response_format": fmt}
        t0 = time.perf_counter()
        with self.client.post(
            "/v1/audio/speech",
            json=body,
            headers=work.headers(),
            name=name,
            stream=True,
            catch_response=True,
            timeout=(10, work.timeout),
        ) as resp:
            if resp.status_code != 200:  # 0: no answer (refused, reset, timeout): resp.error says why
                resp.failure(
                    repr(resp.error) if resp.status_code == 0 else f"{resp.status_code} {_error_of(resp.content)}"
                )
                return
            audio, ttfa = AudioCounter(fmt), None
            try:
                for data in resp.iter_content(chunk_size=None):  # each piece as it arrives
                    if data and ttfa is None:
                        ttfa = time.perf_counter() - t0
                    audio.feed(data)
            except Exception as exc:  # the stream broke off (reset, timeout): a failed request
                resp.failure(f"stream broke after {audio.bytes} bytes: {exc!r}")
                return
            wall = time.perf_counter() - t0
            resp.request_meta["response_time"] = wall * 1000  # Locust's own time ends at the headers
            resp.request_meta["response_length"] = audio.bytes
            if ttfa is None:
                resp.failure("200 without audio")
                return
        report_audio(self.environment, name, ttfa, wall, audio)


class RealtimeUser(User):
    """A ``WS /v1/audio/speech/stream`` session per task: the whole text at once, then ``close``."""

    wait_time = constant(0)

    @task
    def session(self) -> None:
        work = workload(self.environment)
        text, voice, fmt = work.next("realtime")
        name = f"realtime {fmt}"
        url = self.host.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1) + WS_PATH
        t0 = time.perf_counter()
        audio, ttfa, error = AudioCounter(fmt), None, None
        ws: Optional[websocket.WebSocket] = None
        try:
            headers = [f"Authorization: Bearer {work.key}"] if work.key else []
            ws = websocket.create_connection(url, timeout=work.timeout, header=headers)
            ws.send(json.dumps({"type": "session.start", "voice": voice, "response_format": fmt}))
            t_text = time.perf_counter()
            ws.send(json.dumps({"type": "text.append", "text": text}, ensure_ascii=False))
            ws.send(json.dumps({"type": "close"}))
            done: Optional[dict] = None
            while True:
                opcode, data = ws.recv_data()
                if opcode == websocket.ABNF.OPCODE_BINARY:
                    if ttfa is None:
                        ttfa = time.perf_counter() - t_text
                    audio.feed(data)
                elif opcode == websocket.ABNF.OPCODE_TEXT:
                    event = json.loads(data)
                    if event.get("type") == "done":
                        done = event
                    elif event.get("type") == "error":
                        error = "{code}: {message}".format(**event["error"])
                elif opcode == websocket.ABNF.OPCODE_CLOSE:
                    code = int.from_bytes(data[:2], "big") if len(data) >= 2 else 1005
                    break
            wall = time.perf_counter() - t_text
            if code != 1000 or done is None:
                error = f"closed {code} {error or 'before done'}"
            elif ttfa is None:
                error = "done without audio"
            elif abs(done["audio_seconds"] - audio.seconds) > WS_AUDIO_TOLERANCE_S * max(1, done["segments"]):
                error = f"counted {audio.seconds:.3f} s of audio, the server says {done['audio_seconds']:.3f} s"
        except Exception as exc:  # handshake refused, reset, timeout
            error = repr(exc)
        finally:
            if ws is not None:
                ws.close()
        total_ms = (time.perf_counter() - t0) * 1000
        fire(self.environment, "WS", name, total_ms, audio.bytes, RuntimeError(error) if error else None)
        if error is None:
            report_audio(self.environment, name, ttfa, wall, audio)


# ------------------------------------------------------------------------------------ summary


@events.test_stop.add_listener
def _summary(environment: Any, **_: Any) -> None:
    """Audio seconds per second of each name, over the test's time (what ``python -m bench run``
    calls ``audio_s_per_s``, there from the first audio byte instead)."""
    if isinstance(environment.runner, WorkerRunner):
        return  # the master has the whole run's stats
    for (name, kind), entry in sorted(environment.runner.stats.entries.items()):
        if kind != "AUDIO" or not entry.num_requests:
            continue
        span = max(entry.last_request_timestamp - entry.start_time, 1e-9)
        log.info(
            "%s: %.2f audio s/s (%.1f s of audio in %.1f s, %d requests)",
            name,
            entry.total_response_time / 1000 / span,
            entry.total_response_time / 1000,
            span,
            entry.num_requests,
        )
