"""Finding weights: a config's source (``auto``, ``local``, ``huggingface``, ``random``,
``random-tiny``, ``random-deep``) to the directory holding ChatTTS's ``asset/`` tree, as a ``ResolvedWeights``
(its asset paths, real or random, and a stable id for cache keys).

Apart from loading (``loading.py``): the serving layer resolves weights once to pin them in
every replica's config without loading anything."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from ..config import WeightsConfig
from .chattts import chattts_modules
from .random_weights import MANIFEST, build_random_weights

log = logging.getLogger(__name__)

WeightsKind = Literal["real", "random"]


@dataclass(frozen=True)
class ResolvedWeights:
    """Where the assets are and what they are."""

    source: str  # the source that was actually used
    root: Path  # directory holding asset/
    kind: WeightsKind
    weights_id: str  # stable id of these weights (cache keys use it)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def asset_paths(self) -> dict[str, str]:
        (config,) = chattts_modules("config.config")
        return {k: str(self.root / v) for k, v in asdict(config.Path()).items()}


def _asset_root(path: Path) -> Path:
    """Accept either the directory holding asset/ or asset/ itself."""
    path = path.expanduser()
    if (path / "asset").is_dir():
        return path
    if path.name == "asset" and path.is_dir():
        return path.parent
    raise FileNotFoundError(f"no ChatTTS asset directory under {path}")


def _hub_snapshot() -> Optional[Path]:
    """The newest cached snapshot of 2Noise/ChatTTS, as ChatTTS's own loader finds it."""
    hf_home = Path(os.getenv("HF_HOME", Path.home() / ".cache" / "huggingface"))
    snaps = hf_home / "hub" / "models--2Noise--ChatTTS" / "snapshots"
    if not snaps.is_dir():
        return None
    found = [p for p in snaps.iterdir() if (p / "asset" / "gpt").is_dir()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _download_from_hub(timeout_s: float) -> Optional[Path]:
    """ChatTTS's download (snapshot_download of the published files), bounded in time."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout_s)))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(timeout_s)))
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id="2Noise/ChatTTS", allow_patterns=["*.yaml", "*.json", "*.safetensors"])
    except Exception as exc:  # noqa: BLE001 - any hub failure means "not available"
        log.warning("ChatTTS weights not reachable on the hub: %s", exc.__class__.__name__)
        return None
    return Path(path)


def _real_weights_id(root: Path) -> str:
    h = hashlib.sha256()
    for rel in ("asset/gpt/config.json", "asset/gpt/model.safetensors", "asset/Decoder.safetensors"):
        p = root / rel
        h.update(rel.encode())
        if p.is_file():
            st = p.stat()
            h.update(f"{st.st_size}:{int(st.st_mtime)}".encode())
    return "real-" + h.hexdigest()[:12]


def _from_root(root: Path, source: str) -> ResolvedWeights:
    manifest = root / MANIFEST
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        return ResolvedWeights(source, root, "random", m["weights_id"], m.get("overrides", {}))
    return ResolvedWeights(source, root, "real", _real_weights_id(root))


def resolve_weights(cfg: WeightsConfig) -> ResolvedWeights:
    """Find (or build) the weights a config asks for. Applies the CHATTTS_WEIGHTS override."""
    cfg = cfg.resolved()
    src = cfg.source
    if src in ("random", "random-tiny", "random-deep"):
        return _from_root(build_random_weights(src, cfg.cache_path, cfg.seed), src)
    if src == "local":
        if not cfg.path:
            raise ValueError("weights source 'local' needs a path")
        return _from_root(_asset_root(Path(cfg.path)), "local")
    if src == "huggingface":
        snap = _hub_snapshot() or _download_from_hub(cfg.hub_timeout_s)
        if snap is None:
            raise RuntimeError("ChatTTS weights are neither in the hub cache nor downloadable")
        return _from_root(_asset_root(snap), "huggingface")
    # auto: local path, hub cache, hub, then random (loudly).
    if cfg.path:
        with contextlib.suppress(FileNotFoundError):
            return _from_root(_asset_root(Path(cfg.path)), "local")
        log.warning("weights path %s has no ChatTTS assets; trying the hub", cfg.path)
    snap = _hub_snapshot()
    if snap is None and not os.environ.get("HF_HUB_OFFLINE"):
        snap = _download_from_hub(cfg.hub_timeout_s)
    if snap is not None:
        return _from_root(_asset_root(snap), "huggingface")
    log.warning(
        "NO REAL ChatTTS WEIGHTS FOUND: serving RANDOM weights (noise, not speech). "
        "Put real weights in the hub cache or set weights.path / CHATTTS_WEIGHTS_PATH."
    )
    return _from_root(build_random_weights("random", cfg.cache_path, cfg.seed), "random")
