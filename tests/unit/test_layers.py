"""The code's layers, checked from the source (docs/architecture.md, "Layers"): a module imports
only from its own layer or the ones below it, and nothing below the Ray layer imports Ray.

    engine < errors, settings, protocol, callers, metrics, client < storage < pipeline
      < http, jobs < realtime, wyoming, elevenlabs < deployments (the Ray layer) < chattts_serve (the command line)

A module's layer is its longest prefix in ``LAYERS``. Imports are read with ``ast`` (also those
inside functions: a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[2]

LAYERS = {
    "serve_app.engine": 0,
    "serve_app.errors": 1,
    "serve_app.settings": 1,
    "serve_app.protocol": 1,
    "serve_app.callers": 1,
    "serve_app.metrics": 1,
    "serve_app.client": 1,
    "serve_app.storage": 2,
    "serve_app.pipeline": 3,
    "serve_app.http": 4,
    "serve_app.jobs": 4,
    "serve_app.realtime": 5,
    "serve_app.wyoming": 5,
    "serve_app.elevenlabs": 5,
    "deployments": 6,
    "chattts_serve": 7,
}
EXACT = {"serve_app": 7}  # the package's own __init__ (not a prefix: every module has its layer)
RAY_LAYER = 6


def layer_of(module: str) -> Optional[int]:
    if module in EXACT:
        return EXACT[module]
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def modules() -> Iterator[tuple[str, Path]]:
    for top in ("serve_app", "deployments", "chattts_serve"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative ones resolved."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "serve_app":  # the bare package: its names are checked one by one below
                yield target, node.lineno
            for alias in node.names:  # "from serve_app import metrics" names a module
                yield f"{target}.{alias.name}", node.lineno


def test_every_module_has_a_layer():
    assert [m for m, _ in modules() if layer_of(m) is None] == []


def test_no_module_imports_from_a_layer_above_its_own():
    wrong = []
    for module, path in modules():
        own = layer_of(module)
        for target, line in imports(module, path):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {target} ({theirs})")
    assert wrong == []


def test_only_the_ray_layer_imports_ray():
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for module, path in modules()
        if layer_of(module) != RAY_LAYER and layer_of(module) < RAY_LAYER
        for target, line in imports(module, path)
        if target == "ray" or target.startswith("ray.")
    ]
    assert wrong == []
