"""The shipped Serve configs (config/serve.yaml, config/serve.gpu.yaml) as dicts."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"cpu": REPO / "config" / "serve.yaml", "gpu": REPO / "config" / "serve.gpu.yaml"}


def load(name: str) -> dict:
    """The whole config ``name`` (``cpu`` or ``gpu``), freshly read (callers may change it)."""
    return yaml.safe_load(CONFIGS[name].read_text())


def chattts_app(config: dict) -> dict:
    apps = [a for a in config["applications"] if a["name"] == "chattts"]
    assert len(apps) == 1, [a["name"] for a in config["applications"]]
    return apps[0]


def deployments(config: dict) -> dict[str, dict]:
    """Deployment name -> its entry in the config's ``chattts`` app."""
    return {d["name"]: d for d in chattts_app(config).get("deployments", [])}
