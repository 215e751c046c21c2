"""The explicit proxy connects only where ``clawr1.proxy.destinations`` allows (docs/security.md).

Three places hold it, from the friendliest to the last word:

- ``http_connect`` and ``request``: a ``CONNECT`` or a plain proxied request to a refused host gets
  a 403 saying why, before anything is opened;
- ``server_connect``: every upstream connection mitmproxy opens (also one a tunnelled request's
  ``Host`` header asks for) is killed when its address is a refused literal;
- the proxy's event loop resolves names through ``Destinations.allowed_address``: addresses of the
  stack are dropped from every answer, so the address connected to is one that was checked, whatever
  a name resolves to by then (DNS rebinding).

Reverse mode connects to its configured upstream only and is left alone.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from typing import Any

from mitmproxy import http
from mitmproxy.connection import Client
from mitmproxy.proxy.mode_specs import RegularMode
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from clawr1.proxy.destinations import Destinations, address_of

# A host's verdict is reused for this long by the per-request check (connections are checked anew).
VERDICT_TTL_S = 5.0
_MAX_VERDICTS = 4096


def _explicit(client: Client) -> bool:
    return isinstance(client.proxy_mode, RegularMode)


class DestinationGuard:
    def __init__(self, destinations: Destinations) -> None:
        self.destinations = destinations
        self._verdicts: dict[tuple[str, int], tuple[str | None, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _refusal(self, host: str, port: int) -> str | None:
        now = time.monotonic()
        cached = self._verdicts.get((host, port))
        if cached is not None and now - cached[1] < VERDICT_TTL_S:
            return cached[0]
        verdict = await asyncio.to_thread(self.destinations.refusal, host, port)
        if len(self._verdicts) >= _MAX_VERDICTS:
            self._verdicts.clear()
        self._verdicts[(host, port)] = (verdict, now)
        return verdict

    async def _refuse(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not _explicit(flow.client_conn):
            return
        reason = await self._refusal(flow.request.host, flow.request.port)
        if reason is not None:
            flow.response = http.Response.make(403, f"clawr1 proxy: {reason}\n",
                                               {"Content-Type": "text/plain; charset=utf-8"})

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        await self._refuse(flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        await self._refuse(flow)

    async def server_connect(self, data: ServerConnectionHookData) -> None:
        if data.server.address is None or not _explicit(data.client):
            return
        host, port = data.server.address
        literal = address_of(host)
        allowed = self.destinations.allowed_address
        if literal is not None and not await asyncio.to_thread(allowed, literal, port):
            data.server.error = f"clawr1 proxy: refusing to connect to {host}:{port}, a machine of the stack"

    def running(self) -> None:
        """Resolve names through the rule from now on (listening sockets are bound already)."""
        self._loop = asyncio.get_running_loop()
        resolve = self._loop.getaddrinfo
        keep = self._keep

        async def getaddrinfo(host: Any, port: Any, *, family: int = 0, type: int = 0, proto: int = 0,
                              flags: int = 0) -> list[Any]:
            infos = await resolve(host, port, family=family, type=type, proto=proto, flags=flags)
            if flags & socket.AI_PASSIVE or not str(port).isdigit():
                return infos
            return await asyncio.to_thread(keep, host, int(port), infos)

        self._loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]

    def _keep(self, host: Any, port: int, infos: list[Any]) -> list[Any]:
        kept = [info for info in infos
                if self.destinations.allowed_address(ipaddress.ip_address(str(info[4][0]).split("%")[0]),
                                                     port)]
        if infos and not kept:
            raise OSError(f"clawr1 proxy: refusing to connect to {host}:{port}, it resolves to a machine "
                          "of the stack")
        return kept

    def done(self) -> None:
        if self._loop is not None and "getaddrinfo" in vars(self._loop):
            del self._loop.getaddrinfo
        self._loop = None
