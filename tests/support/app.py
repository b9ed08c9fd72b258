"""The one Ray Serve app of the session: one Ray, one Serve, one ``chattts`` app for every test
that needs it (tests/serve/, the soak and the browser tests), and what tests do with it.

A pytest plugin: ``tests/conftest.py`` registers it, so its fixtures are session-scoped once;
tests import the helpers (``APP_NAME``, ``acoustic_stats``, ``ingress_settings``, ...) from it.

Starting Ray and the app (tens of seconds even with tiny random weights) is the expensive part
of the suite, so everything here is session-scoped, and tests/conftest.py runs every test that
needs it before the system tests that start their own Ray (cluster, GPU check), then shuts it
down. Tests that deploy their own apps delete them; nobody deletes the shared ``chattts`` app,
and runtime settings changed through ``reconfigure`` are always put back.

The app is config/serve.yaml's with the explicit changes of ``TEST_ARGS`` (``SERVE_APP_ARGS``)
and one replica per stage, never a copy of the config.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.lib import serve as running
from bench.lib.procs import free_port
from bench.lib.serve import wait_ready
from serve_app.settings import merged
from support.configs import chattts_app, load
from support.report import report

APP_NAME = "chattts"
READY_TIMEOUT_S = 180.0

# What the test app changes in config/serve.yaml's args; everything else is the shipped config.
TEST_ARGS: dict[str, Any] = {
    # The shipped CPU precision (int8: model.quantize's default); one torch thread.
    "model": {"weights": {"source": "random-tiny"}, "device": "cpu", "torch_threads": 1},
    # Streams wait for room rather than being refused past the replica's real-time capacity: the
    # tests send bursts on a shared 2-core box; refusals have their own test
    # (tests/serve/test_realtime_capacity.py, at the shipped 0.75 s).
    "acoustic": {"capacity_wait_s": None},
    # Tests that need a fresh synthesis use text no other test sends. 2 MiB (a test's own repeats
    # stay in it): the soak fills it during its warm-up, so RSS after warm-up measures leaks, not
    # cache fill.
    "cache": {"max_bytes": 2 * 1024 * 1024},
}


SERVE_APP_ARGS: dict[str, Any] = merged(chattts_app(load("cpu"))["args"], TEST_ARGS)


def app_args() -> Any:
    """``SERVE_APP_ARGS`` validated: the settings the test app runs with (``AppConfig``)."""
    from serve_app.settings import AppConfig

    return AppConfig.model_validate(SERVE_APP_ARGS)


# One replica per stage (no autoscaling: counters read through a handle must come from the one
# Acoustic replica). Everything else per deployment comes from config/serve.yaml, the one source
# of those numbers, except the runtime env (tests pin torch threads through the model args) and
# the batch window (wider here, so concurrent test requests reliably share a batch).
_ONE_REPLICA = {"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1}
_TEST_USER_CONFIG = {"Acoustic": {"max_batch_size": 8, "batch_wait_timeout_s": 0.05}}


def _deployment_options() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dep in chattts_app(load("cpu"))["deployments"]:
        opts = {k: v for k, v in dep.items() if k not in ("name", "autoscaling_config", "num_replicas")}
        actor = dict(opts.get("ray_actor_options", {}))
        actor.pop("runtime_env", None)
        opts["ray_actor_options"] = actor
        if dep["name"] in _TEST_USER_CONFIG:
            opts["user_config"] = {**opts.get("user_config", {}), **_TEST_USER_CONFIG[dep["name"]]}
        out[dep["name"]] = opts
    return out


def walk_graph(app) -> list:
    """Every ``Application`` node of a bound graph (ingress first), each once."""
    from ray.serve import Application

    nodes: list = []
    seen: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Application):
            if id(node) in seen:
                return
            seen.add(id(node))
            nodes.append(node)
            dep = node._bound_deployment
            walk(list(dep.init_args) + list(dep.init_kwargs.values()))
        elif isinstance(node, (list, tuple)):
            for x in node:
                walk(x)
        elif isinstance(node, dict):
            for x in node.values():
                walk(x)

    walk(app)
    return nodes


def _pin_one_replica(app) -> None:
    """Give every deployment of the bound graph one replica and the options above (in place)."""
    options = _deployment_options()
    for node in walk_graph(app):
        dep = node._bound_deployment
        opts = dict(options.get(dep.name, {}))
        node._bound_deployment = dep.options(autoscaling_config=_ONE_REPLICA, **opts)


_SESSION: dict[str, Any] = {}  # the live session Ray's teardown, while there is one


@pytest.fixture(scope="session")
def ray_session(chattts_cache_dir: Path) -> Iterator[dict[str, Any]]:
    """One local Ray (4 logical CPUs so fractional replicas fit on 2 cores) and Serve's HTTP proxy
    on 127.0.0.1:<free port>.

    The environment set before ``ray.init`` is what the raylet, and so every worker and replica,
    inherits. In this (driver) process the weights variables are put back right after
    ``ray.init``, so tests that run later in the same session (weights/CLI tests that read
    CHATTTS_WEIGHTS) see the environment they expect; RAY_AUTH_MODE stays for the session.
    Replicas export their metrics every second (Ray's default: 10 s), so the metrics tests wait
    seconds, not tens of seconds, for what they scrape.
    """
    import ray
    from ray import serve

    session_env = pytest.MonkeyPatch()
    session_env.setenv("RAY_AUTH_MODE", "disabled")
    init_env = pytest.MonkeyPatch()
    init_env.setenv("CHATTTS_WEIGHTS", "random-tiny")
    init_env.setenv("CHATTTS_SERVE_CACHE", str(chattts_cache_dir))
    init_env.setenv("RAY_metrics_report_interval_ms", "1000")
    # Serve's proxy runs the service's middlewares as the README installs them, with the front
    # guard's refusal budget off (tests send many bad requests from one address; the guard has its
    # own tests): the streams' back-pressure then reaches the client's socket.
    # The edge cache is off too: tests count what the Ingress answers (test_serve_run.py runs it).
    from deployments.proxy.edge_cache import ENV as EDGE_ENV
    from deployments.proxy.front_guard import ENV as GUARD_ENV
    from serve_app.settings import HOOK_ENV, IMPORT_PATH

    init_env.setenv(HOOK_ENV, IMPORT_PATH)
    init_env.setenv(GUARD_ENV, '{"enabled": false}')
    init_env.setenv(EDGE_ENV, '{"enabled": false}')
    init_env.delenv("CHATTTS_WEIGHTS_PATH", raising=False)
    init_env.delenv("RAY_ADDRESS", raising=False)  # always a fresh local cluster, never someone else's
    port = free_port()
    metrics_port = free_port()
    t0 = time.monotonic()
    try:
        # "local": a new cluster even where `ray start` left one to join (never someone else's).
        # The node's Prometheus endpoint on a known port, for the metrics tests.
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, _metrics_export_port=metrics_port
        )
    finally:
        init_env.undo()

    def shutdown() -> None:
        # The session's own local Ray: ray.shutdown() ends every process of it, Serve's included.
        # (serve.shutdown() first would wait out each replica's graceful shutdown: ~30 s here.)
        _stop_handle_router_loop()
        try:
            ray.shutdown()
        finally:
            session_env.undo()

    _SESSION["shutdown"] = shutdown
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        info = {
            "port": port,
            "http_url": f"http://127.0.0.1:{port}",
            "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
            "gcs_address": ray.get_runtime_context().gcs_address,
            "cache_dir": chattts_cache_dir,
            "start_s": time.monotonic() - t0,
        }
        yield info
    finally:
        shutdown_session_ray()


def _stop_handle_router_loop() -> None:
    """This process's handles route on one Serve event loop in a daemon thread; left running after
    ``ray.shutdown()``, its metrics push calls ``ray.wait``, which starts a new local Ray
    (``ray.init()``) at the interpreter's exit and logs into closed streams. Serve has no public
    call for a driver's handles, so the loop is stopped through its class (a later handle makes a
    new one)."""
    from ray.serve._private.router import SingletonThreadRouter

    loop = SingletonThreadRouter._asyncio_loop
    if loop is not None:
        loop.call_soon_threadsafe(loop.stop)
        SingletonThreadRouter._asyncio_loop = None


def shutdown_session_ray() -> bool:
    """Shut the session's Ray down now, if it runs (True then; once: later calls do nothing).
    tests/conftest.py calls it after the last test that uses it, so the system tests that start
    their own Ray have the cores to themselves."""
    shutdown = _SESSION.pop("shutdown", None)
    if shutdown is not None:
        shutdown()
    return shutdown is not None


@pytest.fixture(scope="session")
def app_url(ray_session: dict[str, Any]) -> Iterator[str]:
    """The ``chattts`` app (tiny random weights) at route ``/``, ready (``/readyz`` = 200)."""
    from ray import serve

    from deployments.app import build_app

    args = copy.deepcopy(SERVE_APP_ARGS)
    # Explicit, so the driver (which builds the weights once) and replicas agree without env.
    args["model"]["weights"]["cache_dir"] = str(ray_session["cache_dir"])
    # The default voice store is a directory in the user's data dir: the session's own instead.
    args["voices"] = {"backend": "directory", "path": str(ray_session["cache_dir"] / "voices")}
    args["jobs"] = {"path": str(ray_session["cache_dir"] / "jobs")}  # and its jobs' store
    app = build_app(args)
    _pin_one_replica(app)
    t0 = time.monotonic()
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    url = ray_session["http_url"]
    wait_ready(url, READY_TIMEOUT_S)
    ray_session["app_ready_s"] = time.monotonic() - t0
    report("session: ray.init + serve.start", f"{ray_session['start_s']:.1f} s")
    report("session: serve.run(chattts) to /readyz 200", f"{ray_session['app_ready_s']:.1f} s")
    yield url


@pytest.fixture(scope="session")
def chattts_handle(app_url: str):
    """``DeploymentHandle`` of the app's ingress (``synthesize`` / ``stream``)."""
    from ray import serve

    return serve.get_app_handle(APP_NAME)


