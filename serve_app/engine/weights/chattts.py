"""ChatTTS's own code, reached piecemeal: its modules imported without running its package
``__init__`` files (``chattts_modules``, with ``_Deferred`` stand-ins for packages imported at
the first call), and a private copy of its Config with size overrides applied.

Shared by finding, building and loading weights (and by ``clips.py``): each needs ChatTTS's
config or modules, and a process that never runs the GPT must not import it to get them."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def _apply_overrides(config: Any, overrides: dict[str, dict[str, Any]]) -> None:
    """Set attributes on ChatTTS's nested Config dataclasses from dotted paths."""
    for dotted, values in overrides.items():
        target = config
        for part in dotted.split("."):
            target = getattr(target, part)
        for key, value in values.items():
            if not hasattr(target, key):
                raise KeyError(f"ChatTTS config {dotted} has no field {key!r}")
            setattr(target, key, value)


def chattts_modules(*names: str, defer: tuple[str, ...] = ()) -> list[Any]:
    """ChatTTS's modules by dotted name under the package (``"model.dvae"``, ``"config"``),
    imported without running ``ChatTTS/__init__.py`` and ``ChatTTS/model/__init__.py``: those
    import the GPT and with it transformers, ~230 MiB of RSS in a process that never runs the GPT
    (the Vocoder stage). The two packages stand in as bare namespaces while the modules load and
    go again, so a later ``import ChatTTS`` runs them for real and reuses the modules loaded
    here. Where ChatTTS is already imported, or its layout differs, a plain import.

    ``defer``: top-level packages those modules import but this process may never call, each
    replaced while they load by a stand-in whose names construct through the real package,
    imported at the first call. ``model.dvae`` imports ``vector_quantize_pytorch`` for the DVAE
    encoder's quantiser, which imports einx and with it ``torch._dynamo`` and triton (~150 MiB
    of RSS), while the Decoder is a DVAE without a quantiser. A module that needs more of a
    deferred package at import time (a submodule, a base class) makes this a plain import."""
    import importlib
    import importlib.util
    import sys
    import types

    def plain() -> list[Any]:
        return [importlib.import_module(f"ChatTTS.{n}") for n in names]

    if "ChatTTS" in sys.modules:
        return plain()
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        return plain()
    root = Path(list(spec.submodule_search_locations)[0])
    stubs: dict[str, types.ModuleType] = {}
    for pkg, path in (("ChatTTS", root), ("ChatTTS.model", root / "model")):
        stub = types.ModuleType(pkg)
        stub.__path__ = [str(path)]
        stub.__package__ = pkg
        stubs[pkg] = sys.modules[pkg] = stub
    for pkg in defer:
        if pkg not in sys.modules:
            stubs[pkg] = sys.modules[pkg] = _Deferred(pkg)
    try:
        return [importlib.import_module(f"ChatTTS.{n}") for n in names]
    except Exception:  # noqa: BLE001 - another ChatTTS layout: import it the usual way
        for n in [m for m in sys.modules if m.startswith("ChatTTS.")]:
            del sys.modules[n]
        for pkg, stub in stubs.items():
            if sys.modules.get(pkg) is stub:
                del sys.modules[pkg]
        stubs.clear()
        return plain()
    finally:
        for pkg, stub in stubs.items():
            if sys.modules.get(pkg) is stub:
                del sys.modules[pkg]


class _Deferred(ModuleType):
    """A stand-in for a package (``chattts_modules(defer=...)``): ``from pkg import Name`` gives a
    function that imports the real package on its first call and calls its ``Name``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        pkg = self.__name__

        def construct(*args: Any, **kwargs: Any) -> Any:
            import importlib

            return getattr(importlib.import_module(pkg), name)(*args, **kwargs)

        construct.__name__ = construct.__qualname__ = name
        return construct


def _fresh_chattts_config(overrides: dict[str, dict[str, Any]]) -> Any:
    """A ChatTTS Config with overrides applied; its nested defaults are shared class-level
    instances, so deep-copy before touching them."""
    import copy

    (config,) = chattts_modules("config.config")
    cfg = copy.deepcopy(config.Config())
    _apply_overrides(cfg, overrides)
    return cfg
