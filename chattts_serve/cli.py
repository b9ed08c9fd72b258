"""``chattts-serve``: speak a line to a file (in-process or through a running server), speak lines
as they arrive on stdin (through a server's WebSocket), synthesise a whole data set on a Ray
cluster (``batch``), build weights, make API keys."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from .say import FORMATS, say


def _batch(args: argparse.Namespace) -> int:
    """Exit status 0 when every row has its audio, 3 when some rows are in the errors file."""
    from pydantic import ValidationError

    from deployments.bulk.job import run_batch
    from deployments.bulk.output import OutputLocked

    try:
        summary = run_batch(batch_config(args), progress=not args.no_progress)
    except (ValidationError, ValueError, OutputLocked) as exc:
        print(f"batch: {exc}", file=sys.stderr)
        return 2
    print(summary.text(), file=sys.stderr)
    return 3 if summary.failed else 0


# ``batch`` flags that map one to one onto BatchConfig fields (their defaults live there).
BATCH_OPTIONS = (
    "input_format",
    "default_format",
    "address",
    "num_cpus",
    "device",
    "dtype",
    "quantize",
    "actors",
    "num_gpus",
    "actor_cpus",
    "actor_threads",
    "max_rows",
    "rows_per_call",
)


def batch_config(args: argparse.Namespace):
    """``batch``'s flags as a ``BatchConfig`` (validated: a ``ValidationError`` names the bad one)."""
    from deployments.bulk.config import BatchConfig

    given = {k: getattr(args, k) for k in BATCH_OPTIONS if getattr(args, k) is not None}
    weights = {"source": args.weights or "auto", **({"path": args.weights_path} if args.weights_path else {})}
    return BatchConfig.model_validate({"input": args.input, "out": args.out, "weights": weights, **given})


