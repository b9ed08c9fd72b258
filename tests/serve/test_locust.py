"""bench/locustfile.py against the session's Serve app: real Locust, headless, for a few seconds,
with API keys required, both users and both formats; every entry it reports is there and none
failed. Locust runs in its own process (it monkey-patches sockets for gevent, which must never
happen in the test process).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from support.app import ingress_settings
from support.report import report

from serve_app.settings import SecurityConfig

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-locust-one"
RUN_S = 8


def _stats(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open(newline="") as f:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(f)}


def test_locust_users_report_first_audio_rtf_and_audio(app_url, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text(KEY + "\n")
    security = {**SecurityConfig().model_dump(), "api_keys_env": None, "api_keys_file": str(keys)}
    out = tmp_path / "locust"
    # 4 users: 2 SpeechUser and 2 RealtimeUser; each class's users take pcm and mp3 in turn.
    cmd = [
        *(sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"), "--host", app_url),
        *("--headless", "-u", "4", "-r", "4", "-t", f"{RUN_S}s", "--csv", str(out), "--only-summary"),
        *("--tts-format", "pcm,mp3", "--tts-chars", "24"),
    ]
    env = {**os.environ, "CHATTTS_API_KEY": KEY}  # the key by its environment variable
    with ingress_settings(security=security):
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_S + 60)
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0, logs[-3000:]  # Locust exits 1 on any failure

    stats = _stats(out.with_name("locust_stats.csv"))
    assert stats[("", "Aggregated")]["Failure Count"] == "0", stats
    assert out.with_name("locust_failures.csv").read_text().count("\n") == 1  # the header alone
    assert out.with_name("locust_exceptions.csv").read_text().count("\n") == 1

    def avg(kind: str, name: str) -> float:
        assert (kind, name) in stats, (kind, name, sorted(stats))
        row = stats[(kind, name)]
        assert int(row["Request Count"]) >= 1 and row["Failure Count"] == "0", row
        return float(row["Average Response Time"])

    for fmt in ("pcm", "mp3"):
        for name, whole in ((f"speech {fmt}", "POST"), (f"realtime {fmt}", "WS")):
            ttfa, total = avg("TTFA", name), avg(whole, name)
            assert 0 < ttfa <= total, (name, ttfa, total)
            assert avg("AUDIO", name) > 0  # ms of audio per request
            assert avg("RTF", name) > 0
            report(f"locust: {name} TTFA / whole (ms)", f"{ttfa:.0f} / {total:.0f}")
    assert "audio s/s" in logs  # the end-of-run summary per name
