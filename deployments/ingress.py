"""Ingress stage (CPU, no torch): the HTTP API, the WebSocket sessions and the handle API.

Each route checks the caller and calls a service object: speech and dialogue
(``serve_app/http/speech.py``, over the one speech pipeline in ``serve_app/pipeline``), WebSocket
sessions (``serve_app/realtime/graph.py``),
the voices API (``serve_app/http/voices.py``), background jobs (``serve_app/http/jobs.py``),
readiness (``serve_app/http/health.py``) and the web page (``serve_app/http/webui.py``). Handle
API for other Ray apps: ``synthesize(request)`` -> bytes and ``stream(request)`` (with
``.options(stream=True)``).
"""

import functools
import uuid
from typing import AsyncIterator, Optional, Union

from fastapi import Request, WebSocket
from fastapi.responses import RedirectResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.backends import install
from deployments.job_runner import job_runner
from deployments.slots import SharedSlots
from deployments.stage_calls import stage_handle
from serve_app.engine.config import SegmentConfig
from serve_app.errors import APIError
from serve_app.http.app import make_app
from serve_app.http.errors import error_response
from serve_app.http.health import Readiness
from serve_app.http.lexicons import CREATE_LEXICON_OPENAPI, LEXICONS_PATH, LexiconsAPI
from serve_app.http.loop_watch import LoopWatch
from serve_app.http.middleware import HttpPolicy, caller_of, install_policy
from serve_app.http.request_log import RequestRecord
from serve_app.http.security import APIKeyAuth, Caller
from serve_app.http.speech import SpeechService, as_request
from serve_app.http.voices import CREATE_VOICE_OPENAPI, VOICES_PATH, VoicesAPI
from serve_app.http.webui import page_response
from serve_app.jobs.request import CREATE_JOB_OPENAPI
from serve_app.jobs.service import JOBS_PATH, JobsService
from serve_app.pipeline.flow import ACKS_HEADER, board, board_name
from serve_app.protocol import (
    MODEL_IDS,
    AudioJob,
    AudioJobDeleted,
    AudioJobList,
    AudioModelList,
    DialogueRequest,
    ModelCard,
    ModelList,
    SpeechRequest,
    TimedSpeech,
    TimedSpeechRequest,
    VoiceList,
)
from serve_app.protocol.lexicons import LexiconDeleted, LexiconDetail, LexiconList
from serve_app.realtime.graph import UnstartedSockets, run_session
from serve_app.settings import (
    CacheConfig,
    FlowConfig,
    IngressConfig,
    JobsConfig,
    LexiconStoreConfig,
    VoiceStoreConfig,
    merged,
)

