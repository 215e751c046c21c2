"""Reads the agent's ``X-Claw-*`` hints into the call state and keeps them from the upstream.

Hints name a trajectory, so with API keys configured they are a write to someone's trajectory and
need a credential: the compat port's seal (``X-Claw-Source``), or the agent's own API key in
``X-Claw-Key`` (a key of kind ``steps``; the call is then recorded as that key's). A call with hints
and neither is still relayed and captured, as the proxy's own (its identity, no hints): capture never
breaks the agent's traffic; the record's capture notes and ``clawr1_proxy_hints_ignored`` say so.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from mitmproxy import http

from clawr1.core.relay_source import SOURCE_HEADER, unseal
from clawr1.gateway.auth import KeyRing
from clawr1.proxy.addons.state import CallState, call_state
from clawr1.proxy.hints import (
    HEADER_PREFIX,
    HINTS_IGNORED,
    KEY,
    HintError,
    Hints,
    hint_header_names,
    parse_hints,
)

log = logging.getLogger(__name__)

UNSEALED_SOURCE = f"{SOURCE_HEADER} ignored: not sealed by this stack's compat port"


def bad_request(reason: str) -> http.Response:
    """An error body both OpenAI and Anthropic SDKs surface with its message."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "code": "clawr1_bad_hint",
                                       "message": reason}}
    return http.Response.make(400, json.dumps(body), {"content-type": "application/json"})


class ClawHints:
    """``relay_secret``: what the compat port seals the calling key's name with (``X-Claw-Source``);
    a name is taken only with its seal, never from an agent's own header. ``keys``: the stack's API
    keys; when there are any, hints need a credential."""

    def __init__(self, relay_secret: bytes = b"", keys: KeyRing | None = None) -> None:
        self._secret = relay_secret
        self._keys = keys or KeyRing()

    def request(self, flow: http.HTTPFlow) -> None:
        # The names as sent (``headers.keys()`` looks each one up again: ~20 µs a call, every call).
        names = hint_header_names(name.decode("utf-8", "surrogateescape")
                                  for name, _ in flow.request.headers.fields)
        if not names:
            return
        state = call_state(flow)
        if state is not None:
            # The key is a secret: never recorded, whatever becomes of the hints.
            state.request_headers = tuple((n, v) for n, v in state.request_headers if n.lower() != KEY)
            self._read(flow, state)
        for name in names:
            flow.request.headers.pop(name, None)  # gone already when sent in two spellings

    def _read(self, flow: http.HTTPFlow, state: CallState) -> None:
        try:
            hints, error = parse_hints(flow.request.headers.items(multi=True)), None
        except HintError as exc:
            hints, error = Hints(), exc
        source = self._source(flow, state, hints)
        if source is None and self._keys.enabled:
            self._ignore(state)  # not read at all, so a malformed one refuses nothing either
        elif error is not None:
            state.skip = True
            flow.response = bad_request(str(error))
        else:
            state.hints = hints if source is None else replace(hints, source_name=source)

    def _source(self, flow: http.HTTPFlow, state: CallState, hints: Hints) -> str | None:
        """Who the call is, when it says so credibly: the compat port's seal (for the hinted trajectory),
        else a key of kind steps in ``X-Claw-Key``."""
        sealed = flow.request.headers.get(SOURCE_HEADER)
        if sealed is not None:
            source = unseal(self._secret, sealed, hints.trajectory_id or "") if self._secret else None
            if source is not None:
                return source
            state.notes.append(UNSEALED_SOURCE)
        presented = flow.request.headers.get(KEY)
        key = self._keys.identify(presented.strip()) if presented and self._keys.enabled else None
        return key.name if key is not None and "steps" in key.kinds else None

    @staticmethod
    def _ignore(state: CallState) -> None:
        """Capture the call as the proxy's own: no hints, and no ``X-Claw-*`` header in its record."""
        state.hints = Hints()
        state.request_headers = tuple((n, v) for n, v in state.request_headers
                                      if not n.lower().startswith(HEADER_PREFIX))
        state.notes.append(HINTS_IGNORED)
        log.warning("a call's X-Claw-* hints were ignored: API keys are configured and it carried no "
                    "proxy credential")
