"""The web page the Ingress serves at ``/ui/``: static files shipped in the package
(``serve_app/http/static/``), no build step, nothing loaded from elsewhere.

Only the files listed here are served: a request's path is looked up in this table and never
joined to a filesystem path. The page itself is public; it calls the API with the key the user
types in (kept in the browser's localStorage).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi.responses import Response

from ..errors import APIError

_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_FILES: dict[str, bytes] = {name: files("serve_app.http").joinpath("static", name).read_bytes() for name in _TYPES}
# Same origin only; media from blob: URLs (the streamed audio); the microphone stays opt-in.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; media-src 'self' blob:; "
    "connect-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def page_response(name: str) -> Response:
    name = name or "index.html"
    data = _FILES.get(name)
    if data is None:
        raise APIError(404, f"no page {name[:64]!r}", code="not_found")
    headers = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    return Response(data, media_type=_TYPES[name], headers=headers)
