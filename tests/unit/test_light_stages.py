"""The stages that do no tensor work never load torch, ChatTTS or the engine's heavy modules.

Each check runs in a fresh interpreter, so nothing imported by other tests can hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.lib.procs import REPO_ROOT as REPO

HEAVY = ("torch", "ChatTTS", "transformers", "vocos", "av", "serve_app.engine.acoustic", "serve_app.engine.weights")


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_REPORT = """
import json, resource, sys
heavy = {heavy!r}
loaded = sorted({{m.split('.')[0] if not m.startswith('serve_app') else m for m in sys.modules}} & set(heavy))
print(json.dumps({{"loaded": loaded, "result": result, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def test_ingress_module_imports_no_torch():
    code = "import deployments.ingress, deployments.app, serve_app.storage.cache\nresult = None\n" + _REPORT.format(
        heavy=HEAVY
    )
    r = _run(code)
    assert r["loaded"] == [], r


def test_text_normalizer_stage_plans_without_torch():
    """The TextNormalizer's whole job (normalise, segment, resolve a voice), end to end."""
    code = (
        "import deployments.normalizer\n"
        "from serve_app.engine.planner import Planner\n"
        "from serve_app.engine.types import SynthesisOptions\n"
        "p = Planner(); p.warmup()\n"
        "plan = p.plan('你好，今天是2024年5月3日，气温23.5度。Call me at 10:30 tomorrow.', SynthesisOptions(voice='nova', seed=7))\n"
        "result = {'texts': plan.texts, 'seed': plan.segments[0].spk_seed, 'emb': plan.segments[0].spk_emb}\n"
        + _REPORT.format(heavy=HEAVY)
    )
    r = _run(code)
    assert r["loaded"] == [], r
    assert r["result"]["seed"] == 4444 and r["result"]["emb"] is None  # nova's seed; sampled later
    assert "2024" not in "".join(r["result"]["texts"])  # numbers were normalised
    print(f"\nTextNormalizer work without torch: peak RSS {r['maxrss_mib']:.0f} MiB")


@pytest.mark.parametrize("module", ["serve_app.engine.types", "serve_app.protocol", "serve_app.settings"])
def test_boundary_modules_are_light(module):
    r = _run(f"import {module}\nresult = None\n" + _REPORT.format(heavy=HEAVY))
    assert r["loaded"] == [], r