# Serve needs the app when the class is defined; each replica installs its own policy at start.
app = make_app(HttpPolicy(IngressConfig().max_body_bytes))

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
@serve.ingress(app)
class Ingress:
    def __init__(
        self,
        normalizer: DeploymentHandle,
        vocoder: DeploymentHandle,
        acoustic: DeploymentHandle,
        settings: Optional[dict] = None,
        cache: Optional[dict] = None,
        voices: Optional[dict] = None,
        flow: Optional[dict] = None,
        jobs: Optional[dict] = None,
        segments: Optional[dict] = None,
        lexicons: Optional[dict] = None,
    ):
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        ingress = IngressConfig.model_validate(settings or {})
        self._args = ingress.model_dump()
        voice_config = VoiceStoreConfig.model_validate(voices or {})
        # The Vocoder stage encodes clips (up to the voices' upload limit) and seeds: as given.
        self.voices = VoicesAPI(voice_config, vocoder)
        # One count of stream slots, and one board of back-pressure reports, for every replica of this application.
        app_name = serve.get_replica_context().app_name
        slots = SharedSlots(f"stream-slots:{app_name}")
        flow_settings = FlowConfig.model_validate(flow or {})
        # The speech path's calls (speech, dialogue, sessions, the job runner) in the flow's transport.
        normalizer, vocoder, acoustic = (stage_handle(h, flow_settings) for h in (normalizer, vocoder, acoustic))
        flow_board = board_name(app_name)
        board(flow_board)  # created (or found) now, not on the first request
        self.speech = SpeechService(
            normalizer,
            vocoder,
            acoustic,
            self.voices.catalog,
            CacheConfig.model_validate(cache or {}),
            ingress,
            slots,
            flow_settings,
            flow_board,
        )
        jobs_config = JobsConfig.model_validate(jobs or {})
        # The application's job runner (found by name, made if missing) speaks through these stages.
        # segments: the TextNormalizer's limits, which a job's chunks are planned with at submission.
        self.jobs = JobsService(
            jobs_config,
            normalizer,
            vocoder,
            self.voices.catalog,
            SegmentConfig.model_validate(segments or {}),
            find_runner=functools.partial(job_runner, app_name, jobs_config, normalizer, vocoder),
        )
        lexicon_config = LexiconStoreConfig.model_validate(lexicons or {}).resolved(voice_config)
        # Uploads have their own body limits: a clip, a book's text, a lexicon.
        self._upload_limits = {
            VOICES_PATH: voice_config.max_upload_bytes,
            JOBS_PATH: jobs_config.max_upload_bytes,
            LEXICONS_PATH: lexicon_config.max_upload_bytes,
        }
        self.lexicons = LexiconsAPI(lexicon_config)
        self.speech.lexicons = self.jobs.lexicons = self.lexicons.book  # requests' `lexicon` (or the key's default)
        self._apply(ingress)  # refuses to start when security.auth is 'required' and no key loads
        self.readiness = Readiness(lambda: self.speech.warmup(_request_id()))
        self.unstarted = UnstartedSockets()
        self.loop_watch = LoopWatch("ingress").start()

    def _apply(self, settings: IngressConfig) -> None:
        auth = APIKeyAuth(settings.security)  # first: a refused change leaves everything as it was
        self.settings = settings
        self.speech.apply(settings)
        policy = HttpPolicy(
            max_bytes=settings.max_body_bytes,
            body_timeout_s=settings.body_timeout_s,
            route_max_bytes=self._upload_limits,
            cors_origins=settings.security.cors_origins,
            auth=auth,
        )
        install_policy(app, policy)  # whole: a request in flight keeps the policy it started with

    async def reconfigure(self, user_config: dict) -> None:
        """Serve ``user_config``: any IngressConfig field, applied live (limits, timeouts,
        degradation switches, API keys and grants, CORS), merged field by field over the
        deployment's ``args.ingress``: a user_config naming one security field keeps the others
        (``auth: required`` among them), and one that drops a field gives it back its args value."""
        self._apply(IngressConfig.model_validate(merged(self._args, user_config or {})))

    @staticmethod
    def _caller(request: Union[Request, WebSocket]) -> Caller:
        """Who is calling: the guard middleware identified it from the headers before the body."""
        return caller_of(request)

    def _ws_caller(self, ws: WebSocket, api_key: Optional[str]) -> Caller:
        """A WebSocket's caller: from the handshake's header, else from the key in session.start."""
        caller = caller_of(ws)
        if caller is not None:
            return caller
        address = ws.client.host if ws.client else "unknown"
        return app.state.policy.auth.identify(f"Bearer {api_key}" if api_key else None, address)

    # ------------------------------------------------------------------ handle API

    async def loop_stall(self, reset: bool = False) -> dict[str, float]:
        """This replica's longest event-loop stall (ms) since its start or the last ``reset``, the
        longest while the process itself ran (``LoopWatch``), and how many stalls passed the
        warning threshold (operators and the attack tests)."""
        watch = self.loop_watch
        longest, busy = watch.reset() if reset else (watch.longest_s, watch.longest_busy_s)
        return {"longest_ms": round(longest * 1e3, 1), "longest_busy_ms": round(busy * 1e3, 1), "stalls": watch.stalls}

    async def synthesize(self, request: Union[SpeechRequest, dict]) -> bytes:
        """The whole audio file."""
        req = as_request(request)
        return await self.speech.synthesize(
            req, RequestRecord.start(req, _request_id(), client="handle"), HANDLE_CALLER
        )

    async def synthesize_with_timestamps(self, request: Union[TimedSpeechRequest, dict]) -> TimedSpeech:
        """The whole audio (base64) with where each segment lies in it, and captions on request:
        what ``POST /v1/audio/speech/with-timestamps`` answers."""
        req = as_request(request, TimedSpeechRequest)
        answer, _ = await self.speech.timed_answer(
            req, RequestRecord.start(req, _request_id(), client="handle"), HANDLE_CALLER
        )
        return answer

    async def stream(self, request: Union[SpeechRequest, dict]) -> AsyncIterator[bytes]:
        """Audio bytes as they are made (``.options(stream=True)``)."""
        req = as_request(request)
        async for data in self.speech.stream(
            req, RequestRecord.start(req, _request_id(), client="handle"), HANDLE_CALLER
        ):
            yield data

    # ------------------------------------------------------------------ speech

    @app.post("/v1/audio/speech", response_class=StreamingResponse)
    async def speech_route(self, body: SpeechRequest, request: Request):
        return await self._answer(body, request)

    @app.post("/v1/audio/speech/with-timestamps", response_model=TimedSpeech)
    async def timed_speech_route(self, body: TimedSpeechRequest, request: Request):
        """The whole audio (base64) with where each segment lies in it, and captions on request."""
        return await self._answer(body, request, timed=True)

    @app.post("/v1/audio/dialogue", response_class=StreamingResponse)
    async def dialogue_route(self, body: DialogueRequest, request: Request):
        """Turns in several voices, decoded together, spoken in turn order with a pause between."""
        return await self._answer(body, request)

    @app.post("/v1/audio/dialogue/with-timestamps", response_model=TimedSpeech)
    async def timed_dialogue_route(self, body: DialogueRequest, request: Request):
        return await self._answer(body, request, timed=True)

    async def _answer(self, body: SpeechRequest, request: Request, timed: bool = False):
        rec = RequestRecord.start(body, _request_id(), client="http", log_text=self.settings.log_text)
        rec.since_arrival(getattr(request.state, "t_in", None))
        cache_control = request.headers.get("cache-control", "")
        try:
            if timed:
                return await self.speech.timed(body, rec, self._caller(request), cache_control)
            return await self.speech.respond(
                body, rec, self._caller(request), cache_control, flow_acks=request.headers.get(ACKS_HEADER) == "1"
            )
        except APIError as exc:
            rec.finish(str(exc.status))
            return error_response(exc)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(self, ws: WebSocket) -> None:
        """Text in as it is written, audio out as it is made (protocol: ``protocol.SessionStart``
        and the messages after it; session logic: ``serve_app/realtime/``)."""
        known = caller_of(ws)  # from the handshake's Authorization header, if it had one
        client = known.id if known is not None else "ip:" + (ws.client.host if ws.client else "unknown")
        await run_session(ws, _request_id(), self.speech, lambda key: self._ws_caller(ws, key), client, self.unstarted)

    @app.get("/v1/models", response_model=ModelList)
    async def models(self, request: Request) -> ModelList:
        return ModelList(data=[ModelCard(id=m) for m in MODEL_IDS])

    @app.get("/v1/audio/models", response_model=AudioModelList)
    async def audio_models(self) -> AudioModelList:
        """The speech model ids, without a key (Open WebUI reads ``models``)."""
        cards = [ModelCard(id=m) for m in MODEL_IDS]
        return AudioModelList(data=cards, models=cards)

    # ------------------------------------------------------------------ voices

    @app.get("/v1/voices", response_model=VoiceList)
    async def voices_route(self, request: Request):
        """The voices listing (as ``GET /v1/audio/voices``; built-in voices without a key)."""
        return await self.voices.list(self._caller(request))

    @app.post(VOICES_PATH, openapi_extra=CREATE_VOICE_OPENAPI)
    async def create_voice(self, request: Request):
        """A custom voice from a speaker string, a seed, or a 2-30 s clip and its transcript,
        owned by the caller's key."""
        return await self.voices.create(request, self._caller(request))

    @app.get(VOICES_PATH, response_model=VoiceList)
    async def list_voices(self, request: Request):
        """Built-in voices and the caller's custom ones (an admin key: every key's); without a key
        where keys are on, the built-in voices only (Open WebUI asks so)."""
        return await self.voices.list(self._caller(request))

    @app.get(VOICES_PATH + "/{voice_id}")
    async def get_voice(self, voice_id: str, request: Request):
        """One voice, with its speaker string (and a clip voice's codes and transcript) to keep."""
        return await self.voices.get(voice_id, self._caller(request))

    @app.delete(VOICES_PATH + "/{voice_id}")
    async def delete_voice(self, voice_id: str, request: Request):
        return await self.voices.delete(voice_id, self._caller(request))

    # ------------------------------------------------------------------ lexicons

    @app.post(LEXICONS_PATH, response_model=LexiconDetail, openapi_extra=CREATE_LEXICON_OPENAPI)
    async def create_lexicon(self, request: Request):
        """A pronunciation lexicon owned by the caller's key: entries {text, alias} or {text, pinyin}."""
        return await self.lexicons.create(request, self._caller(request))

    @app.get(LEXICONS_PATH, response_model=LexiconList)
    async def list_lexicons(self, request: Request):
        """The caller's lexicons (an admin key: every key's), without their entries."""
        return await self.lexicons.list(self._caller(request))

    @app.get(LEXICONS_PATH + "/{lexicon_id}", response_model=LexiconDetail)
    async def get_lexicon(self, lexicon_id: str, request: Request):
        return await self.lexicons.get(lexicon_id, self._caller(request))

    @app.delete(LEXICONS_PATH + "/{lexicon_id}", response_model=LexiconDeleted)
    async def delete_lexicon(self, lexicon_id: str, request: Request):
        return await self.lexicons.delete(lexicon_id, self._caller(request))

    # ------------------------------------------------------------------ jobs

    @app.post(JOBS_PATH, status_code=202, response_model=AudioJob, openapi_extra=CREATE_JOB_OPENAPI)
    async def create_job(self, request: Request):
        """A long text (JSON, text/plain or a file) spoken in the background into one file: 202 and the job."""
        return await self.jobs.create(request, self._caller(request))

    @app.get(JOBS_PATH, response_model=AudioJobList)
    async def list_jobs(self, request: Request):
        """The caller's jobs, newest first (an admin key: every key's)."""
        return await self.jobs.list(self._caller(request), request.scope.get("root_path", ""))

    @app.get(JOBS_PATH + "/{job_id}", response_model=AudioJob)
    async def get_job(self, job_id: str, request: Request):
        """A job's status and progress (chunks, characters, audio seconds so far, an ETA)."""
        return await self.jobs.get(job_id, self._caller(request), request.scope.get("root_path", ""))

    @app.api_route(JOBS_PATH + "/{job_id}/audio", methods=["GET", "HEAD"])
    async def job_audio(self, job_id: str, request: Request):
        """A succeeded job's file; Range requests answer 206 (players seek)."""
        return await self.jobs.audio(job_id, self._caller(request))

    @app.api_route(JOBS_PATH + "/{job_id}/captions", methods=["GET", "HEAD"])
    async def job_captions(self, job_id: str, request: Request):
        """A succeeded job's captions (made with ``captions``: SRT or WebVTT)."""
        return await self.jobs.captions(job_id, self._caller(request))

    @app.post(JOBS_PATH + "/{job_id}/cancel", response_model=AudioJob)
    async def cancel_job(self, job_id: str, request: Request):
        """Stop the job and keep it as ``cancelled`` (DELETE stops it and deletes it)."""
        return await self.jobs.cancel(job_id, self._caller(request), request.scope.get("root_path", ""))

    @app.api_route(JOBS_PATH + "/{job_id}/chapters/{chapter}/audio", methods=["GET", "HEAD"])
    async def job_chapter_audio(self, job_id: str, chapter: int, request: Request):
        """One chapter's file of a succeeded job made with ``chapters``; Range requests work."""
        return await self.jobs.chapter_audio(job_id, chapter, self._caller(request))

    @app.api_route(JOBS_PATH + "/{job_id}/chapters/{chapter}/captions", methods=["GET", "HEAD"])
    async def job_chapter_captions(self, job_id: str, chapter: int, request: Request):
        """One chapter's captions, timed on its own file (made with ``chapters`` and ``captions``)."""
        return await self.jobs.chapter_captions(job_id, chapter, self._caller(request))

    @app.delete(JOBS_PATH + "/{job_id}", response_model=AudioJobDeleted)
    async def delete_job(self, job_id: str, request: Request):
        """Cancel the job (its running chunks stop at once) and delete its files."""
        return await self.jobs.delete(job_id, self._caller(request))

    # ------------------------------------------------------------------ the web page, health

    @app.get("/", include_in_schema=False)
    async def root(self):
        return RedirectResponse("ui/")

    @app.get("/ui/{name:path}", include_in_schema=False)
    async def ui(self, name: str):
        return page_response(name)

    @app.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    # The same for monitors and clients that probe /health. JSON, never the plain text "OK":
    # wyoming-openai takes a server whose /health says exactly that for Speaches.
    @app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self):
        return self.readiness.answer(self.speech.weights_kind)
