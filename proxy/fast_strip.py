"""Taking injected token-id fields out of a JSON reply by editing its text, not re-serializing it.

``token_ids.strip_json`` defines what is removed; this module does the same edits on the engine's
own bytes, so the proxy's event loop never parses a prompt's thousands of token ids and never
re-serializes a reply. It must give what ``strip_json`` gives, or say ``UNSURE`` (the caller then
takes the JSON path):

1. Every occurrence of a key the proxy may remove (``"prompt_token_ids"``, ``"token_ids"``,
   ``"response_token_ids"``, ``"logprobs"``, ``"sglext"``, as the injection says) is located by
   plain substring search, and its value's extent found: a list of ids by ``find("]")`` and a check
   that only digits and commas lie between, ``null`` literally, anything else by json's C scanner.
2. Each such value is replaced by ``NaN`` and the (now small) rest is parsed, with every ``NaN``
   turned into a marker that says which value it stands for. The parse validates everything the
   search did not read.
3. ``strip_json``'s own walk runs over that object: each marker must sit where ``strip_json``
   would remove or null it (top-level ``prompt_token_ids``, a choice's id fields and ``logprobs``,
   ``sglext`` at either level), and each removal position must hold a marker or something
   ``strip_json`` leaves alone. Anything else (a key nested elsewhere, a duplicate key, a ``NaN``
   of the engine's own, a key spelled with ``\\u`` escapes, text that is not UTF-8) is UNSURE.
4. The edits are made on the original text: a value becomes ``null``, or its member is cut out
   with one adjacent comma. Everything else stays byte for byte as the engine wrote it.

For compact JSON (as vLLM and SGLang write it) the result equals ``dump(strip_json(...))`` byte for
byte; for any other layout it is the engine's own layout with only those members changed.
"""

from __future__ import annotations

import enum
import json
import json.scanner
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from clawr1.proxy.token_ids import (
    ID_FIELDS,
    Injection,
    carries_sglext,
    choice_list,
    is_empty_chunk,
    strip_body,
)

Json = dict[str, Any]


class Outcome(enum.Enum):
    UNCHANGED = "unchanged"  # strip_json would change nothing
    DROP = "drop"  # a stream chunk that only carried what the proxy asked for
    UNSURE = "unsure"  # take the JSON path


UNCHANGED, DROP, UNSURE = Outcome.UNCHANGED, Outcome.DROP, Outcome.UNSURE

# A key name made of [a-z_] can only be spelled otherwise with \u0041..\u007a escapes.
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7]")
_WHITESPACE = b" \t\r\n"
_COMMA, _ZERO, _COLON = ord(","), ord("0"), ord(":")
# Below this size a document parses and re-serializes faster than the search and edit take (their
# fixed cost is a few Python steps per member; a parse costs per number): the JSON path takes it.
FAST_FROM = 3072
# Id lists at least this long are checked with numpy (a prompt's ids: thousands of numbers).
_VECTOR_FROM = 512
_IDS_TAIL = b'token_ids"'  # "token_ids", "prompt_token_ids", "response_token_ids" (ID_FIELDS)
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_NULL, _DELETE, _KEEP = 0, 1, 2


class _Unsure(Exception):
    pass


@dataclass(slots=True)
class _Span:
    key_start: int  # the key's opening quote
    start: int  # the value's first character
    end: int  # one past the value's last character
    is_null: bool


class _Marker:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Markers:
    """``parse_constant`` hook: each NaN, in document order, becomes the marker of that span."""

    def __init__(self) -> None:
        self.made: list[_Marker] = []

    def __call__(self, _name: str) -> _Marker:
        marker = _Marker(len(self.made))
        self.made.append(marker)
        return marker


def _names(injection: Injection) -> tuple[bytes, ...]:
    """The quoted keys to look for (the id fields all end in ``token_ids"``: one search finds them)."""
    return (((_IDS_TAIL,) if injection.token_ids else ())
            + ((b'"logprobs"',) if injection.logprobs else ())
            + ((b'"sglext"',) if injection.sglext else ()))


