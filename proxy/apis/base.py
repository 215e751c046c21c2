"""What every API parser produces: one reassembled reply, whatever the wire format was.

Each recognised API (OpenAI chat, completions, Responses, Anthropic messages) has a module of pure
functions from request/response JSON (or parsed SSE events) to these types, so parsing is tested
without servers and the record builder never branches on the API.
"""

from __future__ import annotations

import json
import math
import re
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawr1.core.json_depth import check_depth
from clawr1.proxy.sse import SseEvent

Json = dict[str, Any]


@dataclass
class AssembledChoice:
    index: int
    text: str = ""
    # OpenAI shape for every API: {"id", "type": "function", "function": {"name", "arguments"}}.
    tool_calls: list[Json] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    # The reply as the agent will echo it in its next request to the same API, normalized like
    # ``request_messages`` so trajectory links compare like with like.
    reply_messages: list[Json] = field(default_factory=list)


@dataclass
class Assembled:
    response: Json
    choices: list[AssembledChoice] = field(default_factory=list)
    model: str | None = None
    response_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # Why a stream counts as cut before its end (no finish reason, no end marker); None when complete.
    truncated: str | None = None


@dataclass(frozen=True)
class ApiSpec:
    name: str
    path_suffix: str
    request_messages: Callable[[Json], list[Json]]
    assemble: Callable[[Json], Assembled]
    assemble_stream: Callable[[Sequence[SseEvent]], Assembled]


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# A UTF-16 surrogate escaped in JSON ("\ud83d"): JavaScript's JSON.stringify writes a lone one (text cut
# inside a pair) so, and json.loads reads it into a string no UTF-8 encoder takes; in bytes also one
# encoded as UTF-8 (json.loads lets it pass) and any text in UTF-16 or UTF-32 (a zero in its first bytes).
_SURROGATE_ESCAPE = r"\\u[dD][89a-fA-F]"
_SURROGATE_IN_TEXT = re.compile(_SURROGATE_ESCAPE)
_SURROGATE_IN_BYTES = re.compile(_SURROGATE_ESCAPE.encode() + rb"|\xed[\xa0-\xbf]")


def _may_read_surrogates(data: str | bytes) -> bool:
    """Whether ``json.loads(data)`` may hold a lone UTF-16 surrogate; False when it cannot."""
    # rfind, not ``in``: a two-character needle whose last character is common ("u") is found backwards
    # in half the time (a 19 KB reply: 7 against 16 us).
    if isinstance(data, str):
        return data.rfind("\\u") >= 0 and _SURROGATE_IN_TEXT.search(data) is not None
    if 0 in data[:4]:  # UTF-16 or UTF-32 (or no JSON text): read it whole
        return True
    return (b"\xed" in data or data.rfind(b"\\u") >= 0) and _SURROGATE_IN_BYTES.search(data) is not None


def _whole_characters(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings and keys replaced by U+FFFD (an escaped pair reads
    as one character already): a record's text must encode as UTF-8, and a call that held one was not
    recorded at all."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_whole_characters(item) for item in value]
    if isinstance(value, dict):
        return {_whole_characters(key): _whole_characters(item) for key, item in value.items()}
    return value


def whole(value: Any, read_from: str | bytes) -> Any:
    """``value``, parsed from the JSON ``read_from``, with each lone surrogate replaced by U+FFFD when that
    text may hold one (checked first: ordinary text pays a substring test)."""
    return _whole_characters(value) if _may_read_surrogates(read_from) else value


def loads_whole(text: str) -> Any:
    """``json.loads`` for a record (``whole``); ``JsonTooDeep`` (a ValueError) past ``MAX_JSON_DEPTH``."""
    check_depth(text)
    return whole(json.loads(text), text)


def json_object(value: Any) -> Json:
    """``value`` when it is a JSON object, else an empty one (a field that is absent or malformed)."""
    return value if isinstance(value, dict) else {}


def text_or_empty(value: Any) -> str:
    """``value`` when it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def token_list(value: Any) -> list[int]:
    """Token ids as the engine sent them; anything that is not a list of 32-bit ints counts as absent.

    Prompts run to tens of thousands of ids: the check runs in C, not per id in Python. ``struct`` packs
    them as C ints in half the time ``array`` takes from a list; the array read from those bytes gives
    the same ints ``array(value)`` gave.
    """
    if not isinstance(value, list):
        return []
    try:
        return array("i", struct.pack(f"{len(value)}i", *value)).tolist()
    except struct.error:
        return []


def ext_ids(holder: Json) -> tuple[list[int], list[int]]:
    """SGLang's prompt and output ids from an object's ``sglext`` (or ``meta_info``), empty when absent."""
    for key in ("sglext", "meta_info"):
        ext = holder.get(key)
        if isinstance(ext, dict):
            return token_list(ext.get("input_ids")), token_list(ext.get("output_ids"))
    return [], []


def has_done_marker(events: Iterable[SseEvent]) -> bool:
    """OpenAI-style streams end with ``data: [DONE]``; without it the stream was cut."""
    return any(event.data.strip() == "[DONE]" for event in events)


def unfinished(choices: Iterable[AssembledChoice], done: bool) -> str | None:
    """Why an OpenAI-style stream is truncated (no ``[DONE]``, a choice without a finish reason)."""
    missing = [str(c.index) for c in choices if c.finish_reason is None]
    if missing:
        return f"choice {', '.join(missing)} has no finish_reason"
    return None if done else "no [DONE]"


def float_list(values: Sequence[Any]) -> list[float]:
    """Logprobs; a missing value (e.g. the first echoed prompt token) becomes NaN to keep alignment."""
    try:
        return array("d", values).tolist()
    except TypeError:
        return [float(v) if isinstance(v, int | float) else math.nan for v in values]


def function_call(call_id: Any, name: Any, arguments: Any) -> Json:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error_text(error: Any) -> str:
    """A short reason from an API error object (``{"error": {"message": ...}}`` and variants)."""
    if isinstance(error, dict):
        inner = error.get("error", error)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("type") or inner.get("code")
            if message:
                return str(message)
        elif inner:
            return str(inner)
    return str(error)


def json_events(events: Iterable[SseEvent], notes: list[str]) -> Iterator[tuple[SseEvent, Json]]:
    """The JSON objects of a stream's events. OpenAI's ``[DONE]`` is skipped; unparseable data is noted
    on the record, never fatal, because the agent already received it as the upstream sent it."""
    for event in events:
        if event.data.strip() == "[DONE]":
            continue
        try:
            data = loads_whole(event.data)
        except ValueError:
            notes.append(f"unparseable stream event: {event.data[:80]!r}")
            continue
        if isinstance(data, dict):
            yield event, data
