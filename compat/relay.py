"""Agent calls on a per-trajectory base URL, relayed through the capture proxy's reverse port.

Capture stays the proxy's one real path (streaming, tool calls, token ids, redaction, spool): the
relay only turns the base URL's path into X-Claw hints and passes bytes through, chunk by chunk,
without buffering a streamed answer.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence

import httpx
from starlette.responses import StreamingResponse

from clawr1.compat.steps import response_headers
from clawr1.core.settings import Settings

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


class RelayUnavailable(RuntimeError):
    """The stack has no reverse port to relay to (HTTP 503); the message says what to set."""


class RelayFailed(RuntimeError):
    """The capture proxy could not be reached (HTTP 502)."""


def proxy_target(settings: Settings) -> tuple[str | None, str]:
    """The reverse port's URL, or None and why it cannot be used."""
    if not settings.reverse_port or not settings.upstream:
        return None, ("agent calls on the compat port go through the capture proxy's reverse port: set "
                      "CLAWR1_UPSTREAM (--upstream) and CLAWR1_REVERSE_PORT (--reverse-port)")
    host = settings.proxy_host
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{settings.reverse_port}", ""


def proxy_authorization(proxy_auth: str) -> str | None:
    """``Proxy-Authorization`` for a proxy that requires ``user:pass`` (an htpasswd file cannot be used)."""
    if not proxy_auth:
        return None
    if proxy_auth.startswith("@"):
        raise RelayUnavailable("the capture proxy authenticates with an htpasswd file: the compat port needs "
                               "CLAWR1_PROXY_AUTH as user:pass to reach it")
    return "Basic " + base64.b64encode(proxy_auth.encode()).decode()


class Relay:
    def __init__(self, settings: Settings, client: httpx.AsyncClient) -> None:
        self.target, self._why_not = proxy_target(settings)
        self._proxy_auth = settings.proxy_auth
        self._client = client

    async def forward(self, path: str, query: str, headers: Sequence[tuple[str, str]],
                      body: bytes) -> StreamingResponse:
        """POST ``body`` to the proxy's ``path`` and stream its answer back as it arrives."""
        if self.target is None:
            raise RelayUnavailable(self._why_not)
        # Values as the agent sent their bytes (the server decoded them as Latin-1): a UTF-8 header is
        # relayed as it came, never re-encoded (httpx would refuse non-ASCII text).
        sent = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        authorization = proxy_authorization(self._proxy_auth)
        if authorization is not None:
            sent.append((b"Proxy-Authorization", authorization.encode()))
        request = self._client.build_request("POST", f"{self.target}{path}", content=body, headers=sent,
                                             params=httpx.QueryParams(query))
        try:
            upstream = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise RelayFailed(f"the capture proxy at {self.target} could not be reached: {exc!r}") from exc
        answer = StreamingResponse(_chunks(upstream), status_code=upstream.status_code)
        answer.raw_headers = [*answer.raw_headers, *response_headers(upstream.headers.raw)]
        return answer


async def _chunks(upstream: httpx.Response) -> AsyncIterator[bytes]:
    """Bytes as the proxy sends them (still content-encoded); closed also when the agent goes away."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
