"""The project on Ray Serve: ``ServeRunner`` deploys a config (bench/lib/config.py) the way
``serve run config.yaml`` does it: ``ray.init`` of a local cluster in this process, Serve
started with the config's HTTP options, then the controller applies the whole config (so
``deployments:`` overrides, ``user_config`` and autoscaling behave exactly as in production).
Switching continuous/window batching re-applies the config with a changed Acoustic
``user_config`` (``reconfigure`` on the running replica, no restart).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any, Optional

import httpx

from .config import app_name, deployment_path, get_path, set_path
from .machine import classify_serve, processes_by_group
from .procs import isolate_environ
from .waiting import NotMet, wait_until

log = logging.getLogger("bench.serve")


# Serve's Python HTTP proxy (default), or Ray's bundled HAProxy in front of HTTP servers inside the
# Ingress replicas.
HAPROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_NBTHREAD": "1"}
FRONT_DOORS = {"proxy": {}, "haproxy": HAPROXY_ENV}


def add_app_arguments(p: Any, url: Optional[str] = None, weights: str = "random-tiny") -> None:
    """The options of a runner that starts the app (``ServeRunner.from_args``) or, with ``url`` (its
    help), measures a running one."""
    if url:
        p.add_argument("--url", help=url)
    p.add_argument("--weights", default=weights, choices=["random", "random-tiny"])
    p.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="a config value (as in `run`)")
    p.add_argument("--ray-cpus", type=float, help="CPUs Ray may schedule (default: all)")


class ServeRunner:
    """``start()`` a local Ray cluster + Serve with the config; ``stop()`` removes all of it."""

    def __init__(
        self,
        cfg: dict,
        ray_cpus: Optional[float] = None,
        ready_timeout_s: float = 600.0,
        front_door: str = "proxy",
        front_guard: bool = False,
    ):
        if front_door not in FRONT_DOORS:
            raise ValueError(f"front_door must be one of {sorted(FRONT_DOORS)}")
        self.front_door = front_door
        self.front_guard = front_guard  # deployments/proxy/front_guard.py in the proxy (docs/operations.md)
        self.cfg = cfg
        self.app = app_name(cfg)
        self.port = int(cfg["http_options"]["port"])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ray_cpus = ray_cpus or os.cpu_count()
        self.ready_timeout_s = ready_timeout_s
        self.session_dir: Optional[str] = None
        self._client = None
        self._started = False

    @classmethod
    def from_args(cls, a: Any, overrides: Optional[dict] = None, **kw: Any) -> "ServeRunner":
        """The app of ``add_app_arguments``'s options (``--set`` over ``overrides``) on a free loopback port."""
        from .config import apply_overrides, load_config, parse_sets
        from .procs import free_port

        overrides = {**(overrides or {}), **parse_sets(a.set)}
        return cls(
            apply_overrides(load_config(a.config), weights=a.weights, port=free_port(), overrides=overrides),
            a.ray_cpus,
            **kw,
        )

    # -------------------------------------------------------------- lifecycle

    def start(self, progress=None) -> float:
        import ray
        from ray.serve._private import api as serve_api
        from ray.serve.schema import ServeDeploySchema

        isolate_environ()
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # keep the progress bar readable
        # Read by the controller and the replicas that ray.init starts (docs/operations.md, "Fast front door").
        for key in HAPROXY_ENV:
            os.environ.pop(key, None)
        os.environ.update(FRONT_DOORS[self.front_door])
        from serve_app.settings import HOOK_ENV, IMPORT_PATH

        os.environ.pop(HOOK_ENV, None)
        if self.front_guard:
            os.environ[HOOK_ENV] = IMPORT_PATH
        t0 = time.perf_counter()
        schema = ServeDeploySchema.model_validate(self.cfg)  # fail early on a bad override
        self._started = True
        # "local": always a cluster of its own, never one a parent process points at (RAY_ADDRESS).
        ray.init(
            address="local",
            num_cpus=self.ray_cpus,
            namespace="serve",
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        try:
            self.session_dir = ray._private.worker._global_node.get_session_dir_path()
        except Exception:  # noqa: BLE001 - only for the report
            self.session_dir = None
        self._client = serve_api.serve_start(
            http_options=schema.http_options.model_dump(),
            proxy_location=schema.proxy_location,
        )
        self._client.deploy_apps(schema)
        self._wait_running()
        wait_ready(self.base_url, self.ready_timeout_s, failed_is_final=True)
        return time.perf_counter() - t0

    def _wait_running(self) -> None:
        from ray import serve

        def status() -> Optional[str]:
            app = serve.status().applications.get(self.app)
            if app is not None and app.status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"Serve app {self.app} {app.status}: {app.message}")
            return app and app.status

        wait_until(
            status, self.ready_timeout_s, 1.0, until=lambda x: x == "RUNNING", what=f"Serve app {self.app} RUNNING"
        )

    def reconfigure_acoustic(self, **user_config: Any) -> None:
        """Re-apply the config with changed Acoustic ``user_config`` keys (no replica restart), and
        wait until the replica reports them (in its engine config, or its own stats)."""
        from ray.serve.schema import ServeDeploySchema

        cfg = copy.deepcopy(self.cfg)
        base = f"{deployment_path(cfg, 'Acoustic')}.user_config"
        for k, v in user_config.items():
            set_path(cfg, f"{base}.{k}", v)
        self._client.deploy_apps(ServeDeploySchema.model_validate(cfg))
        self.cfg = cfg
        time.sleep(2.0)  # let the controller see the new version before polling its status
        self._wait_running()

        def applied() -> bool:
            s = self.acoustic_stats() or {}
            engine = s.get("config") or {}
            return all(engine.get(k, s.get(k, v)) == v for k, v in user_config.items())

        wait_until(applied, 30, 0.3, what=f"Acoustic applying user_config {user_config}")

    def stop(self) -> None:
        if not self._started:
            return
        import ray
        from ray import serve

        try:
            if ray.is_initialized():
                serve.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.warning("serve.shutdown failed: %s", exc)
        finally:
            if ray.is_initialized():
                ray.shutdown()
            for key in HAPROXY_ENV:
                os.environ.pop(key, None)
            self._started = False

    # -------------------------------------------------------------- observation

    def acoustic_stats(self) -> Optional[dict]:
        try:
            return acoustic_stats(self.app)
        except Exception as exc:  # noqa: BLE001 - stats are a bonus, not a failure
            log.warning("Acoustic.stats() failed: %s", exc)
            return None

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Until the Acoustic engine has no running or waiting rows (after cut requests); False if
        it still had after ``timeout_s`` (stats that cannot be read count as idle)."""
        try:
            wait_idle(self.app, timeout_s, 0.5)
            return True
        except NotMet:
            return False
        except Exception as exc:  # noqa: BLE001 - stats are a bonus, not a failure
            log.warning("Acoustic.stats() failed: %s", exc)
            return True

    def replica_pids(self) -> dict[str, list[int]]:
        """pids of the Serve processes (replicas by deployment, ServeController, ProxyActor)."""
        return {g: [p.pid for p in procs] for g, procs in processes_by_group([os.getpid()], classify_serve).items()}

    def replica_env(self) -> dict:
        """Thread settings of each Serve replica: OMP/MKL_NUM_THREADS in its start environment
        (a deployment's runtime_env) or, when unset there, what Ray sets inside the worker
        before the deployment imports torch: floor(num_cpus), at least 1."""
        import math

        import psutil

        out: dict = {}
        for group, pids in self.replica_pids().items():
            if get_path(self.cfg, deployment_path(self.cfg, group)) is None:
                continue  # controller, proxy
            opts = get_path(self.cfg, f"{deployment_path(self.cfg, group)}.ray_actor_options") or {}
            cpus = opts.get("num_cpus", 1) if isinstance(opts, dict) else 1
            for pid in pids:
                try:
                    env = psutil.Process(pid).environ()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                omp = env.get("OMP_NUM_THREADS")
                effective = int(omp) if omp else max(math.floor(cpus), 1)
                entry = {"pid": pid, "num_cpus": cpus, "OMP_NUM_THREADS_env": omp, "omp_threads_effective": effective}
                out.setdefault(group, []).append(entry)
        return out


# ------------------------------------------------------------------ any running app (the bench's, the tests')


def wait_ready(url: str, timeout_s: float, proc: Any = None, failed_is_final: bool = False) -> float:
    """Poll ``GET /readyz`` until 200; the seconds it took. ``NotMet`` after ``timeout_s``;
    RuntimeError at once if ``proc`` (a subprocess serving it) exits first, or, with
    ``failed_is_final`` (an app of one Ingress replica), when it says its warm-up failed."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0, trust_env=False) as client:

        def readyz() -> str:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server process exited with {proc.returncode} before ready")
            try:
                r = client.get(url + "/readyz")
            except httpx.HTTPError as exc:
                return f"{exc.__class__.__name__}: {exc}"
            if r.status_code == 200:
                return "200"
            try:
                body = r.json()
            except ValueError:
                body = None
            if failed_is_final and isinstance(body, dict) and body.get("status") == "failed":
                raise RuntimeError(f"the app's warm-up failed: {body.get('error')}")
            return f"{r.status_code} {r.text[:200]}"

        wait_until(readyz, timeout_s, 0.5, until=lambda answer: answer == "200", what=f"{url}/readyz 200")
    return time.monotonic() - t0


def acoustic_stats(app: str) -> dict:
    """Counters of an Acoustic replica of ``app``: ``EngineStats`` plus running/waiting rows."""
    from ray import serve

    return serve.get_deployment_handle("Acoustic", app_name=app).stats.remote().result(timeout_s=30)


def wait_idle(app: str, timeout_s: float, interval_s: float = 0.05) -> dict:
    """The Acoustic counters once no row runs or waits (``NotMet`` after ``timeout_s``)."""
    idle = lambda s: s["running_rows"] == 0 and s["waiting_rows"] == 0  # noqa: E731
    return wait_until(lambda: acoustic_stats(app), timeout_s, interval_s, until=idle, what="no rows left to decode")


ENGINE_COUNTERS = (
    "steps",
    "row_steps",
    "admissions",
    "rows_admitted",
    "rows_finished",
    "rows_cancelled",
    "rows_failed",
)


def engine_delta(before: Optional[dict], after: Optional[dict]) -> dict:
    """Batching actually formed during a phase, from the engine's counters."""
    if not before or not after:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in (*ENGINE_COUNTERS, "prefill_seconds", "decode_seconds")}
    return {
        "mean_rows_per_step": round(d["row_steps"] / d["steps"], 3) if d["steps"] else None,
        "mean_rows_per_admission": round(d["rows_admitted"] / d["admissions"], 3) if d["admissions"] else None,
        **{k: d[k] for k in ENGINE_COUNTERS if k not in ("row_steps", "admissions")},
        "prefill_s": round(d["prefill_seconds"], 3),
        "decode_s": round(d["decode_seconds"], 3),
        "max_rows_ever": after.get("max_rows"),
    }
