"""Reads the agent's ``X-Claw-*`` hints into the call state and keeps them from the upstream."""

from __future__ import annotations

import json
from dataclasses import replace

from mitmproxy import http

from clawr1.core.relay_source import SOURCE_HEADER, unseal
from clawr1.proxy.addons.state import call_state
from clawr1.proxy.hints import HintError, hint_header_names, parse_hints

UNSEALED_SOURCE = f"{SOURCE_HEADER} ignored: not sealed by this stack's compat port"


def bad_request(reason: str) -> http.Response:
    """An error body both OpenAI and Anthropic SDKs surface with its message."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "code": "clawr1_bad_hint",
                                       "message": reason}}
    return http.Response.make(400, json.dumps(body), {"content-type": "application/json"})


class ClawHints:
    """``relay_secret``: what the compat port seals the calling key's name with (``X-Claw-Source``);
    a name is taken only with its seal, never from an agent's own header."""

    def __init__(self, relay_secret: bytes = b"") -> None:
        self._secret = relay_secret

    def request(self, flow: http.HTTPFlow) -> None:
        names = hint_header_names(flow.request.headers.keys())
        if not names:
            return
        state = call_state(flow)
        if state is not None:
            try:
                hints = parse_hints(flow.request.headers.items(multi=True))
            except HintError as exc:
                state.skip = True
                flow.response = bad_request(str(exc))
                return
            sealed = flow.request.headers.get(SOURCE_HEADER)
            if sealed is not None:
                source = unseal(self._secret, sealed, hints.trajectory_id or "") if self._secret else None
                if source is None:
                    state.notes.append(UNSEALED_SOURCE)
                else:
                    hints = replace(hints, source_name=source)
            state.hints = hints
        for name in names:
            del flow.request.headers[name]
