"""Reads the agent's ``X-Claw-*`` hints into the call state and keeps them from the upstream."""

from __future__ import annotations

import json

from mitmproxy import http

from clawr1.proxy.addons.state import call_state
from clawr1.proxy.hints import HintError, hint_header_names, parse_hints


def bad_request(reason: str) -> http.Response:
    """An error body both OpenAI and Anthropic SDKs surface with its message."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "code": "clawr1_bad_hint",
                                       "message": reason}}
    return http.Response.make(400, json.dumps(body), {"content-type": "application/json"})


class ClawHints:
    def request(self, flow: http.HTTPFlow) -> None:
        names = hint_header_names(flow.request.headers.keys())
        if not names:
            return
        state = call_state(flow)
        if state is not None:
            try:
                state.hints = parse_hints(flow.request.headers.items(multi=True))
            except HintError as exc:
                state.skip = True
                flow.response = bad_request(str(exc))
                return
        for name in names:
            del flow.request.headers[name]
