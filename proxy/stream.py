"""Live pass-through of streamed responses: each chunk goes to the agent as soon as the upstream sends it.

mitmproxy calls ``flow.response.stream`` with every chunk and a final ``b""``. The tee keeps a copy
for the record and, when the proxy injected token-id fields, rewrites complete SSE events on the
fly (an event is held back only until its own terminating blank line arrives).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from clawr1.proxy.sse import event_lines, split_events
from clawr1.proxy.token_ids import dump

Json = dict[str, Any]


class SseRewriter:
    """Applies ``transform`` to the JSON data of each complete event; other bytes pass unchanged.

    ``transform`` edits the object in place and says whether it changed it, or None to drop the event.
    """

    def __init__(self, transform: Callable[[Json], bool | None]) -> None:
        self._transform = transform
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        events, self._pending = split_events(self._pending + chunk)
        return b"".join(self._rewrite(raw, terminated=True) for raw in events)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._rewrite(rest, terminated=False) if rest else b""

    def _rewrite(self, raw: bytes, terminated: bool) -> bytes:
        lines = event_lines(raw)
        data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
        if not data:
            return raw
        try:
            obj = json.loads(b"\n".join(data))
        except ValueError:
            return raw
        if not isinstance(obj, dict):
            return raw
        changed = self._transform(obj)
        if changed is None:
            return b""
        if not changed:
            return raw
        out: list[bytes] = []
        for line in lines:
            if not line.startswith(b"data:"):
                out.append(line)
            elif data:
                out.append(b"data: " + dump(obj))
                data = []
        eol = b"\r\n" if b"\r\n" in raw else b"\n"
        return eol.join(out) + (eol + eol if terminated else b"")


class StreamTee:
    """The ``flow.response.stream`` callable of one recognised streamed call."""

    def __init__(self, rewriter: SseRewriter | None = None) -> None:
        self._rewriter = rewriter
        self.upstream = bytearray()
        # What the agent received, kept only when it differs from what the upstream sent.
        self.sent: bytearray | None = bytearray() if rewriter is not None else None
        self.first_chunk_at: float | None = None

    def __call__(self, chunk: bytes) -> list[bytes]:
        # Returns a list: mitmproxy writes an empty bytes chunk as the end of a chunked body.
        if chunk:
            if self.first_chunk_at is None:
                self.first_chunk_at = time.time()
            self.upstream += chunk
        if self._rewriter is None or self.sent is None:
            return [chunk] if chunk else []
        out = self._rewriter.feed(chunk) if chunk else self._rewriter.flush()
        self.sent += out
        return [out] if out else []