def _weights_build(args: argparse.Namespace) -> int:
    from serve_app.engine.config import WeightsConfig
    from serve_app.engine.weights.random_weights import build_random_weights

    t0 = time.perf_counter()
    path = build_random_weights(args.source, WeightsConfig(cache_dir=args.dir).cache_path, args.seed)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    print(path)
    print(f"{args.source}: {size / 1e6:.0f} MB, ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _keys_new(args: argparse.Namespace) -> int:
    """A new random API key on stdout (alone: ``KEY=$(chattts-serve keys new)``), its id on stderr."""
    import secrets

    from serve_app.http.security import key_id

    key = secrets.token_urlsafe(32)  # 256 random bits; URL-safe base64: no ',' (the env var's separator)
    print(key)
    print(f"id: {key_id(key)}  (its grants go under ingress.security.keys.{key_id(key)})", file=sys.stderr)
    return 0


def _keys_id(args: argparse.Namespace) -> int:
    """The id of each key read from stdin (one per line, or comma-separated as in CHATTTS_API_KEYS):
    the fingerprint logs, limits and ``security.keys`` use. The key never goes on the command line
    (shell history, ``ps``) and is never printed."""
    from serve_app.http.security import key_id

    keys = [k.strip() for line in sys.stdin.read().splitlines() for k in line.split(",")]
    keys = [k for k in keys if k]
    if not keys:
        print("keys id: no key on stdin (pipe it in: chattts-serve keys id < keyfile)", file=sys.stderr)
        return 2
    for key in keys:
        print(key_id(key))
    return 0


def _wyoming(args: argparse.Namespace) -> int:
    """A Wyoming protocol server (Home Assistant) in front of a running service, until Ctrl-C."""
    from pydantic import ValidationError

    from serve_app.wyoming import WyomingConfig, serve

    logging.getLogger("chattts_serve.wyoming").setLevel(logging.INFO)  # a line per synthesis
    given = {k: getattr(args, k) for k in WYOMING_OPTIONS}
    try:
        settings = WyomingConfig.from_env(key_file=args.api_key_file, **given)
    except (ValidationError, OSError) as exc:
        print(f"wyoming: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings))
    return 0


# ``wyoming`` flags that map one to one onto WyomingConfig (and its limits) fields.
WYOMING_OPTIONS = (
    "uri",
    "base_url",
    "voice",
    "zeroconf",
    "zeroconf_name",
    "max_text_chars",
    "max_synthesize_per_connection",
    "max_connections",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chattts-serve", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="synthesise TEXT (or lines from stdin, --stdin) to a file")
    say.add_argument("text", nargs="?")
    say.add_argument("-o", "--output", required=True, help="the file, or - for stdout")
    say.add_argument(
        "--stdin", action="store_true", help="speak lines as they arrive on stdin (needs --url; pcm, opus or mp3)"
    )
    say.add_argument("--voice", default="alloy", help="OpenAI voice name, seed:<n> or a ChatTTS speaker string")
    say.add_argument("--seed", type=int, default=None)
    say.add_argument("--speed", type=float, default=1.0)
    say.add_argument("--lang", choices=("zh", "en"), default=None)
    say.add_argument(
        "--text-normalization",
        choices=("auto", "on", "off"),
        default="auto",
        help="on: numbers, units and symbols read as words; off: the text as written (digits one by one)",
    )
    say.add_argument("--format", choices=FORMATS, default=None, help="default: from the file suffix")
    say.add_argument(
        "--weights",
        choices=("auto", "huggingface", "local", "random", "random-tiny", "random-deep"),
        default=None,
        help="weights source (in-process only; CHATTTS_WEIGHTS overrides)",
    )
    say.add_argument("--weights-path", default=None, help="asset directory for --weights local")
    say.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "mps"))
    say.add_argument("--url", default=None, help="speak through a running server instead of in-process")
    say.add_argument("--api-key", default=None)

    batch = sub.add_parser(
        "batch",
        help="synthesise every row of a JSONL/CSV/Parquet file on Ray (resumable): audio files, a manifest",
        description="Each row (id, text, and optionally voice, seed, speed, response_format and the other request "
        "options) becomes OUT/audio/<id>.<format> and a row of OUT/manifest.parquet; rows that cannot be "
        "synthesised go to OUT/errors.jsonl. Run it again with the same OUT to finish an interrupted run: rows "
        "already written are skipped. Voices: built-in names, seed:<n>, ChatTTS speaker strings (not a service's "
        "stored voices). Exit status 3 when some rows failed.",
    )
    batch.add_argument("input", help="JSONL, CSV or Parquet: a file, directory or glob (every node must read it)")
    batch.add_argument("--out", required=True, help="output directory on this machine")
    batch.add_argument(
        "--input-format", choices=("jsonl", "csv", "parquet"), default=None, help="default: from the suffix"
    )
    batch.add_argument(
        "--format",
        dest="default_format",
        choices=FORMATS,
        default=None,
        help="response_format of rows that set none (default wav)",
    )
    batch.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (auto, ray://host:10001); default RAY_ADDRESS, else a local Ray",
    )
    batch.add_argument("--num-cpus", type=float, default=None, help="CPUs of the local Ray (default: all cores)")
    batch.add_argument(
        "--weights",
        choices=("auto", "huggingface", "local", "random", "random-tiny", "random-deep"),
        default=None,
        help="weights source, as model.weights.source (CHATTTS_WEIGHTS overrides)",
    )
    batch.add_argument("--weights-path", default=None, help="asset directory for --weights local (on every node)")
    batch.add_argument("--device", default=None, choices=("auto", "cpu", "cuda", "mps"))
    batch.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "float16", "bfloat16"),
        help="GPT dtype (default bfloat16 on a GPU, float32 on CPU)",
    )
    batch.add_argument(
        "--quantize",
        default=None,
        choices=("auto", "none", "int8"),
        help="int8 GPT layers on CPU (auto: int8 on CPU); none decodes each row the same in any batch",
    )
    # Each actor runs the whole speech pipeline.
    batch.add_argument(
        "--actors",
        dest="actors",
        type=int,
        default=None,
        help="speech actors (default: one per --num-gpus share of every GPU, else one per node)",
    )
    batch.add_argument("--num-gpus", type=float, default=None, help="GPU share per actor (default 0.5 with GPUs)")
    batch.add_argument(
        "--actor-cpus",
        dest="actor_cpus",
        type=float,
        default=None,
        help="Ray CPUs per actor (default 1 on a GPU, else a node's CPUs less a read task's)",
    )
    batch.add_argument(
        "--actor-threads",
        dest="actor_threads",
        type=int,
        default=None,
        help="torch threads of an actor's decode (default: its CPUs)",
    )
    batch.add_argument(
        "--max-rows", type=int, default=None, help="segments decoded together per actor (default 16 CPU, 64 GPU)"
    )
    batch.add_argument(
        "--rows-per-call",
        type=int,
        default=None,
        help="input rows an actor call speaks at once (default --max-rows); an actor runs two calls at a time",
    )
    batch.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars")

    weights = sub.add_parser("weights", help="weights tools")
    wsub = weights.add_subparsers(dest="weights_command", required=True)
    build = wsub.add_parser("build", help="build random weights in ChatTTS's asset layout")
    build.add_argument("--source", choices=("random", "random-tiny", "random-deep"), required=True)
    build.add_argument("--dir", default=None, help="cache directory (default ~/.cache/chattts-serve)")
    build.add_argument("--seed", type=int, default=0)

    keys = sub.add_parser("keys", help="API keys: make one, or tell a key's id")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    ksub.add_parser("new", help="print a new random key (stdout) and its id (stderr)")
    ksub.add_parser("id", help="print the id of each key read from stdin (one per line or comma-separated)")

    wyoming = sub.add_parser(
        "wyoming",
        help="serve the Wyoming protocol (Home Assistant) in front of a running service",
        description="A Wyoming TTS server that speaks through the service's public API: CHATTTS_BASE_URL "
        "(default http://127.0.0.1:8000) and CHATTTS_API_KEY from the environment; flags override.",
    )
    wyoming.add_argument("--uri", default=None, help="where to listen (default tcp://0.0.0.0:10200; unix://PATH)")
    wyoming.add_argument("--base-url", default=None, help="the service (default: CHATTTS_BASE_URL)")
    wyoming.add_argument(
        "--api-key-file", type=Path, default=None, help="a file whose first line is the key (default: CHATTTS_API_KEY)"
    )
    wyoming.add_argument("--voice", default=None, help="voice when the client names none (default alloy)")
    wyoming.add_argument(
        "--zeroconf", action="store_true", default=None, help="announce the server over mDNS for Home Assistant"
    )
    wyoming.add_argument("--zeroconf-name", default=None, help="the name announced (default chattts-serve)")
    wyoming.add_argument("--max-text-chars", type=int, default=None, help="characters per synthesize (default 4096)")
    wyoming.add_argument(
        "--max-synthesize-per-connection", type=int, default=None, help="syntheses running or waiting (default 2)"
    )
    wyoming.add_argument("--max-connections", type=int, default=None, help="open connections (default 32)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "keys":  # no model library to import or quiet
        return _keys_new(args) if args.keys_command == "new" else _keys_id(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from serve_app.engine.quiet import quiet_libraries

    quiet_libraries()
    if args.command == "say":
        return say(args, build_parser().error)
    if args.command == "batch":
        return _batch(args)
    if args.command == "weights":
        return _weights_build(args)
    if args.command == "wyoming":
        return _wyoming(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