def acoustic_stats() -> dict[str, Any]:
    """Counters of the (one) Acoustic replica: ``EngineStats`` plus running/waiting rows."""
    return running.acoustic_stats(APP_NAME)


def wait_idle(timeout_s: float = 30) -> dict[str, Any]:
    """The Acoustic counters once no row runs or waits (polled every 50 ms)."""
    return running.wait_idle(APP_NAME, timeout_s)


def _deployment(name: str):
    from ray import serve

    return serve.get_deployment_handle(name, app_name=APP_NAME)


# The Ingress's live settings as tests set them (its user_config over the app's args): a stack, so
# a test may change one setting inside a module's changes without undoing them.
_INGRESS_LIVE: list[dict[str, Any]] = [{}]


@contextlib.contextmanager
def ingress_settings(**changes: Any) -> Iterator[None]:
    """The Ingress's settings (its ``user_config``: limits, switches, ``security``) changed live
    over whatever an enclosing ``ingress_settings`` set, then put back. A user_config is the whole
    of what differs from the app's args (the Ingress merges it field by field over them), so each
    change is sent with the changes around it. Usable in async tests too (it blocks the loop only
    for the two reconfigure calls)."""
    unknown = set(changes) - set(app_args().ingress.model_dump())
    assert not unknown, unknown
    outer = _INGRESS_LIVE[-1]
    inner = merged(outer, changes)
    _deployment("Ingress").reconfigure.remote(inner).result(timeout_s=30, _skip_asyncio_check=True)
    _INGRESS_LIVE.append(inner)
    try:
        yield
    finally:
        _INGRESS_LIVE.pop()
        _deployment("Ingress").reconfigure.remote(outer).result(timeout_s=30, _skip_asyncio_check=True)


