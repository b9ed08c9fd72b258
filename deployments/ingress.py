"""Ingress stage (CPU, no torch): the HTTP API, the WebSocket sessions and the handle API.

The HTTP features are routers, each attached here in one line; a route finds its feature's
service in the app's state (``serve_app/http/state.py``), built once per replica from the one
validated ``AppConfig`` and the stages' handles. What only the Ray layer has comes from here: the
stream slots counted across replicas, the back-pressure board, the job runner, the request id.
Handle API for other Ray apps: ``synthesize(request)`` -> bytes and ``stream(request)`` (with
``.options(stream=True)``).
"""

import functools
import uuid
from typing import AsyncIterator, Union

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.backends import install
from deployments.job_runner import job_runner
from deployments.slots import SharedSlots
from deployments.stage_calls import stage_handle
from serve_app.callers import Caller
from serve_app.elevenlabs import routes as elevenlabs
from serve_app.http.app import make_app
from serve_app.http.middleware import HttpPolicy
from serve_app.http.request_log import RequestRecord
from serve_app.http.routes import health, lexicons, speech, voices
from serve_app.http.speech import as_request
from serve_app.http.state import build_state
from serve_app.jobs import routes as jobs
from serve_app.pipeline.flow import board, board_name
from serve_app.protocol import SpeechRequest, TimedSpeech, TimedSpeechRequest
from serve_app.realtime import routes as realtime
from serve_app.settings import AppConfig, IngressConfig, merged


def ingress_app() -> FastAPI:
    """The Ingress's FastAPI app: every feature's router, attached in one line each. Built in
    each replica (``__serve_build_asgi_app__``), so its state is the one the replica fills (an app
    given to ``@serve.ingress`` is frozen as a copy when the class is defined)."""
    app = make_app(HttpPolicy(IngressConfig().max_body_bytes))  # every guarded route 503 until build_state
    app.include_router(speech.router)
    app.include_router(realtime.router)
    app.include_router(elevenlabs.router)
    app.include_router(voices.router)
    app.include_router(lexicons.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    return app


# Other Ray apps calling through a DeploymentHandle are inside the cluster, past the HTTP front
# door: trusted like the operator, with no stream slot to count (their own replicas bound them).
HANDLE_CALLER = Caller(id="handle", owner="anonymous", max_priority=10, max_streams=0, max_voices=None, admin=True)


def _request_id() -> str:
    # Serve's proxy answers with X-Request-Id (the caller's, if it sent one); the same id here.
    try:
        return serve.context._get_serve_request_context().request_id or uuid.uuid4().hex
    except Exception:  # noqa: BLE001 - outside a request context
        return uuid.uuid4().hex


# Replicas, resources and autoscaling come from the config file (config/serve.yaml).
@serve.deployment
@serve.ingress()
class Ingress:
    def __init__(
        self, normalizer: DeploymentHandle, vocoder: DeploymentHandle, acoustic: DeploymentHandle, config: dict
    ):
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        self.config = AppConfig.model_validate(config)
        self._fastapi = ingress_app()
        app_name = serve.get_replica_context().app_name
        flow_board = board_name(app_name)
        board(flow_board)  # created (or found) now, not on the first request
        # The speech path's calls (speech, dialogue, sessions, the job runner) in the flow's transport;
        # the voices API's clip uploads keep Ray's actor calls (larger than gRPC's messages).
        stages = tuple(stage_handle(h, self.config.flow) for h in (normalizer, vocoder, acoustic))
        self.state = build_state(
            self._fastapi,
            self.config,
            stages,
            # One count of stream slots for every replica of this application.
            slots=SharedSlots(f"stream-slots:{app_name}"),
            clip_encoder=vocoder,
            flow_board=flow_board,
            # The application's job runner (found by name, made if missing) speaks through these stages.
            find_runner=functools.partial(job_runner, app_name, self.config.jobs, stages[0], stages[1]),
            request_id=_request_id,
        )

    async def reconfigure(self, user_config: dict) -> None:
        """Serve ``user_config``: any IngressConfig field, applied live (limits, timeouts,
        degradation switches, API keys and grants, CORS), merged field by field over the
        deployment's ``args.ingress``: a user_config naming one security field keeps the others
        (``auth: required`` among them), and one that drops a field gives it back its args value."""
        args = self.config.ingress.model_dump()
        self.state.apply(self._fastapi, IngressConfig.model_validate(merged(args, user_config or {})))

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._fastapi

    # ------------------------------------------------------------------ handle API

    async def loop_stall(self, reset: bool = False) -> dict[str, float]:
        """This replica's longest event-loop stall (ms) since its start or the last ``reset``, the
        longest while the process itself ran (``LoopWatch``), and how many stalls passed the
        warning threshold (operators and the attack tests)."""
        watch = self.state.loop_watch
        longest, busy = watch.reset() if reset else (watch.longest_s, watch.longest_busy_s)
        return {"longest_ms": round(longest * 1e3, 1), "longest_busy_ms": round(busy * 1e3, 1), "stalls": watch.stalls}

    async def synthesize(self, request: Union[SpeechRequest, dict]) -> bytes:
        """The whole audio file."""
        req = as_request(request)
        return await self.state.speech.synthesize(req, self._record(req), HANDLE_CALLER)

    async def synthesize_with_timestamps(self, request: Union[TimedSpeechRequest, dict]) -> TimedSpeech:
        """The whole audio (base64) with where each segment lies in it, and captions on request:
        what ``POST /v1/audio/speech/with-timestamps`` answers."""
        req = as_request(request, TimedSpeechRequest)
        answer, _ = await self.state.speech.timed_answer(req, self._record(req), HANDLE_CALLER)
        return answer

    async def stream(self, request: Union[SpeechRequest, dict]) -> AsyncIterator[bytes]:
        """Audio bytes as they are made (``.options(stream=True)``)."""
        req = as_request(request)
        async for data in self.state.speech.stream(req, self._record(req), HANDLE_CALLER):
            yield data

    @staticmethod
    def _record(req: SpeechRequest) -> RequestRecord:
        return RequestRecord.start(req, _request_id(), client="handle")
