"""``--capture-token-ids``: ask the engine for token ids and logprobs, and give the agent its reply
without them (streamed chunks are rewritten live, plain bodies before they are sent)."""

from __future__ import annotations

import functools

from mitmproxy import http

from proxy.addons.state import call_state, is_encoded, is_event_stream
from proxy.stream import SseRewriter
from proxy.token_ids import inject_body, strip_body, strip_json


class TokenIdCapture:
    def request(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.skip or flow.response is not None:
            return
        injected = inject_body(state.api.name, state.request_body)
        if injected is not None:
            flow.request.content, state.injection = injected

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.injection is None or flow.response is None:
            return
        # A compressed stream cannot be rewritten chunk by chunk: it is then buffered and stripped whole.
        if is_event_stream(flow.response) and not is_encoded(flow.response):
            state.rewriter = SseRewriter(functools.partial(strip_json, injection=state.injection))

    def response(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.injection is None or state.tee is not None or flow.response is None:
            return
        body = flow.response.get_content(strict=False) or b""
        if is_event_stream(flow.response):
            rewriter = SseRewriter(functools.partial(strip_json, injection=state.injection))
            stripped: bytes | None = rewriter.feed(body) + rewriter.flush()
        else:
            stripped = strip_body(body, state.injection)
        if stripped is not None and stripped != body:
            state.engine_body = body
            flow.response.content = stripped
