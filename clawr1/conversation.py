"""Content identity of chat messages, shared by the proxy (Kafka keys) and the streams (trajectory links).

A black-box call continues a trajectory when its messages start with an earlier call's messages
plus that call's reply. Agents echo replies back with cosmetic differences (``content: null`` vs
``""``, extra null fields, text parts vs. a plain string), so messages are compared in a canonical
form, and prefixes by chained digests so one table lookup per prefix finds the parent call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

_EMPTY = hashlib.sha256(b"clawr1.conversation").hexdigest()


def _canonical_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_canonical_part(p) for p in content]
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


def canonical_message(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a message that carry meaning: role, content, tool calls and their ids."""
    out: dict[str, Any] = {
        "role": message.get("role", ""),
        "content": _canonical_content(message.get("content")),
    }
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            [c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
            for c in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def message_digest(message: dict[str, Any]) -> str:
    blob = json.dumps(canonical_message(message), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def prefix_digests(messages: Sequence[dict[str, Any]]) -> list[str]:
    """``result[i]`` identifies ``messages[: i + 1]``: equal digests mean equal prefixes."""
    digests: list[str] = []
    current = _EMPTY
    for message in messages:
        current = hashlib.sha256((current + message_digest(message)).encode()).hexdigest()
        digests.append(current)
    return digests


def conversation_key(messages: Sequence[dict[str, Any]]) -> str:
    """Digest of the messages up to the first user turn: every continuation of a call keeps it,
    so all calls of one trajectory share a Kafka partition without any shared proxy state."""
    digests = prefix_digests(messages)
    if not digests:
        return _EMPTY
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return digests[i]
    return digests[-1]
