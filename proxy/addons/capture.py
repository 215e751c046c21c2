"""Snapshots each recognised call (request, response as the agent got it, timings, errors) and hands
it to the emitter; everything heavier happens on the emitter's thread."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from mitmproxy import http

from clawr1.proxy.addons.state import STATE_KEY, CallState, call_state, is_event_stream
from clawr1.proxy.record import CapturedCall
from clawr1.proxy.stream import StreamTee

# Cheap test for a streaming request; a false positive only costs response compression.
_STREAM_REQUESTED = re.compile(rb'"stream"\s*:\s*true')


class Capture:
    def __init__(self, submit: Callable[[CapturedCall], None]) -> None:
        self._submit = submit

    def request(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None:
            return
        if flow.response is not None:
            state.skip = True
        elif _STREAM_REQUESTED.search(state.request_body):
            # Compressed SSE could not be reassembled (or rewritten) chunk by chunk.
            flow.request.headers["accept-encoding"] = "identity"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = call_state(flow)
        if state is None or state.skip or flow.response is None or not is_event_stream(flow.response):
            return
        if state.injection is not None and state.rewriter is None:
            return  # compressed: the token-id addon strips it whole
        state.tee = StreamTee(state.rewriter)
        flow.response.stream = state.tee
        if state.rewriter is not None:
            flow.response.headers.pop("content-length", None)

    def response(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, flow.error.msg if flow.error else "unknown error")

    def _emit(self, flow: http.HTTPFlow, error: str | None) -> None:
        state: CallState | None = flow.metadata.get(STATE_KEY)
        if state is None or state.skip or state.emitted:
            return
        state.emitted = True
        response = flow.response
        engine_body = state.engine_body
        if state.tee is not None:
            body = bytes(state.tee.sent if state.tee.sent is not None else state.tee.upstream)
            if state.tee.sent is not None:
                engine_body = bytes(state.tee.upstream)
        else:
            body = (response.raw_content or b"") if response is not None else b""
        request = flow.request
        self._submit(CapturedCall(
            flow_id=flow.id,
            api=state.api.name,
            method=request.method,
            url=request.url,
            upstream=f"{request.scheme}://{request.host}:{request.port}",
            request_headers=state.request_headers,
            request_body=state.request_body,
            hints=state.hints,
            streamed=response is not None and is_event_stream(response),
            status=response.status_code if response is not None else None,
            response_headers=tuple(response.headers.items(multi=True)) if response is not None else (),
            response_body=body,
            response_encoding=response.headers.get("content-encoding", "") if response is not None else "",
            engine_body=engine_body,
            injection=state.injection,
            started=request.timestamp_start,
            first_byte=response.timestamp_start if response is not None else None,
            finished=(response.timestamp_end if response is not None else None) or time.time(),
            captured_at=time.time(),
            error=error,
            client_connection=flow.client_conn.id,
            notes=tuple(state.notes),
            engine=state.engine,
            engine_version=state.engine_version,
        ))
