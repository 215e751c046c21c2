"""Server-sent events framing, shared by the live stream rewriter and the record builder.

Kept byte-oriented: the proxy must pass events on exactly as the upstream framed them, and only
touch the ``data:`` payload of an event when it has to remove fields it injected itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An event ends at a blank line; the spec allows CRLF, LF or CR line endings.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_END = re.compile(rb"\r\n|\n|\r")


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete raw events (each with its terminating blank line) and the unfinished remainder."""
    if b"\r" not in buffer:
        # LF framing (what engines send): bytes.split is many times faster than the pattern.
        *complete, rest = buffer.split(b"\n\n")
        return [event + b"\n\n" for event in complete], rest
    events: list[bytes] = []
    start = 0
    for match in _EVENT_END.finditer(buffer):
        events.append(buffer[start:match.end()])
        start = match.end()
    return events, buffer[start:]


def event_lines(raw: bytes) -> list[bytes]:
    return [line for line in _LINE_END.split(raw) if line]


def parse_event(raw: bytes) -> SseEvent | None:
    """None for comment-only or empty events (keep-alives)."""
    name = ""
    data: list[str] = []
    for line in event_lines(raw):
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            data.append(value.decode("utf-8", "replace"))
    if not data and not name:
        return None
    return SseEvent(name, "\n".join(data))


def parse_stream(body: bytes) -> list[SseEvent]:
    """All events of a finished stream; an unterminated last event is kept (the stream may have been cut)."""
    raw_events, rest = split_events(body)
    if rest.strip():
        raw_events.append(rest)
    return [e for e in (parse_event(r) for r in raw_events) if e is not None]
