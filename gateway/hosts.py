"""DNS-rebinding defence for the key-less (loopback) API: only loopback ``Host`` names are answered.

Without API keys the API trusts whoever reaches its loopback port. A web page the developer opens
can rebind its own name to 127.0.0.1 and then call the API from the browser: same origin, no key
needed. Such requests carry the page's name in ``Host``, so answering only ``localhost``, 127.x and
``[::1]`` (421 otherwise) closes that door. A request without ``Host`` (HTTP/1.0 tools) is served:
browsers always send one.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from clawr1.gateway.errors import ErrorBody
from clawr1.gateway.server import is_loopback


def host_name(host: str) -> str:
    """The name or address of a ``Host`` header value, without port, brackets or a trailing dot."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


class LoopbackHostMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), None)
            if host is not None and not is_loopback(host_name(host)):
                await _refuse(send, host)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, host: str) -> None:
    body = ErrorBody(
        error="misdirected_request",
        message=f"Host {host[:100]!r} is not a loopback name: without API keys the API answers only "
                "localhost, 127.x and [::1] (DNS-rebinding defence); set CLAWR1_API_KEYS to serve "
                "other names")
    raw = body.model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": 421, "headers": headers})
    await send({"type": "http.response.body", "body": raw})