@contextlib.contextmanager
def acoustic_config(**changes: Any) -> Iterator[None]:
    """The Acoustic stage's live decode knobs (``max_rows``, ``max_queued_rows``, ...) changed,
    then put back to what the app runs with (the test app's admission window kept)."""
    window = _TEST_USER_CONFIG["Acoustic"]
    before = {k: v for k, v in app_args().acoustic.model_dump().items() if k in changes}
    assert set(before) == set(changes), set(changes) - set(before)
    _deployment("Acoustic").reconfigure.remote({**window, **changes}).result(timeout_s=30, _skip_asyncio_check=True)
    try:
        yield
    finally:
        _deployment("Acoustic").reconfigure.remote({**window, **before}).result(timeout_s=30, _skip_asyncio_check=True)


def session_logs() -> Path:
    """The session's Ray log directory."""
    import ray

    return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"


def ingress_log_lines(contains: str) -> list[str]:
    """Lines of this session's Ingress replicas' logs (every app's) that contain ``contains``."""
    return [
        line
        for f in session_logs().rglob("*Ingress*")
        for line in f.read_text(errors="replace").splitlines()
        if contains in line
    ]


def live_actors() -> list[dict]:
    """This session's live actors, from the GCS actor table (the state API would need the
    dashboard, which the session's Ray does not run)."""
    from ray._private.state import state

    return [a for a in state.actor_table(None).values() if a["State"] == "ALIVE"]


def replica_pids() -> dict[str, int]:
    """Deployment name -> the pid of its (one) replica."""
    pids = {}
    for a in live_actors():
        name = a["ActorClassName"] or ""
        if name.startswith(f"ServeReplica:{APP_NAME}:"):
            pids[name.split(":")[-1]] = a["Pid"]
    return pids


def replica_actor_name(stage: str) -> str:
    for a in live_actors():
        if (a["ActorClassName"] or "") == f"ServeReplica:{APP_NAME}:{stage}":
            return a["Name"]
    raise AssertionError(f"no live {stage} replica")


def rss_mb(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    return {k: psutil.Process(p).memory_info().rss / 2**20 for k, p in pids.items()}


def lone_ingress(replicas: int = 1, **args: Any) -> Any:
    """An app of ``replicas`` Ingress replicas in front of the session app's stages, with ``args``
    (``AppConfig``'s sections: ingress, voices, jobs, ...) over the defaults."""
    from ray import serve

    from deployments.ingress import Ingress
    from serve_app.settings import AppConfig

    stage = lambda d: serve.get_deployment_handle(d, app_name=APP_NAME)  # noqa: E731
    ingress = Ingress.options(num_replicas=replicas, ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
    config = AppConfig.model_validate(args).model_dump()
    return ingress.bind(stage("TextNormalizer"), stage("Vocoder"), stage("Acoustic"), config=config)