def _id_list_end(data: bytes, start: int) -> int:
    """One past the ``]`` of a compact JSON list of non-negative ints at ``start``, or -1."""
    end = data.find(b"]", start)
    if end < 0:
        return -1
    inner = data[start + 1:end]
    if not inner:
        return end + 1
    if inner.translate(None, b"0123456789,") or inner[0] == _COMMA or inner[-1] == _COMMA:
        return -1
    if len(inner) < _VECTOR_FROM:
        # No empty element, and a 0 stands alone (JSON forbids leading zeros).
        if b",," in inner or (inner[0] == _ZERO and len(inner) > 1 and inner[1] != _COMMA):
            return -1
        zero = inner.find(b",0")
        while zero >= 0:
            if zero + 2 < len(inner) and inner[zero + 2] != _COMMA:
                return -1
            zero = inner.find(b",0", zero + 2)
        return end + 1
    chars = np.frombuffer(inner, np.uint8)
    comma = chars == _COMMA
    if (comma[1:] & comma[:-1]).any():
        return -1
    # A 0 that is followed by a digit must not start an element (at 0, or after a comma).
    leading = (chars[:-1] == _ZERO) & ~comma[1:]
    if leading[0] or (leading[1:] & comma[:-2]).any():
        return -1
    return end + 1


def _escapes_letters(data: bytes) -> bool:
    return b"\\u00" in data and _ESCAPED_LETTER.search(data) is not None


def _skip_whitespace(data: bytes, index: int) -> int:
    while index < len(data) and data[index] in _WHITESPACE:
        index += 1
    return index


def _scan_end(data: bytes, start: int) -> int:
    """One past the JSON value at ``start``, by json's C scanner (which needs text)."""
    text = data[start:].decode("utf-8")
    try:
        _, end = _SCAN(text, 0)
    except StopIteration as exc:
        raise _Unsure from exc
    return start + (end if text.isascii() else len(text[:end].encode("utf-8")))


def _key_start(data: bytes, name: bytes, at: int) -> int:
    """Where the key whose quoted name (or, for the id fields, its tail) was found at ``at`` opens,
    or -1 when it is not one of the proxy's keys."""
    if name != _IDS_TAIL:
        return at
    for prefix in (b'"', b'"prompt_', b'"response_'):
        if data.endswith(prefix, 0, at):
            return at - len(prefix)
    return -1


def _find_spans(data: bytes, names: tuple[bytes, ...]) -> list[_Span]:
    """The proxy's keys and their values, in document order. One forward pass: a search resumes
    after the value last taken, so a prompt's thousands of ids are read once, by ``_id_list_end``."""
    spans: list[_Span] = []
    cursor = 0
    pending = {name: data.find(name) for name in names}
    while True:
        found = [(at, name) for name, at in pending.items() if at >= 0]
        if not found:
            return spans
        at, name = min(found)
        key_start = _key_start(data, name, at)
        colon = _skip_whitespace(data, at + len(name))
        if key_start < cursor or colon >= len(data) or data[colon] != _COLON:
            pending[name] = data.find(name, at + len(name))
            continue  # not a key of ours, or a string value
        start = _skip_whitespace(data, colon + 1)
        end = -1
        is_null = data.startswith(b"null", start)
        if is_null:
            end = start + 4
        elif data.startswith(b"[", start):
            end = _id_list_end(data, start)
        if end < 0:
            end = _scan_end(data, start)
        spans.append(_Span(key_start, start, end, is_null))
        cursor = end
        for other, next_at in pending.items():
            if 0 <= next_at < cursor:  # this key, or inside the value just taken whole
                pending[other] = data.find(other, cursor)


def _plan(obj: Json, injection: Injection, spans: list[_Span]) -> list[tuple[Json, str, int, int]]:
    """``strip_json``'s walk over the reduced object: (holder, key, span index, action) for each span."""
    planned: list[tuple[Json, str, int, int]] = []
    seen: set[int] = set()

    def null_like(value: Any) -> bool:
        return value is None or (type(value) is _Marker and spans[value.index].is_null)

    keep_null = any(null_like(value) for key, value in obj.items() if key not in ID_FIELDS)

    def remove(holder: Json, key: str, keep: bool) -> None:
        if key not in holder:
            return
        value = holder[key]
        if type(value) is not _Marker:
            if keep and value is None:
                return  # strip_json leaves a null alone
            raise _Unsure  # a member the search did not find
        if value.index in seen:
            raise _Unsure
        seen.add(value.index)
        span = spans[value.index]
        action = _KEEP if keep and span.is_null else _NULL if keep else _DELETE
        planned.append((holder, key, value.index, action))

    choices = choice_list(obj)
    if injection.token_ids:
        remove(obj, "prompt_token_ids", keep_null)
        for choice in choices:
            for key in ID_FIELDS:
                remove(choice, key, keep_null)
    if injection.logprobs:
        for choice in choices:
            remove(choice, "logprobs", True)
    if injection.sglext:
        for holder in (obj, *choices):
            remove(holder, "sglext", False)
    if len(seen) != len(spans):
        raise _Unsure  # a key somewhere strip_json does not look
    return planned


