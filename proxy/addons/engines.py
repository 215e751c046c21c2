"""Spreads the reverse port's calls over ``CLAWR1_UPSTREAM``'s engines (``clawr1.proxy.engines`` decides)
and answers the engine routes (``/v1/engines``, ``/v1/engines/drain``, ``/v1/engines/resume``) itself.

- ``request``: the call's rollout key (trajectory hint, else the conversation root) picks the engine; the
  request's host, port and scheme are rewritten to it (mitmproxy's reverse mode has one fixed upstream).
- ``server_connect``: before mitmproxy opens a connection to an engine, one TCP connect tries it; an engine
  that refuses is taken out and the call goes to another engine on that same connection attempt, so the
  agent sees no error and one call is captured.
- ``responseheaders``/``response``/``error``: the call leaves the engine's in-flight count; an engine that
  failed a call before its first response byte is taken out. A call that fails mid-stream is not replayed.
- every ``PROBE_S``, engines taken out are tried (TCP connect) and put back when they accept.

Each proxy process keeps its own table; what an operator sets (drain, resume at a version) reaches the
others, and the next start, through ``clawr1.proxy.engine_files``; the engine routes answer with the
counts of every process (docs/proxy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import http
from mitmproxy.proxy.mode_specs import ReverseMode
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from clawr1.core.conversation import conversation_key
from clawr1.gateway.auth import KeyRing
from clawr1.proxy.addons.state import call_state
from clawr1.proxy.apis import BY_NAME
from clawr1.proxy.engine_files import EngineFiles, combined, remaining
from clawr1.proxy.engines import Engine, EngineTable
from clawr1.proxy.record import CLIENT_DISCONNECTED

logger = logging.getLogger("clawr1.proxy")
ENGINE_KEY = "clawr1.engine"
ROUTES = "/v1/engines"
OPERATE = "operate"
PROBE_S = 2.0
# How often each of several proxy processes takes the operator's settings and shares its counts.
SHARE_S = 0.2
RESUME_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 2.0
DRAIN_TIMEOUT_S = 60.0
_DRAIN_POLL_S = 0.05


@dataclass
class _Placed:
    """The engine a flow was sent to, and whether it has left the engine's in-flight count."""

    engine: Engine
    key: str
    answered: bool = False
    done: bool = False


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _reverse(flow_or_client: Any) -> bool:
    return isinstance(flow_or_client.proxy_mode, ReverseMode)


def _json(status: int, body: Any) -> http.Response:
    return http.Response.make(status, json.dumps(body), {"content-type": "application/json"})


def rollout_key(flow: http.HTTPFlow) -> str:
    """The trajectory hint when the agent gave one, else the conversation root of the request's
    messages (what the linker keys a trajectory by); ``""`` for calls that are not LLM calls."""
    state = call_state(flow)
    if state is None:
        return ""
    if state.hints.trajectory_id:
        return f"t:{state.hints.trajectory_id}"
    try:
        body = json.loads(state.request_body or b"{}")
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    return f"c:{conversation_key(BY_NAME[state.api.name].request_messages(body))}"


