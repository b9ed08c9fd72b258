"""``chattts-serve say``: one line to a file, in-process (``LocalPipeline``) or through a running
server (``SpeechClient``), or lines as they arrive on stdin through a server's WebSocket. An input
the API refuses is told in one line and exit status 1 (``say``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Callable, NoReturn, Optional

from serve_app.engine.audio import AUDIO_FORMATS

if TYPE_CHECKING:
    from serve_app.engine.config import EngineConfig

FORMATS = AUDIO_FORMATS
STREAM_FORMATS = ("pcm", "opus", "mp3", "ulaw", "alaw")  # one stream for text that arrives over time (the WebSocket)


def _format_for(path: str, fmt: Optional[str]) -> str:
    if fmt:
        return fmt
    suffix = Path(path).suffix.lstrip(".").lower()
    return {"ogg": "opus", "raw": "pcm", "m4a": "aac"}.get(suffix, suffix if suffix in FORMATS else "wav")


def engine_config(args: argparse.Namespace) -> "EngineConfig":
    """The server's defaults (the same classes), with this command's weights and device. Chunks
    have fixed sizes: a file has no listener to send early audio to, and fixed chunks make two
    runs byte-identical."""
    from serve_app.engine.config import AcousticConfig, EngineConfig, ModelConfig, WeightsConfig

    weights = WeightsConfig(source=args.weights or "auto", path=args.weights_path)
    return EngineConfig(
        model=ModelConfig(weights=weights, device=args.device), acoustic=AcousticConfig(listener_margin_s=None)
    )


def _say_local(args: argparse.Namespace, fmt: str) -> int:
    from tqdm import tqdm

    from serve_app.engine.types import SegmentMark, StreamSummary
    from serve_app.engine.wav import finish_file
    from serve_app.pipeline.local import LocalPipeline
    from serve_app.pipeline.prepare import OFFLINE_CALLER, offline_preparation
    from serve_app.protocol import SpeechRequest
    from serve_app.settings import IngressConfig

    # Read as the API reads a request (the same limits, instructions, SSML, voices), before the model loads.
    req = SpeechRequest(
        input=args.text,
        voice=args.voice,
        seed=args.seed,
        speed=args.speed,
        lang=args.lang,
        text_normalization=args.text_normalization,
        response_format=fmt,
    )
    pipeline = LocalPipeline.from_config(engine_config(args))
    if pipeline.model.is_random:
        print("warning: RANDOM weights (noise, not speech): no real ChatTTS weights found", file=sys.stderr)

    async def speak() -> tuple:
        prepared = await offline_preparation(IngressConfig().max_input_chars).prepare(req, OFFLINE_CALLER)
        plan = await prepared.plan(pipeline)
        summary: Optional[StreamSummary] = None
        with (
            open(args.output, "w+b") as out,
            tqdm(total=len(plan.segments), unit="seg", file=sys.stderr, desc="speaking") as bar,
        ):
            async with pipeline.audio(plan, fmt) as items:
                async for item in items:
                    if isinstance(item, bytes):
                        out.write(item)
                    elif isinstance(item, SegmentMark):
                        bar.update(1)
                    elif isinstance(item, StreamSummary):
                        summary = item
            finish_file(out, out.tell())
        return plan, summary

    t0 = time.perf_counter()
    try:
        plan, summary = asyncio.run(speak())
    finally:
        pipeline.close()
    seconds = summary.audio_seconds if summary is not None else 0.0
    elapsed = time.perf_counter() - t0
    print(
        f"wrote {args.output}: {seconds:.2f} s of audio ({fmt}) in {elapsed:.2f} s, "
        f"{len(plan.segments)} segment(s), voice {plan.voice.name}",
        file=sys.stderr,
    )
    return 0


def _say_remote(args: argparse.Namespace, fmt: str) -> int:
    from serve_app.client import SpeechClient

    with SpeechClient(args.url, api_key=args.api_key) as client:
        info = client.speak_to_file(
            args.text,
            args.output,
            voice=args.voice,
            response_format=fmt,
            speed=args.speed,
            seed=args.seed,
            text_normalization=args.text_normalization,
        )
    print(
        f"wrote {args.output}: {info.bytes} bytes, first byte after {info.ttfb_s:.3f} s, total {info.total_s:.3f} s",
        file=sys.stderr,
    )
    return 0


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines of stdin as they arrive. A daemon thread reads: a blocked read never holds up exit."""
    import threading

    loop = asyncio.get_running_loop()
    lines: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    while (line := await lines.get()) is not None:
        # A newline ends a sentence for the server: each line is spoken as soon as it is complete.
        yield line if line.endswith("\n") else line + "\n"


def _say_stdin(args: argparse.Namespace, fmt: str) -> int:
    from serve_app.client import AsyncSpeechClient

    done: dict = {}

    def on_event(event: dict) -> None:
        if event["type"] == "done":
            done.update(event)

    async def run() -> None:
        out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")
        try:
            async with AsyncSpeechClient(args.url, api_key=args.api_key) as client:
                async for data in client.stream_text(
                    _stdin_lines(),
                    voice=args.voice,
                    response_format=fmt,
                    on_event=on_event,
                    speed=args.speed,
                    seed=args.seed,
                    lang=args.lang,
                    text_normalization=args.text_normalization,
                ):
                    out.write(data)
                    out.flush()  # a player reading the pipe gets each frame at once
        finally:
            if out is not sys.stdout.buffer:
                out.close()

    asyncio.run(run())
    print(
        f"wrote {args.output}: {done.get('audio_seconds', 0):.2f} s of audio ({fmt}), {done.get('segments', 0)} segment(s)",
        file=sys.stderr,
    )
    return 0


def _refused(speak: Callable[[argparse.Namespace, str], int], args: argparse.Namespace, fmt: str) -> int:
    """``say``, with what the server would answer 4xx (empty text, an unknown voice, bad SSML:
    the API's own error table) or what a server answered, told in one line and exit status 1
    instead of a traceback."""
    from serve_app.client import SpeechError
    from serve_app.errors import to_api_error

    try:
        return speak(args, fmt)
    except SpeechError as exc:
        print(f"say: the server refused: {exc} ({exc.code})", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - a known input error is the user's to fix; the rest propagates
        known = to_api_error(exc)
        if known is None or known.status >= 500:
            raise
        print(f"say: {known.message} ({known.code})", file=sys.stderr)
    return 1


def say(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> int:
    """The ``say`` command; ``error``: the parser's usage error (exit status 2)."""
    if args.stdin:
        fmt = args.format or ("pcm" if args.output == "-" else _format_for(args.output, None))
        if args.text is not None or not args.url or fmt not in STREAM_FORMATS:
            error(f"say --stdin needs --url, no TEXT, and a format of {', '.join(STREAM_FORMATS)} (got {fmt})")
        return _refused(_say_stdin, args, fmt)
    if args.text is None:
        error("say needs TEXT (or --stdin)")
    return _refused(_say_remote if args.url else _say_local, args, _format_for(args.output, args.format))
