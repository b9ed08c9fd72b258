"""``chattts-serve keys new`` and ``chattts-serve keys id``, run as real subprocesses: a new key is
random and URL-safe, its id is the one the server computes, and a key made here is one the
Ingress's key check accepts under that id (so ``security.keys.<id>`` grants reach it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from serve_app.http.security import APIKeyAuth, key_id
from serve_app.settings import KeyConfig, SecurityConfig

REPO = Path(__file__).resolve().parents[1]


def keys(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "chattts_serve.cli", "keys", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )


def test_keys_new_prints_a_random_key_and_its_id():
    first, second = keys("new"), keys("new")
    for proc in (first, second):
        assert proc.returncode == 0, proc.stderr
        (key,) = proc.stdout.splitlines()  # the key alone on stdout: KEY=$(chattts-serve keys new)
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key), key  # token_urlsafe(32): 256 bits, no ',' or '#'
        assert f"id: {key_id(key)}" in proc.stderr
        assert key not in proc.stderr
    assert first.stdout != second.stdout


def test_keys_id_reads_keys_from_stdin():
    a, b = "sk-first-key", "sk-second-key"
    one = keys("id", stdin=a + "\n")
    assert one.returncode == 0 and one.stdout.split() == [key_id(a)], one.stderr
    # As CHATTTS_API_KEYS holds them (comma-separated) or one per line; blanks ignored.
    many = keys("id", stdin=f" {a} ,{b}\n\n{b}\n")
    assert many.returncode == 0 and many.stdout.split() == [key_id(a), key_id(b), key_id(b)]
    assert a not in many.stdout + many.stderr and b not in many.stdout + many.stderr  # ids, never the keys
    empty = keys("id", stdin="\n , \n")
    assert empty.returncode == 2 and not empty.stdout and "no key" in empty.stderr


def test_a_new_key_is_accepted_under_its_id(monkeypatch):
    proc = keys("new")
    key = proc.stdout.strip()
    kid = keys("id", stdin=key).stdout.strip()
    monkeypatch.setenv("CHATTTS_TEST_KEYS_CLI", f"{key},another-key")
    auth = APIKeyAuth(
        SecurityConfig(
            auth="required", api_keys_env="CHATTTS_TEST_KEYS_CLI", keys={kid: KeyConfig(max_priority=7, max_streams=3)}
        )
    )
    caller = auth.identify(f"Bearer {key}", "10.0.0.1")
    assert caller.id == kid and caller.owner == kid
    assert caller.max_priority == 7 and caller.max_streams == 3  # the grants written under its id