def _edit(data: bytes, spans: list[_Span], actions: dict[int, int]) -> bytes:
    out: list[bytes] = []
    pos = 0
    for index, span in enumerate(spans):
        action = actions[index]
        if action == _NULL:
            out += (data[pos:span.start], b"null")
            pos = span.end
        elif action == _DELETE:
            before = span.key_start - 1
            while before >= pos and data[before] in _WHITESPACE:
                before -= 1
            if before >= pos and data[before] == _COMMA:
                start, end = before, span.end
            else:  # first member (or its comma went with the member before): take the comma after
                start, after = span.key_start, _skip_whitespace(data, span.end)
                end = after + 1 if after < len(data) and data[after] == _COMMA else span.end
            out.append(data[pos:start])
            pos = end
    out.append(data[pos:])
    return b"".join(out)


def strip_fast(data: bytes, injection: Injection, chunk: bool = False) -> bytes | Outcome:
    """What ``strip_json`` (``strip_chunk`` when ``chunk``) makes of the JSON document ``data``:
    the new bytes, UNCHANGED, DROP (chunks only), or UNSURE when only the JSON path can tell."""
    try:
        return _strip(data, injection, chunk)
    except Exception:  # noqa: BLE001 - any surprise: the JSON path decides
        return UNSURE


def _strip(data: bytes, injection: Injection, chunk: bool) -> bytes | Outcome:
    if json.detect_encoding(data) != "utf-8":
        return UNSURE
    spans = _find_spans(data, _names(injection))
    if not spans:
        # No member strip_json could touch: valid or not, the JSON path would leave it as it is.
        return UNSURE if _escapes_letters(data) else UNCHANGED
    parts: list[bytes] = []
    pos = 0
    for span in spans:
        parts += (data[pos:span.start], b"NaN")
        pos = span.end
    parts.append(data[pos:])
    markers = _Markers()
    try:
        # As json.loads reads bytes; the values taken out were checked as they were found.
        reduced = b"".join(parts)
        if _escapes_letters(reduced):  # a key of ours could be spelled with escapes outside the values
            return UNSURE
        obj = json.JSONDecoder(parse_constant=markers).decode(reduced.decode("utf-8", "surrogatepass"))
    except ValueError:
        return UNSURE
    if not isinstance(obj, dict) or len(markers.made) != len(spans):
        return UNSURE  # not an object, or NaN of the engine's own
    carried_sglext = carries_sglext(obj, injection)
    try:
        planned = _plan(obj, injection, spans)
    except _Unsure:
        return UNSURE
    actions = {index: action for _, _, index, action in planned}
    changed = any(action != _KEEP for action in actions.values())
    if chunk and carried_sglext:
        for holder, key, _, action in planned:
            if action == _DELETE:
                del holder[key]
            else:
                holder[key] = None
        if is_empty_chunk(obj):
            return DROP
    if not changed:
        return UNCHANGED
    return _edit(data, spans, actions)


def strip_reply(body: bytes, injection: Injection) -> bytes | None:
    """A plain reply without the injected fields (None: nothing to remove): the text edit when it
    is sure, else ``strip_body``'s JSON path; if both fail the agent gets the engine's body."""
    stripped = strip_fast(body, injection) if len(body) >= FAST_FROM else UNSURE
    if isinstance(stripped, bytes):
        return stripped
    if stripped is not UNSURE:
        return None
    try:
        return strip_body(body, injection)
    except Exception:  # noqa: BLE001 - e.g. a lone surrogate the JSON path cannot re-encode
        return None


def chunk_stripper(injection: Injection) -> Callable[[bytes], bytes | Outcome]:
    """The fast path of an ``SseRewriter`` for one call's injection (it skips events under FAST_FROM)."""
    return lambda data: strip_fast(data, injection, chunk=True)
