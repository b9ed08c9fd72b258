"""The tests by level, and the fixtures they share.

- ``tests/unit/``: no Ray, seconds each.
- ``tests/serve/``: the session's one Serve app (``support.app``) and ``serve run`` subprocesses;
  marked ``serve`` (the in-process half of the WebSocket scenarios there needs no Ray and is not).
- ``tests/system/``: the multi-node cluster, the browser, the soak, the GPU check; marked ``system``.

The quick loop is every test without Ray: ``python -m pytest -m "not serve and not system"``.

Fixtures live in the ``support`` package and are registered here as plugins; helpers are imported
from ``support`` (a test module never imports another). Tests run by level (unit, serve,
system), each level in file order, except that every test that uses the session's Serve app runs
before every test that starts a Ray of its own (the ``serve run`` tests, marked ``own_ray``, then
the cluster, bulk and GPU checks); the session's Ray is shut down after its last user, so those
have the cores to themselves (its idle app alone holds a third of a core). As the first system
test of those begins, the scenarios marked ``early_start`` start in the background
(``support.early``): after the ``serve run`` tests, whose polite clients' latency bounds want the
cores quiet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "support.report",
    "support.engine",
    "support.app",
    "support.ws",
    "support.redis_server",
    "support.moto_s3",
    "support.serve_run",
]

_TESTS = Path(__file__).resolve().parent
LEVELS = ("unit", "serve", "system")
_LAST_APP_USER = pytest.StashKey[pytest.Item]()
_EARLY_STARTED = pytest.StashKey[bool]()


def _level(item: pytest.Item) -> str:
    """unit, serve or system, from the test's directory."""
    path = Path(str(item.path))
    level = path.relative_to(_TESTS).parts[0] if path.is_relative_to(_TESTS) else None
    if level not in LEVELS:
        raise pytest.UsageError(f"{path}: a test module belongs in tests/unit, tests/serve or tests/system")
    return level


def _uses_session_app(item: pytest.Item) -> bool:
    if item.get_closest_marker("own_ray") is not None:
        return False
    return "ray_session" in item.fixturenames or item.get_closest_marker("serve") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        level = _level(item)
        if level == "unit" and _uses_session_app(item):
            raise pytest.UsageError(f"{item.nodeid}: a unit test must not start Ray (tests/serve is for those)")
        if level == "serve" and "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.serve)
        if level == "system":
            item.add_marker(pytest.mark.system)
    # Stable: file order within each group.
    items.sort(key=lambda item: (_after_session_ray(item), LEVELS.index(_level(item))))
    users = [item for item in items if _uses_session_app(item)]
    if users:
        config.stash[_LAST_APP_USER] = users[-1]


def _after_session_ray(item: pytest.Item) -> bool:
    """A test that starts a Ray of its own (marked ``own_ray``, or a system test that does not use
    the session's): it runs after the session's Ray is down."""
    own = item.get_closest_marker("own_ray") is not None
    return own or (_level(item) == "system" and not _uses_session_app(item))


def pytest_runtest_setup(item: pytest.Item) -> None:
    early = _after_session_ray(item) and _level(item) == "system"
    if early and not item.config.stash.get(_EARLY_STARTED, False):
        item.config.stash[_EARLY_STARTED] = True
        for selected in item.session.items:
            for mark in selected.iter_markers("early_start"):
                mark.args[0].start()  # a support.early.EarlyRun


def pytest_sessionfinish(session: pytest.Session) -> None:
    from support.early import EarlyRun

    EarlyRun.stop_all()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is not None and item.config.stash.get(_LAST_APP_USER, None) is item:
        from support.app import shutdown_session_ray
        from support.report import report

        if shutdown_session_ray():
            report("session: Ray shut down after its last user", item.nodeid)
