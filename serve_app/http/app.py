"""The FastAPI app of the Ingress: OpenAI-style error handlers and the middleware. The routes
live on the Ingress deployment (``deployments/ingress.py``), each calling a service object."""

from __future__ import annotations

from fastapi import FastAPI

from .errors import install_error_handlers
from .middleware import DynamicCORS, GuardMiddleware, HttpPolicy, install_policy


def make_app(policy: HttpPolicy) -> FastAPI:
    """``policy`` until the owner installs its own (``install_policy``): with no ``auth``, every
    guarded route answers 503 ``starting``."""
    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, on the origin where the
    # web page keeps the user's API key. The schema stays at /openapi.json for any viewer.
    app = FastAPI(
        title="chattts-serve",
        version="0.1.0",
        description="ChatTTS text-to-speech with an OpenAI-compatible API, on Ray Serve.",
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_policy(app, policy)
    app.add_middleware(GuardMiddleware, state=app.state)
    app.add_middleware(DynamicCORS, state=app.state)  # outermost: preflight answers need no key and hit no limit
    return app
