"""``/docs``: Swagger UI over the app's ``/openapi.json``, every asset served from this process.

FastAPI's own page loads its script and style from a CDN: a browser opening the docs of a stack would
fetch and run code from a third party (and an offline stack shows a blank page). The assets come from
the ``swagger-ui-bundle`` package instead, from a fixed list of files, and the page may load nothing
from anywhere else (``Content-Security-Policy``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from swagger_ui_bundle import swagger_ui_path

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
# Swagger UI runs its start-up inline and styles inline; it talks to this origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"}


def docs_router(title: str, openapi_url: str = "/openapi.json") -> APIRouter:
    """``GET /docs`` and ``GET /docs/assets/{name}``; public, like the spec they render."""
    router = APIRouter(include_in_schema=False)

    @router.get("/docs", response_class=HTMLResponse)
    async def docs() -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} - docs",
                                   swagger_js_url="docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="docs/assets/swagger-ui.css",
                                   swagger_favicon_url="docs/assets/favicon-32x32.png")
        return HTMLResponse(page.body, headers=_HEADERS)

    @router.get("/docs/assets/{name}", response_class=FileResponse)
    async def asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404, f"no docs asset {name!r}")
        return FileResponse(Path(swagger_ui_path) / name, media_type=media_type, headers=_HEADERS)

    return router
