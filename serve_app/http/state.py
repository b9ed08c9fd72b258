"""What the Ingress's routes reach through the app's state: one service per feature, built once
per replica from the one validated ``AppConfig`` and the stages' handles (``build_state``), and
applied again whole on each live change of ``args.ingress`` (``IngressState.apply``).

Plain Python: the Ray layer (``deployments/ingress.py``) passes in what only it has (the stream
slots counted across replicas, the back-pressure board's name, how to find the job runner, the
request id Serve gives each request)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from fastapi import FastAPI, Request, WebSocket

from ..callers import StreamSlots
from ..jobs.service import JOBS_PATH, JobsService
from ..settings import AppConfig, IngressConfig
from .health import Readiness
from .lexicons import LEXICONS_PATH, LexiconsAPI
from .loop_watch import LoopWatch
from .middleware import HttpPolicy, install_policy
from .security import APIKeyAuth
from .speech import SpeechService
from .voices import VOICES_PATH, VoicesAPI


class UnstartedSockets:
    """Sockets of one replica that have not sent their first message yet, per client (its key id
    from the handshake's header, else its address): a client holds at most ``limit`` of them, so
    sockets that never speak cannot fill the replica's request slots."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def enter(self, client: str, limit: int) -> bool:
        n = self._count.get(client, 0)
        if n >= limit:
            return False
        self._count[client] = n + 1
        return True

    def leave(self, client: str) -> None:
        n = self._count.get(client, 0) - 1
        if n <= 0:
            self._count.pop(client, None)
        else:
            self._count[client] = n


@dataclass
class IngressState:
    config: AppConfig
    speech: SpeechService
    voices: VoicesAPI
    lexicons: LexiconsAPI
    jobs: JobsService
    readiness: Readiness
    loop_watch: LoopWatch
    unstarted: UnstartedSockets
    request_id: Callable[[], str]

    @property
    def settings(self) -> IngressConfig:
        return self.speech.settings

    def apply(self, app: FastAPI, settings: IngressConfig) -> None:
        """``settings`` live: the keys first (a refused change leaves everything as it was), the
        speech service's limits and switches, then the middleware's policy, swapped in whole (a
        request in flight keeps the one it started with)."""
        auth = APIKeyAuth(settings.security)
        self.speech.apply(settings)
        install_policy(app, http_policy(self.config, settings, auth))


def route_body_limits(config: AppConfig) -> dict[tuple[str, str], int]:
    """The routes whose body has a limit of its own (uploads), over ``ingress.max_body_bytes``."""
    return {
        ("POST", VOICES_PATH): config.voices.max_upload_bytes,
        ("POST", JOBS_PATH): config.jobs.max_upload_bytes,
        ("POST", LEXICONS_PATH): config.lexicons.max_upload_bytes,
    }


def http_policy(config: AppConfig, settings: IngressConfig, auth: APIKeyAuth) -> HttpPolicy:
    """What the guard middleware enforces under ``settings`` (the live ``args.ingress``)."""
    return HttpPolicy(
        max_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        route_max_bytes=route_body_limits(config),
        cors_origins=settings.security.cors_origins,
        auth=auth,
    )


def build_state(
    app: FastAPI,
    config: AppConfig,
    stages: tuple[Any, Any, Any],
    *,
    slots: StreamSlots,
    clip_encoder: Any,
    flow_board: Optional[str],
    find_runner: Callable[[], Any],
    request_id: Callable[[], str],
) -> IngressState:
    """Every service of the Ingress, installed in ``app.state`` (``state_of`` finds it).
    ``stages``: the TextNormalizer's, Vocoder's and Acoustic stage's handles on the speech path;
    ``clip_encoder``: the Vocoder's handle the voices API encodes clips with (an upload may pass
    the speech path's message size)."""
    normalizer, vocoder, acoustic = stages
    voices = VoicesAPI(config.voices, clip_encoder)
    speech = SpeechService(
        normalizer, vocoder, acoustic, voices.catalog, config.cache, config.ingress, slots, config.flow, flow_board
    )
    jobs = JobsService(config.jobs, normalizer, vocoder, voices.catalog, config.segments, find_runner=find_runner)
    lexicons = LexiconsAPI(config.lexicons.resolved(config.voices))
    speech.lexicons = jobs.lexicons = lexicons.book  # a request's `lexicon` (or the key's default)
    state = IngressState(
        config=config,
        speech=speech,
        voices=voices,
        lexicons=lexicons,
        jobs=jobs,
        readiness=Readiness(lambda: speech.warmup(request_id())),
        loop_watch=LoopWatch("ingress").start(),
        unstarted=UnstartedSockets(),
        request_id=request_id,
    )
    state.apply(app, config.ingress)  # refuses to start when security.auth is 'required' and no key loads
    app.state.ingress = state
    return state


def state_of(request: Union[Request, WebSocket]) -> IngressState:
    return request.app.state.ingress
