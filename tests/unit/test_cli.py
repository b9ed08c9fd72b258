"""The ``chattts-serve`` command line, run as a real subprocess (console script) with random-tiny
weights from the session's shared cache (CHATTTS_SERVE_CACHE, set by ``support.engine``). The
same command through a running server: tests/serve/test_serve_api.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import av
import pytest
import soundfile as sf
from support.audio import SR
from support.cli import cli_command
from support.engine import expected_samples, synthesize_sync

from chattts_serve.cli import build_parser
from chattts_serve.say import _format_for
from serve_app.engine.config import AcousticConfig, EngineConfig, ModelConfig
from serve_app.engine.types import SynthesisOptions
from serve_app.engine.weights.random_weights import MANIFEST
from serve_app.pipeline.local import LocalPipeline

TEXT = "你好，欢迎使用语音合成服务。Hello world, it is 10:30."


def start_cli(*args: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("CHATTTS_WEIGHTS", None)
    env.pop("CHATTTS_WEIGHTS_PATH", None)
    env["OMP_NUM_THREADS"] = "1"  # as the test process (support.engine.tiny_model): same numerics, no oversubscription
    return subprocess.Popen([*cli_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def say_runs(tmp_path_factory, tiny_model) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """``say`` to a wav and to an mp3, the two processes at once (each loads the model on one
    thread: together they take the time of one). After the session's weights exist (tiny_model)."""
    d = tmp_path_factory.mktemp("say")
    outs = {"wav": d / "x.wav", "mp3": d / "x.mp3"}
    procs = {
        "wav": start_cli("say", TEXT, "-o", str(outs["wav"]), "--weights", "random-tiny"),
        "mp3": start_cli("say", TEXT, "-o", str(outs["mp3"]), "--weights", "random-tiny", "--format", "mp3"),
    }
    return {k: (outs[k], finish(p)) for k, p in procs.items()}


@pytest.fixture(scope="module")
def text_samples(tiny_planner) -> int:
    """The CLI's defaults: voice alloy, no seed (the voice's seed), speed 1."""
    return expected_samples(tiny_planner.plan(TEXT, SynthesisOptions(voice="alloy")))


@pytest.mark.timeout(300)
def test_say_writes_a_24khz_mono_wav(say_runs, text_samples, tiny_model, tiny_weights_config, chattts_cache_dir):
    out, proc = say_runs["wav"]
    assert proc.returncode == 0, proc.stderr
    assert "RANDOM weights" in proc.stderr
    info = sf.info(str(out))
    assert info.samplerate == SR and info.channels == 1 and info.subtype == "PCM_16"
    pcm, sr = sf.read(str(out), dtype="int16")
    assert len(pcm) == text_samples
    assert abs(pcm).max() > 0
    assert out.stat().st_size == 44 + 2 * text_samples
    # It used the session's build (no second tree in the shared cache).
    trees = [p for p in chattts_cache_dir.iterdir() if p.name.startswith("random-tiny")]
    assert trees == [tiny_model.weights.root]
    # Same text + voice + seed in another process: the same audio as in-process synthesis with
    # the same defaults (int8 GPT layers on CPU: the session's float32 model is not the CLI's).
    cfg = EngineConfig(
        model=ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1),
        acoustic=AcousticConfig(listener_margin_s=None),
    )
    pipeline = LocalPipeline.from_config(cfg)
    try:
        local = synthesize_sync(pipeline, TEXT, "wav", SynthesisOptions(voice="alloy"))
    finally:
        pipeline.close()
    assert local == out.read_bytes()


@pytest.mark.timeout(300)
def test_say_mp3(say_runs, text_samples):
    out, proc = say_runs["mp3"]
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:3] == b"ID3" or data[0] == 0xFF  # an mp3 stream, not a WAV
    with av.open(io.BytesIO(data), format="mp3") as container:
        stream = container.streams.audio[0]
        n = sum(f.samples for f in container.decode(stream))
        assert stream.codec_context.sample_rate == SR
        assert stream.codec_context.channels == 1
    seconds = text_samples / SR
    assert seconds <= n / SR <= seconds + 0.1


@pytest.mark.timeout(120)
def test_weights_build_prints_the_path(tmp_path, tiny_model):
    d = tmp_path / "weights"
    # Both at once: a build into --dir, and one without it (CHATTTS_SERVE_CACHE: the session's tree).
    procs = [
        start_cli("weights", "build", "--source", "random-tiny", "--dir", str(d)),
        start_cli("weights", "build", "--source", "random-tiny"),
    ]
    proc, cached = (finish(p, 120) for p in procs)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.parent == d and path.name == tiny_model.weights.root.name
    assert json.loads((path / MANIFEST).read_text())["kind"] == "random-tiny"
    assert (path / "asset" / "gpt" / "model.safetensors").is_file()
    # Without --dir it uses CHATTTS_SERVE_CACHE: the session's tree, already built.
    assert cached.returncode == 0, cached.stderr
    assert Path(cached.stdout.strip().splitlines()[-1]) == tiny_model.weights.root


def test_format_from_suffix_and_flags():
    assert _format_for("a.ogg", None) == "opus"
    assert _format_for("a.raw", None) == "pcm"
    assert _format_for("a.m4a", None) == "aac"
    assert _format_for("a.FLAC", None) == "flac"
    assert _format_for("a.unknown", None) == "wav"
    assert _format_for("a.wav", "mp3") == "mp3"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["say", "hi"])  # -o is required
    with pytest.raises(SystemExit):
        build_parser().parse_args(["say", "hi", "-o", "x.wav", "--format", "ogg"])


def test_say_stdin_needs_a_server_and_a_stream_format():
    from chattts_serve.cli import main

    for argv in (
        ["say", "--stdin", "-o", "x.pcm"],
        ["say", "--stdin", "-o", "x.wav", "--url", "http://h"],
        ["say", "hi", "--stdin", "-o", "x.pcm", "--url", "http://h"],
        ["say", "-o", "x.wav"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv


@pytest.mark.parametrize(
    ("text", "extra", "code"),
    [("。。", [], "empty_input"), ("你好。", ["--voice", "nosuch"], "voice_not_found")],
)
def test_say_tells_a_refused_input_in_one_line(tmp_path, tiny_model, capsys, text, extra, code):
    """What the API answers 400 (the one error table) is one line and exit status 1, not a
    traceback, and no file is left behind."""
    from chattts_serve.cli import main

    out = tmp_path / "x.wav"
    assert main(["say", text, "-o", str(out), "--weights", "random-tiny", *extra]) == 1
    err = capsys.readouterr().err
    assert f"({code})" in err and "Traceback" not in err, err
    assert not out.exists()


def test_batch_flags_map_onto_the_config():
    """``batch``'s actor flags (each actor runs the whole speech pipeline) into a valid ``BatchConfig``."""
    from chattts_serve.cli import batch_config

    flags = ["--actors", "2", "--actor-cpus", "0.5", "--actor-threads", "1"]
    args = build_parser().parse_args(["batch", "in.jsonl", "--out", "out", *flags, "--rows-per-call", "8"])
    cfg = batch_config(args)
    assert (cfg.actors, cfg.actor_cpus, cfg.actor_threads, cfg.call_rows(gpu=False)) == (2, 0.5, 1, 8)
    for gone in (["--acoustic-actors", "2"], ["--vocoders", "2"]):  # the stage-per-pool layout's flags
        with pytest.raises(SystemExit):
            build_parser().parse_args(["batch", "in.jsonl", "--out", "out", *gone])
