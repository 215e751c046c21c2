"""SSE framing: events split at blank lines whatever the line endings, partial events kept back."""

from __future__ import annotations

from clawr1.proxy.sse import SseEvent, parse_event, parse_stream, split_events


def test_split_keeps_the_unfinished_event_for_later() -> None:
    events, rest = split_events(b"data: 1\n\ndata: 2\r\n\r\ndata: 3")
    assert events == [b"data: 1\n\n", b"data: 2\r\n\r\n"]
    assert rest == b"data: 3"


def test_events_reassemble_across_arbitrary_chunk_boundaries() -> None:
    stream = b"event: a\ndata: {\"x\": 1}\n\n: keep-alive\n\ndata: [DONE]\n\n"
    pending, seen = b"", []
    for i in range(len(stream)):
        events, pending = split_events(pending + stream[i:i + 1])
        seen += events
    assert b"".join(seen) == stream
    assert [parse_event(e) for e in seen] == [SseEvent("a", '{"x": 1}'), None, SseEvent("", "[DONE]")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert parse_event(b"data: first\ndata:second\n\n") == SseEvent("", "first\nsecond")


def test_a_cut_stream_keeps_its_last_unterminated_event() -> None:
    assert parse_stream(b"data: a\n\ndata: b") == [SseEvent("", "a"), SseEvent("", "b")]


def test_lf_framing_splits_as_the_pattern_does() -> None:
    import re

    pattern = re.compile(rb"\r\n\r\n|\n\n|\r\r")
    buffers = (b"", b"a", b"\n", b"\n\n", b"a\n\n\nb\n\n", b"a\n\n\n\nb", b"\n\n\n\n\n",
               b"data: x\n\ndata: y\n")
    for buffer in buffers:
        starts = [0, *(m.end() for m in pattern.finditer(buffer))]
        expected = [buffer[a:b] for a, b in zip(starts, starts[1:], strict=False)], buffer[starts[-1]:]
        assert split_events(buffer) == expected, buffer
