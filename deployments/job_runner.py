"""The job runner as the application runs it: one detached async Ray actor per application
(``JobRunner``, found by name) over the plain runner of ``serve_app/jobs/runner.py`` (what it does
with jobs, chunks and the store is said there), speaking through the app's stages' handles.

Why an actor of its own and not a deployment: it must outlive what it serves. It is not part
of the app's deployments, so a ``serve deploy`` of a new version leaves it running (the new
Ingress replicas find it by name and hand it their settings and handles), an Ingress replica
that dies takes no job with it, and the runner itself restarts when it dies
(``max_restarts=-1``) and takes every job up again from the store.

The chunks it keeps going follow the app's running Acoustic replicas, read from Serve's status
at each scan; Serve routes every chunk's calls to any replica.

The Ingress imports this module: nothing here imports torch or PyAV but the final encoding,
inside the actor.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from deployments.backends import install
from serve_app.jobs import runner
from serve_app.pipeline.handles import HandlesPipeline
from serve_app.settings import JobsConfig

log = logging.getLogger("ray.serve")

NAMESPACE = "chattts_serve"


def runner_name(app_name: str) -> str:
    return f"job-runner:{app_name}"


def job_runner(app_name: str, settings: JobsConfig, normalizer: Any, vocoder: Any) -> Any:
    """The application's runner (created by the first replica that asks, found by the others);
    ``normalizer`` and ``vocoder``: the stages' handles it synthesises with."""
    import ray

    actor = ray.remote(JobRunner).options(
        name=runner_name(app_name),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        num_cpus=settings.runner_num_cpus,
        max_concurrency=1000,
    )
    return actor.remote(settings.model_dump(), normalizer, vocoder)


class JobRunner(runner.JobRunner):
    """The Ray actor. Async: every method runs on one event loop, file work in threads."""

    pipeline: HandlesPipeline

    def __init__(self, settings: dict, normalizer: Any, vocoder: Any):
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        super().__init__(JobsConfig.model_validate(settings), HandlesPipeline(normalizer, vocoder))

    async def configure(self, settings: dict, normalizer: Any = None, vocoder: Any = None) -> None:
        """The settings and stages of the Ingress that calls (each replica calls every few seconds:
        a new app version's reach a runner that outlived the old one, or restarted)."""
        if normalizer is not None:
            self.pipeline.normalizer = normalizer
        if vocoder is not None:
            self.pipeline.vocoder = vocoder
        self.reconfigure(JobsConfig.model_validate(settings))

    def _count_replicas(self) -> Optional[int]:
        """Running Acoustic replicas of the Vocoder's application (Serve's status, from its
        controller); None when Serve cannot say."""
        app = getattr(self.pipeline.vocoder, "app_name", None)
        try:
            import ray
            from ray import serve

            if not ray.is_initialized():  # a runner driven in-process (tests): never start a Ray here
                return None
            dep = serve.status().applications[app].deployments["Acoustic"]
            return sum(n for state, n in dep.replica_states.items() if str(getattr(state, "value", state)) == "RUNNING")
        except Exception as exc:  # noqa: BLE001 - no app (yet), or the controller is busy: next scan
            log.debug("jobs: Acoustic replicas of %r unknown (%s)", app, exc.__class__.__name__)
            return None
