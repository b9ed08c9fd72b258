"""How every store is opened: ``make_<store>(cfg)`` (``make_cache``, ``make_voice_store``,
``make_lexicon_store``, ``make_job_store``) picks the backend its config names from a table of
constructors that each take that config, through ``open_store``."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, TypeVar

T = TypeVar("T")

__all__ = ["open_store"]


def open_store(backends: Mapping[str, Callable[[Any], T]], cfg: Any, backend: Optional[str] = None) -> T:
    """The store ``backend`` (default ``cfg.backend``) names, built from ``cfg``. The settings
    validate the name already; an unknown one here is a programming error."""
    name = cfg.backend if backend is None else backend
    try:
        make = backends[name]
    except KeyError:
        raise ValueError(f"no store backend {name!r}; one of {', '.join(backends)}") from None
    return make(cfg)
