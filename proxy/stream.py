"""Live pass-through of streamed responses: each chunk goes to the agent as soon as the upstream sends it.

mitmproxy calls ``flow.response.stream`` with every chunk and a final ``b""``. The tee keeps a copy
for the record and, when the proxy injected token-id fields, rewrites complete SSE events on the
fly (an event is held back only until its own terminating blank line arrives).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from clawr1.proxy.sse import event_lines, split_events
from clawr1.proxy.token_ids import DROPPED, Injection, rewrite_json, strip_chunk

Json = dict[str, Any]
logger = logging.getLogger("clawr1.proxy")


class SseRewriter:
    """Applies ``transform`` to the JSON data of each complete event; other bytes pass unchanged.

    ``transform`` edits the object in place and says whether it changed it, or None to drop the event.
    The data is parsed with ``token_ids.load`` (orjson where it reads exactly what the standard library
    would), its id lists cut first when ``cut`` (``token_ids.rewrite_json``). An event that cannot be
    rewritten passes unchanged: the agent's stream never breaks because of the rewrite.
    """

    def __init__(self, transform: Callable[[Json], bool | None], cut: bool = False) -> None:
        self._transform = transform
        self._cut = cut
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        events, self._pending = split_events(self._pending + chunk)
        return b"".join(self._rewrite(raw, terminated=True) for raw in events)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._rewrite(rest, terminated=False) if rest else b""

    def _rewrite(self, raw: bytes, terminated: bool) -> bytes:
        try:
            return self._rewrite_json(raw, terminated)
        except Exception:  # noqa: BLE001 - the agent gets the event as the engine sent it
            logger.exception("could not rewrite a stream event; passing it on unchanged")
            return raw

    def _rewrite_json(self, raw: bytes, terminated: bool) -> bytes:
        line = _one_data_line(raw)
        if line is not None:  # as engines send events: only the data changes, the framing stays as it came
            start, end = line
            return self._rewrite_data(raw, raw[start:end], lambda data: raw[:start] + data + raw[end:])
        lines = event_lines(raw)
        data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
        if not data:
            return raw

        def framed(new: bytes) -> bytes:
            out: list[bytes] = []
            written = False
            for line in lines:
                if not line.startswith(b"data:"):
                    out.append(line)
                elif not written:
                    out.append(b"data: " + new)
                    written = True
            eol = b"\r\n" if b"\r\n" in raw else b"\n"
            return eol.join(out) + (eol + eol if terminated else b"")

        return self._rewrite_data(raw, b"\n".join(data), framed)

    def _rewrite_data(self, raw: bytes, data: bytes, framed: Callable[[bytes], bytes]) -> bytes:
        """The event with its data stripped (``framed`` puts new data in place), as it came when nothing
        changed or the data is not a JSON object, nothing when the transform drops it."""
        try:
            out = rewrite_json(data, self._transform, self._cut)
        except ValueError:
            return raw
        if out is DROPPED:
            return b""
        return framed(out) if isinstance(out, bytes) else raw


def _one_data_line(raw: bytes) -> tuple[int, int] | None:
    """Where the data of an event that is one ``data:`` line and its terminator starts and ends."""
    if not raw.startswith(b"data:"):
        return None
    cr, lf = raw.find(b"\r"), raw.find(b"\n")
    end = len(raw) if cr < 0 and lf < 0 else min(i for i in (cr, lf) if i >= 0)
    if raw[end:].strip(b"\r\n"):
        return None
    return (6 if raw.startswith(b"data: ") else 5), end


def token_id_rewriter(injection: Injection) -> SseRewriter:
    """The rewriter that takes what ``injection`` added out of each event of a stream."""
    return SseRewriter(functools.partial(strip_chunk, injection=injection), cut=injection.token_ids)


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
