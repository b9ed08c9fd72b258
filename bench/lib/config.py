"""The Serve config the bench deploys: the project's own file (``config/serve.yaml`` by default)
read, and edited by dotted path (list items by their ``name``) with the bench's overrides: weights,
loopback port, resources, replicas, threads, batching knobs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from .procs import REPO_ROOT

DEFAULT_CONFIG = REPO_ROOT / "config" / "serve.yaml"
GPU_CONFIG = REPO_ROOT / "config" / "serve.gpu.yaml"


def load_config(path: Optional[str | Path] = None) -> dict:
    """A Serve config file (default config/serve.yaml); a relative path that is not found from
    the current directory is read from the repository root."""
    path = Path(path or DEFAULT_CONFIG)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _step(node: Any, key: str, create: bool) -> Any:
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict) and item.get("name") == key:
                return item
        if key.isdigit() and int(key) < len(node):
            return node[int(key)]
        if create:
            item = {"name": key}
            node.append(item)
            return item
        raise KeyError(key)
    if key not in node or node[key] is None:
        if not create:
            raise KeyError(key)
        node[key] = {}
    return node[key]


def set_path(cfg: dict, dotted: str, value: Any) -> None:
    """``applications.chattts.deployments.Acoustic.user_config.max_batch_size`` = value.

    List items are found by their ``name`` (or an index); missing dicts/items are created.
    """
    parts = dotted.split(".")
    node: Any = cfg
    for p in parts[:-1]:
        node = _step(node, p, create=True)
    node[parts[-1]] = value


def get_path(cfg: dict, dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    try:
        for p in dotted.split("."):
            node = _step(node, p, create=False)
        return node
    except (KeyError, TypeError):
        return default


def app_name(cfg: dict) -> str:
    return cfg["applications"][0]["name"]


def deployment_path(cfg: dict, deployment: str) -> str:
    return f"applications.{app_name(cfg)}.deployments.{deployment}"


def args_path(cfg: dict) -> str:
    return f"applications.{app_name(cfg)}.args"


def apply_overrides(cfg: dict, *, weights: str = "random", port: int, overrides: Optional[dict] = None) -> dict:
    """A copy of ``cfg`` for the benchmark: loopback port, chosen weights on CPU, overrides.

    ``overrides`` maps dotted paths (see ``set_path``) to values; a ``{deployment}.replicas``
    style convenience is handled by the caller (``bench.run``).
    """
    cfg = copy.deepcopy(cfg)
    cfg["http_options"] = {**(cfg.get("http_options") or {}), "host": "127.0.0.1", "port": port}
    cfg["http_options"].setdefault("request_timeout_s", 600)
    cfg["proxy_location"] = "HeadOnly"
    args = args_path(cfg)
    set_path(cfg, f"{args}.model.weights.source", weights)
    set_path(cfg, f"{args}.model.device", "cpu")
    # Loopback only, and the load generator sends no key: the GPU config's auth: required would
    # keep the Ingress from starting.
    set_path(cfg, f"{args}.ingress.security.auth", "optional")
    # The response cache stays as configured: the load generator sends Cache-Control: no-store
    # (and a distinct seed per request), and the cache-hit phase needs the cache.
    for key, value in (overrides or {}).items():
        set_path(cfg, key, value)
    return cfg


def parse_sets(items: list[str]) -> dict:
    """``--set PATH=VALUE`` arguments (VALUE is YAML) -> overrides for ``apply_overrides``."""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set needs PATH=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def set_replicas(cfg: dict, deployment: str, n: int) -> None:
    """Fixed replica count for a deployment: autoscaling bounds min = max = n. (``num_replicas``
    alone does not do it: the deployments' decorators set an autoscaling_config, which Serve
    keeps when the config file leaves it out, and then starts min_replicas.)"""
    path = deployment_path(cfg, deployment)
    d = get_path(cfg, path)
    if d is not None:
        d.pop("num_replicas", None)
    set_path(cfg, f"{path}.autoscaling_config", {"min_replicas": n, "max_replicas": n, "initial_replicas": n})


def set_threads(cfg: dict, deployment: str, n: int) -> None:
    """torch/OpenMP threads of one deployment's replicas (env of the actor, read by torch at import)."""
    base = f"{deployment_path(cfg, deployment)}.ray_actor_options.runtime_env.env_vars"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        set_path(cfg, f"{base}.{var}", str(n))