class EngineRouter:
    """``files``: where the proxy's processes share what an operator set and their counts (None: this
    process alone, nothing kept past it)."""

    def __init__(self, urls: list[str], keys: KeyRing | None = None,
                 files: EngineFiles | None = None) -> None:
        self.table = EngineTable(urls)
        self._keys = keys or KeyRing()
        self._files = files
        self._origins = {url: _origin(url) for url in urls}
        # The flow each client connection is sending (HTTP/1: one at a time), for ``server_connect``.
        self._sending: dict[str, http.HTTPFlow] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # The control revision this process has taken (``EngineFiles``).
        self._revision = 0

    async def running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._files is not None:
            await self._take_control()
        self._tasks.append(loop.create_task(self._probe_forever(), name="engine probes"))
        if self._files is not None and self._files.processes > 1:
            self._tasks.append(loop.create_task(self._share_forever(), name="engine table sharing"))

    async def done(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not _reverse(flow.client_conn):
            return
        if flow.request.path.split("?")[0].rstrip("/").startswith(ROUTES):
            flow.response = await self._admin(flow)
            return
        # One engine: nothing to choose, so the request is not parsed for its rollout.
        key = rollout_key(flow) if len(self.table.engines) > 1 else ""
        engine = self.table.pick(key, time.monotonic())
        if engine is None:
            flow.response = _json(503, {"error": {"type": "no_engine", "message": "clawr1 proxy: no engine "
                                                  "is serving (all drained or unreachable)"}})
            return
        self._send(flow, _Placed(engine, key))

    def _send(self, flow: http.HTTPFlow, placed: _Placed) -> None:
        self.table.start(placed.engine)
        flow.metadata[ENGINE_KEY] = placed
        state = call_state(flow)
        if state is not None:
            state.engine, state.engine_version = placed.engine.url, placed.engine.policy_version
        origin = self._origins[placed.engine.url]
        request = flow.request
        # The reverse mode's upstream is there already (and its Host header): each setter would write
        # that header again (~25 µs a call).
        if (request.scheme, request.host, request.port) != origin:
            request.scheme, request.host, request.port = origin
        self._sending[flow.client_conn.id] = flow

    async def server_connect(self, data: ServerConnectionHookData) -> None:
        if not _reverse(data.client) or data.server.address is None or len(self.table.engines) == 1:
            return
        flow = self._sending.get(data.client.id)
        placed: _Placed | None = flow.metadata.get(ENGINE_KEY) if flow is not None else None
        if placed is None or self._origins[placed.engine.url][1:] != tuple(data.server.address):
            return  # not the connection of the call this client is sending
        tried: set[str] = set()
        while placed is not None and flow is not None and not await self._accepts(placed.engine.url):
            logger.warning("engine %s refused a connection: taken out until a probe finds it up",
                           placed.engine.url)
            self.table.mark_out(placed.engine.url)
            tried.add(placed.engine.url)
            self._finish(placed, answered=False)
            engine = self.table.pick(placed.key, time.monotonic(), avoid=frozenset(tried))
            if engine is None:
                return  # mitmproxy's own connect fails too: the agent gets its 502
            placed = _Placed(engine, placed.key)
            self._send(flow, placed)
            _, host, port = self._origins[engine.url]
            data.server.address = (host, port)
            if data.server.sni is not None:
                data.server.sni = host

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        placed: _Placed | None = flow.metadata.get(ENGINE_KEY)
        if placed is not None:
            placed.answered = True

    def response(self, flow: http.HTTPFlow) -> None:
        placed: _Placed | None = flow.metadata.get(ENGINE_KEY)
        if placed is not None:
            self._finish(placed, answered=True)
            self._sending.pop(flow.client_conn.id, None)

    def error(self, flow: http.HTTPFlow) -> None:
        placed: _Placed | None = flow.metadata.get(ENGINE_KEY)
        if placed is None:
            return
        # An agent that hangs up before the answer says nothing about the engine.
        failed = not placed.answered and flow.response is None and (
            flow.error is None or flow.error.msg != CLIENT_DISCONNECTED)
        if failed and self.table.mark_out(placed.engine.url):
            logger.warning("engine %s failed a call before answering (%s): taken out until a probe finds "
                           "it up", placed.engine.url, flow.error.msg if flow.error else "unknown error")
        self._finish(placed, answered=placed.answered)
        self._sending.pop(flow.client_conn.id, None)

    def _finish(self, placed: _Placed, answered: bool) -> None:
        if not placed.done:
            placed.done = True
            self.table.finish(placed.engine, answered)

    async def _accepts(self, url: str) -> bool:
        _, host, port = self._origins[url]
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _take_control(self) -> None:
        """Apply what an operator set through another process (or before a restart), if newer."""
        assert self._files is not None
        revision, control = await asyncio.to_thread(self._files.read_control)
        if revision > self._revision:
            self.table.apply(control)
            self._revision = revision

    async def _share_forever(self) -> None:
        assert self._files is not None
        while True:
            await self._take_control()
            await asyncio.to_thread(self._files.write_status, self._revision, self.table.describe())
            await asyncio.sleep(SHARE_S)

    async def _others(self) -> dict[int, tuple[int, dict[str, dict[str, Any]]]]:
        if self._files is None or self._files.processes == 1:
            return {}
        return await asyncio.to_thread(self._files.others)

    async def _publish(self) -> int:
        """Record what an operator just set here for the other processes (and the next start)."""
        if self._files is None:
            return 0
        self._revision = await asyncio.to_thread(self._files.write_control, self.table.control())
        if self._files.processes > 1:
            await asyncio.to_thread(self._files.write_status, self._revision, self.table.describe())
        return self._revision

    async def _wait(self, url: str, revision: int, timeout: float, calls_done: bool) -> tuple[int, int]:
        """Until every process has taken ``revision`` (and, with ``calls_done``, no call is in flight on
        ``url``) or ``timeout``: the calls still in flight and the processes that have not taken it."""
        deadline = time.monotonic() + timeout
        processes = self._files.processes if self._files is not None else 1
        while True:
            left, waiting = remaining(url, self.table.engines[url].in_flight, revision, processes,
                                      await self._others())
            if (waiting == 0 and (left == 0 or not calls_done)) or time.monotonic() >= deadline:
                return left, waiting
            await asyncio.sleep(_DRAIN_POLL_S)

    async def _rows(self) -> list[dict[str, Any]]:
        return combined(self.table.describe(), await self._others())

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)
            for engine in list(self.table.engines.values()):
                if engine.state == "out" and self.table.probed(engine.url, await self._accepts(engine.url)):
                    logger.warning("engine %s accepts connections again: serving", engine.url)

    async def _admin(self, flow: http.HTTPFlow) -> http.Response:
        """The engine routes; an ``operate`` key when the stack has keys (``Authorization: Bearer``)."""
        if self._keys.enabled:
            bearer = flow.request.headers.get("authorization", "")
            key = self._keys.identify(bearer[7:].strip()) if bearer.lower().startswith("bearer ") else None
            if key is None:
                return _json(401, {"detail": "the engine routes need an API key (Authorization: Bearer)"})
            if OPERATE not in key.kinds:
                return _json(403, {"detail": f"key {key.name!r} lacks the kind {OPERATE!r}"})
        path = flow.request.path.split("?")[0].rstrip("/")
        method = flow.request.method
        if path == ROUTES and method == "GET":
            return _json(200, {"engines": await self._rows()})
        if path not in (f"{ROUTES}/drain", f"{ROUTES}/resume"):
            return _json(404, {"detail": f"no route {method} {path}"})
        if method != "POST":
            return _json(405, {"detail": f"{path} takes POST"})
        try:
            body = json.loads(flow.request.get_content(strict=False) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("engine"), str):
            return _json(400, {"detail": 'the body must be a JSON object {"engine": "<URL>", ...}'})
        url = body["engine"].rstrip("/")
        if self.table.get(url) is None:
            return _json(404, {"detail": f"{url!r} is not one of the engines: {sorted(self.table.engines)}"})
        if path.endswith("/resume"):
            version = body.get("policy_version")
            if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
                return _json(400, {"detail": "policy_version must be an integer"})
            self.table.resume(url, version)
            # Answered once every process serves it at that version, so no later step has the old one.
            _, waiting = await self._wait(url, await self._publish(), RESUME_TIMEOUT_S, calls_done=False)
            return _json(200, {**self._row(await self._rows(), url), "processes_waiting": waiting})
        timeout = body.get("timeout_s", DRAIN_TIMEOUT_S)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
            return _json(400, {"detail": "timeout_s must be a number of seconds, at least 0"})
        self.table.drain(url)
        left, waiting = await self._wait(url, await self._publish(), timeout, calls_done=True)
        row = {**self._row(await self._rows(), url), "in_flight": left, "processes_waiting": waiting}
        return _json(200, {**row, "drained": left == 0 and waiting == 0})

    @staticmethod
    def _row(rows: list[dict[str, Any]], url: str) -> dict[str, Any]:
        return next(row for row in rows if row["engine"] == url)
