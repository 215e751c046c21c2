"""``--capture-token-ids``: ask the engine for token ids and logprobs, and give the agent its reply
without them (streamed chunks are rewritten live, plain bodies before they are sent).

Only upstreams the policy accepts are asked. One that answers an injected field with a 400 (OpenAI's
API, reasoning models) gets the agent's own request again, once, without the injected fields; the
agent receives that answer, and the upstream is not asked again for the rest of the process.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import replace

import httpx
from mitmproxy import http

from clawr1.proxy.addons.state import CallState, call_state, is_encoded, is_event_stream
from clawr1.proxy.stream import token_id_rewriter
from clawr1.proxy.token_ids import (
    SGLEXT_HEADERS,
    TOKEN_ID_APIS,
    Injection,
    TokenIdPolicy,
    inject_body,
    refused_field,
    strip_body,
    wants_sglext,
)

_SGLEXT_ASKED = tuple((name.encode(), b"1") for name in SGLEXT_HEADERS)
# Headers that describe one hop's connection or framing, never the request or response itself.
_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                          "proxy-connection", "te", "upgrade"})


class TokenIdCapture:
    def __init__(self, policy: TokenIdPolicy, verify: ssl.SSLContext | bool = True) -> None:
        self._policy = policy
        self._verify = verify
        self._client: httpx.AsyncClient | None = None

    def request(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.skip or flow.response is not None or state.api.name not in TOKEN_ID_APIS:
            return
        request = flow.request
        reason = self._policy.skip_reason(request.host, request.port)
        if reason is not None:
            state.notes.append(reason)
            return
        injected = inject_body(state.api.name, state.request_body)
        injection = Injection(token_ids=False, logprobs=False)
        if injected is not None:
            request.content, injection = injected
        sent = [(name.lower(), value) for name, value in state.request_headers]
        if not wants_sglext({name for name, value in sent if value}, state.request_body):
            if any(name in SGLEXT_HEADERS for name, _ in sent):  # sent empty: replaced
                for name in SGLEXT_HEADERS:
                    request.headers[name] = "1"
            else:  # in one step: each header set scans every header
                request.headers.fields += _SGLEXT_ASKED
            injection = replace(injection, sglext=True)
        state.injection = injection

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.injection is None or flow.response is None:
            return
        # A compressed stream cannot be rewritten chunk by chunk: it is then buffered and stripped whole.
        if is_event_stream(flow.response) and not is_encoded(flow.response):
            state.rewriter = token_id_rewriter(state.injection)

    async def response(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.injection is None or state.tee is not None or flow.response is None:
            return
        body = flow.response.get_content(strict=False) or b""
        refused = refused_field(flow.response.status_code, body, state.injection)
        if refused is not None:
            await self._retry_without_injection(flow, state, refused)
            return
        if is_event_stream(flow.response):
            rewriter = token_id_rewriter(state.injection)
            stripped: bytes | None = rewriter.feed(body) + rewriter.flush()
        else:
            stripped = strip_body(body, state.injection)
        if stripped is not None and stripped != body:
            state.engine_body = body
            flow.response.content = stripped

    async def _retry_without_injection(self, flow: http.HTTPFlow, state: CallState, refused: str) -> None:
        """Send the agent's own request again and make its answer the flow's response (buffered: this
        happens once per refusing upstream). If the retry fails, the agent gets the refusal."""
        assert flow.response is not None and state.injection is not None
        request, status = flow.request, flow.response.status_code
        self._policy.remember_refusal(request.host, request.port)
        dropped = _HOP_HEADERS | (set(SGLEXT_HEADERS) if state.injection.sglext else set())
        headers = [(k, v) for k, v in request.headers.fields if k.decode("latin-1").lower() not in dropped]
        if self._client is None:
            self._client = httpx.AsyncClient(verify=self._verify, trust_env=False, timeout=None)
        started = time.time()
        try:
            upstream = await self._client.send(
                self._client.build_request(request.method, request.url, headers=headers,
                                           content=state.request_body),
                stream=True,
            )
            first_byte = time.time()
            try:
                raw = b"".join([chunk async for chunk in upstream.aiter_raw()])
            finally:
                await upstream.aclose()
        except httpx.HTTPError as exc:
            state.notes.append(f"upstream refused the injected field {refused!r} (HTTP {status}); "
                               f"the retry without it failed: {exc}")
            return
        response = http.Response.make(upstream.status_code, b"", http.Headers(
            [(k, v) for k, v in upstream.headers.raw if k.decode("latin-1").lower() not in _HOP_HEADERS]))
        response.http_version = flow.response.http_version
        response.raw_content = raw
        response.headers["content-length"] = str(len(raw))
        response.timestamp_start, response.timestamp_end = first_byte, time.time()
        flow.response = response
        state.injection = None
        state.notes.append(f"token ids not available: {request.host}:{request.port} refused the injected "
                           f"field {refused!r} (HTTP {status}); retried without injected fields "
                           f"in {1000 * (response.timestamp_end - started):.0f} ms")

    async def done(self) -> None:
        if self._client is not None:
            await self._client.aclose()
