"""The FastAPI app of the Ingress: OpenAI-style error handlers and the middleware. The routes
live on the Ingress deployment (``deployments/ingress.py``), each calling a service object."""

from __future__ import annotations

from fastapi import FastAPI

from .errors import install_error_handlers
from .middleware import BodyLimitMiddleware, DynamicCORS, HttpPolicy


def make_app(policy: HttpPolicy) -> FastAPI:
    app = FastAPI(
        title="chattts-serve",
        version="0.1.0",
        description="ChatTTS text-to-speech with an OpenAI-compatible API, on Ray Serve.",
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, policy=policy)
    app.add_middleware(DynamicCORS, policy=policy)  # outermost: preflight answers never hit limits
    return app
