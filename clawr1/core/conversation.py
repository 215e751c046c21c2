"""Content identity of chat messages, shared by the proxy (Kafka keys) and the streams (trajectory links).

A black-box call continues a trajectory when its messages start with an earlier call's messages
plus that call's reply. Agents echo replies back with cosmetic differences (``content: null`` vs
``""``, extra null fields, text parts vs. a plain string), frameworks re-serialize tool-call
arguments (``{"q": "x"}`` vs ``{"q":"x"}``), and providers let agents drop reasoning they were sent
(Anthropic thinking blocks, Responses-API reasoning items). So messages are compared in a
canonical form that parses arguments and ignores reasoning, and prefixes by chained digests so one
table lookup per prefix finds the parent call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import orjson

from clawr1.core.json_depth import check_depth

_EMPTY = hashlib.sha256(b"clawr1.core.conversation").hexdigest()
# Content parts and whole messages (Responses-API items) that carry reasoning an agent may drop.
_REASONING_PARTS = frozenset({"thinking", "redacted_thinking", "reasoning"})
_REASONING_ROLES = frozenset({"reasoning"})


def _canonical_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_canonical_part(p) for p in content
                 if not (isinstance(p, dict) and p.get("type") in _REASONING_PARTS)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
        return parts
    return content


def _canonical_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in {"text", "input_text", "output_text"}:
        return part.get("text", "")
    if kind == "tool_use":
        return {"tool_use": [part.get("id"), part.get("name"), part.get("input")]}
    if kind == "tool_result":
        return {"tool_result": [part.get("tool_use_id"), _canonical_content(part.get("content"))]}
    return {k: v for k, v in sorted(part.items()) if v is not None and k != "cache_control"}


def canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments as parsed JSON when they parse: key order and spacing carry no meaning.
    Arguments nested deeper than ``MAX_JSON_DEPTH`` stay the text they are (never a ``RecursionError``)."""
    if isinstance(arguments, str):
        try:
            check_depth(arguments)
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def is_reasoning(message: dict[str, Any]) -> bool:
    """A message that is only the model's reasoning (agents may drop it when they echo history)."""
    return message.get("role") in _REASONING_ROLES


def canonical_message(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a message that carry meaning: role, content, tool calls and their ids."""
    out: dict[str, Any] = {
        "role": message.get("role", ""),
        "content": _canonical_content(message.get("content")),
    }
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            [c.get("id"), (c.get("function") or {}).get("name"),
             canonical_arguments((c.get("function") or {}).get("arguments"))]
            for c in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


_INT64 = range(-(2**63), 2**63)


def _orjson_writes_the_same(value: Any) -> bool:
    """Whether orjson writes ``value`` byte for byte as ``json.dumps(sort_keys, ensure_ascii=False,
    compact)`` does: strings (every code point escapes alike), 64-bit ints, bools, None, lists and
    str-keyed dicts. Some floats are spelled differently (``1.5e-7`` against ``1.5e-07``, NaN as
    ``null``), so floats and anything else take the standard library."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return value in _INT64
    if kind is list:
        return all(_orjson_writes_the_same(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _orjson_writes_the_same(v) for k, v in value.items())
    return False


def _canonical_json(canonical: dict[str, Any]) -> bytes:
    """The canonical message's JSON, keys sorted, compact, UTF-8: the bytes its digest covers (stored
    state and Kafka keys hold digests, so they never change). orjson where it writes the same bytes:
    the standard library's encoder was the largest single cost of linking a call."""
    if _orjson_writes_the_same(canonical):
        try:
            return orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, nesting past orjson's limit: as before
            pass
    return json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def message_digest(message: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical_json(canonical_message(message))).hexdigest()


def prefix_digests(messages: Sequence[dict[str, Any]], after: str | None = None) -> list[str]:
    """``result[i]`` identifies ``messages[: i + 1]``: equal digests mean equal prefixes. ``after``, the
    last digest of messages before these, continues that chain.

    Reasoning messages do not count: ``result[i]`` repeats the digest before one."""
    digests: list[str] = []
    current = after or _EMPTY
    for message in messages:
        if not is_reasoning(message):
            current = hashlib.sha256((current + message_digest(message)).encode()).hexdigest()
        digests.append(current)
    return digests


def conversation_key(messages: Sequence[dict[str, Any]]) -> str:
    """Digest of the messages up to the first user turn: every continuation of a call keeps it,
    so all calls of one trajectory share a Kafka partition without any shared proxy state."""
    # Digests only up to that turn: a long conversation's later messages are not hashed on every call.
    end = next((i + 1 for i, message in enumerate(messages) if message.get("role") == "user"), len(messages))
    digests = prefix_digests(messages[:end])
    return digests[-1] if digests else _EMPTY
