"""Per-call state shared by the addons through ``flow.metadata``.

Whichever addon first touches a recognised call creates the state, and creating it snapshots the
request exactly as the agent sent it, before any addon strips hint headers or injects fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mitmproxy import http

from clawr1.proxy.apis import ApiSpec, detect_api
from clawr1.proxy.hints import Hints
from clawr1.proxy.stream import SseRewriter, StreamTee
from clawr1.proxy.token_ids import Injection

STATE_KEY = "clawr1.call"


@dataclass
class CallState:
    api: ApiSpec
    request_headers: tuple[tuple[str, str], ...]
    request_body: bytes
    hints: Hints = Hints()
    injection: Injection | None = None
    rewriter: SseRewriter | None = None
    tee: StreamTee | None = None
    # The engine's plain response body when the agent got a rewritten copy.
    engine_body: bytes | None = None
    # What the hooks noticed, for the record's ``capture_notes`` (e.g. why no token ids were asked for).
    notes: list[str] = field(default_factory=list)
    # The engine the reverse port sent the call to, and the policy version it serves (set by resume).
    engine: str | None = None
    engine_version: int | None = None
    # The proxy answered the call itself (bad hint, missing proxy auth): nothing to record.
    skip: bool = False
    emitted: bool = False


def call_state(flow: http.HTTPFlow) -> CallState | None:
    """The state of a recognised LLM call, None for any other traffic (call from ``request`` on)."""
    if STATE_KEY in flow.metadata:
        return flow.metadata[STATE_KEY]
    api = detect_api(flow.request.method, flow.request.path)
    state = None
    if api is not None:
        state = CallState(api, tuple(flow.request.headers.items(multi=True)),
                          flow.request.get_content(strict=False) or b"")
    flow.metadata[STATE_KEY] = state
    return state


def is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").lower().startswith("text/event-stream")


def is_encoded(response: http.Response) -> bool:
    return response.headers.get("content-encoding", "identity").lower() not in {"", "identity"}
