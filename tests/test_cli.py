"""The ``chattts-serve`` command line, run as a real subprocess (console script) with random-tiny
weights from the session's shared cache (CHATTTS_SERVE_CACHE, set in conftest.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import pytest
import soundfile as sf

from serve_app.tools.cli import _format_for, build_parser
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.config import AcousticConfig, EngineConfig, ModelConfig
from serve_app.engine.pipeline import SynthesisOptions, Synthesizer
from serve_app.engine.weights import MANIFEST

TEXT = "你好，欢迎使用语音合成服务。Hello world, it is 10:30."
SR = 24000


def cli_command() -> list[str]:
    script = Path(sys.executable).parent / "chattts-serve"
    if script.is_file():
        return [str(script)]
    found = shutil.which("chattts-serve")
    return [found] if found else [sys.executable, "-m", "serve_app.tools.cli"]


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CHATTTS_WEIGHTS", None)
    env.pop("CHATTTS_WEIGHTS_PATH", None)
    env["OMP_NUM_THREADS"] = "1"  # as the test process (conftest.tiny_model): same numerics, no oversubscription
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def expected_frames(tiny_planner) -> int:
    """The CLI's defaults: voice alloy, no seed (the voice's seed), speed 1."""
    plan = tiny_planner.plan(TEXT, SynthesisOptions(voice="alloy"))
    return sum(min(r.target_tokens, r.max_new_tokens) * SAMPLES_PER_TOKEN - 256 for r in plan.segments)


@pytest.mark.timeout(300)
def test_say_writes_a_24khz_mono_wav(tmp_path, expected_frames, tiny_model, tiny_weights_config, chattts_cache_dir):
    out = tmp_path / "x.wav"
    proc = run_cli("say", TEXT, "-o", str(out), "--weights", "random-tiny")
    assert proc.returncode == 0, proc.stderr
    assert "RANDOM weights" in proc.stderr
    info = sf.info(str(out))
    assert info.samplerate == SR and info.channels == 1 and info.subtype == "PCM_16"
    pcm, sr = sf.read(str(out), dtype="int16")
    assert len(pcm) == expected_frames
    assert abs(pcm).max() > 0
    assert out.stat().st_size == 44 + 2 * expected_frames
    # It used the session's build (no second tree in the shared cache).
    trees = [p for p in chattts_cache_dir.iterdir() if p.name.startswith("random-tiny")]
    assert trees == [tiny_model.weights.root]
    # Same text + voice + seed in another process: the same audio as in-process synthesis.
    cfg = EngineConfig(model=ModelConfig(weights=tiny_weights_config, device="cpu"), acoustic=AcousticConfig(listener_margin_s=None))
    synth = Synthesizer(cfg, model=tiny_model)
    try:
        local = synth.synthesize(TEXT, "wav", SynthesisOptions(voice="alloy"))
    finally:
        synth.close()
    assert local == out.read_bytes()


@pytest.mark.timeout(300)
def test_say_mp3(tmp_path, expected_frames):
    out = tmp_path / "x.mp3"
    proc = run_cli("say", TEXT, "-o", str(out), "--weights", "random-tiny", "--format", "mp3")
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:3] == b"ID3" or data[0] == 0xFF  # an mp3 stream, not a WAV
    with av.open(io.BytesIO(data), format="mp3") as container:
        stream = container.streams.audio[0]
        n = sum(f.samples for f in container.decode(stream))
        assert stream.codec_context.sample_rate == SR
        assert stream.codec_context.channels == 1
    seconds = expected_frames / SR
    assert seconds <= n / SR <= seconds + 0.1


@pytest.mark.timeout(120)
def test_weights_build_prints_the_path(tmp_path, tiny_model):
    d = tmp_path / "weights"
    proc = run_cli("weights", "build", "--source", "random-tiny", "--dir", str(d))
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.parent == d and path.name == tiny_model.weights.root.name
    assert json.loads((path / MANIFEST).read_text())["kind"] == "random-tiny"
    assert (path / "asset" / "gpt" / "model.safetensors").is_file()
    # Without --dir it uses CHATTTS_SERVE_CACHE: the session's tree, already built.
    proc = run_cli("weights", "build", "--source", "random-tiny")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip().splitlines()[-1]) == tiny_model.weights.root


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
    from serve_app.tools.cli import main

    for argv in (["say", "--stdin", "-o", "x.pcm"], ["say", "--stdin", "-o", "x.wav", "--url", "http://h"],
                 ["say", "hi", "--stdin", "-o", "x.pcm", "--url", "http://h"], ["say", "-o", "x.wav"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv


@pytest.mark.timeout(300)
def test_say_stdin_speaks_lines_as_they_arrive(app_url, tmp_path):
    """Through the server's WebSocket: the first line's audio is in the file before the second
    line is written; the whole file is exactly both lines' audio (random weights: each segment
    lasts its planned number of tokens)."""
    from serve_fixtures import app_args

    from serve_app.engine.planner import Planner
    from waiting import wait_until

    lines = ["第一行，边写边说。", "Second line, spoken as it arrives."]
    planner = Planner(app_args().segments)
    segments = [r for line in lines for r in planner.plan(line, SynthesisOptions(voice="nova")).segments]
    expected = sum(r.target_tokens * SAMPLES_PER_TOKEN - 256 for r in segments)
    out = tmp_path / "lines.pcm"
    proc = subprocess.Popen([*cli_command(), "say", "--stdin", "--url", app_url, "--voice", "nova", "-o", str(out)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(lines[0] + "\n")
        proc.stdin.flush()
        wait_until(lambda: out.exists() and out.stat().st_size, 120, 0.05, what="the first line's audio")
        proc.stdin.write(lines[1] + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
    assert out.stat().st_size == 2 * expected
    assert f"{len(segments)} segment(s)" in proc.stderr.read()


def test_say_cuts_text_into_the_segments_the_server_does(app_url):
    """``say`` and the server share their defaults (one home for each): the running TextNormalizer
    and the CLI's planner cut a long text into the same segments with the same token caps."""
    from ray import serve

    from serve_app.engine.planner import Planner
    from serve_app.tools.cli import engine_config
    from serve_fixtures import APP_NAME

    text = ("今天我们来聊一聊语音合成服务的部署，从单机到集群，再到自动扩缩容。它需要低延迟，也需要高吞吐量，"
            "还需要在异常输入面前保持稳定。Then we speak some English too: it costs $12.50, and the meeting is at 10:30.")
    opts = SynthesisOptions(voice="nova", seed=5)
    local = Planner(engine_config(build_parser().parse_args(["say", text, "-o", "x.wav"])).segments).plan(text, opts)
    normalizer = serve.get_deployment_handle("TextNormalizer", app_name=APP_NAME)
    served = normalizer.plan.remote(text, opts).result(timeout_s=60)
    assert len(local.segments) >= 3  # max_seconds cuts it (characters alone would not)
    assert served.texts == local.texts
    assert [(r.max_new_tokens, r.target_tokens, r.seed) for r in served.segments] == \
        [(r.max_new_tokens, r.target_tokens, r.seed) for r in local.segments]
