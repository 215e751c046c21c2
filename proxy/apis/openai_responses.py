"""OpenAI Responses API (``/v1/responses``), plain and streamed as typed events.

A response's ``output`` is a list of items (messages, function calls, reasoning, ...); an agent that
keeps its own history echoes those items as the next request's ``input``. Items are normalized to
chat-shaped messages here, the same way for input and output, so a later call's input starts with
an earlier call's input plus output whenever the agent continued that conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clawr1.proxy.apis.base import (
    Assembled,
    AssembledChoice,
    Json,
    error_text,
    function_call,
    int_or_none,
    json_events,
    json_object,
)
from clawr1.proxy.sse import SseEvent

NAME = "openai.responses"
PATH_SUFFIX = "/responses"
_FINAL_EVENTS = {"response.completed", "response.incomplete", "response.failed"}


def normalize_item(item: Any) -> Json:
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if not isinstance(item, dict):
        return {"role": "", "content": json.dumps(item, sort_keys=True)}
    kind = item.get("type")
    if kind == "function_call":
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [function_call(item.get("call_id"), item.get("name"), item.get("arguments"))],
        }
    if kind == "function_call_output":
        output = item.get("output")
        return {
            "role": "tool",
            "tool_call_id": item.get("call_id"),
            "content": output if isinstance(output, str | list) else json.dumps(output),
        }
    if "role" in item and kind in (None, "message"):
        return {"role": item.get("role"), "content": item.get("content")}
    rest = {k: v for k, v in item.items() if k not in {"id", "status"} and v is not None}
    return {"role": str(kind or ""), "content": json.dumps(rest, sort_keys=True, separators=(",", ":"))}


def request_messages(body: Json) -> list[Json]:
    messages: list[Json] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        messages.extend(normalize_item(item) for item in items)
    return messages


def _output_text(item: Json, kind: str = "output_text", key: str = "text") -> str:
    return "".join(
        str(part.get(key, ""))
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == kind
    )


def assemble(body: Json) -> Assembled:
    output = [item for item in body.get("output") or [] if isinstance(item, dict)]
    status = body.get("status")
    details = json_object(body.get("incomplete_details"))
    finish = f"incomplete:{details.get('reason')}" if status == "incomplete" and details else status
    usage = json_object(body.get("usage"))
    messages = [item for item in output if item.get("type") == "message"]
    refusal = "".join(_output_text(item, "refusal", "refusal") for item in messages)
    choice = AssembledChoice(
        index=0,
        text="".join(_output_text(item) for item in messages) or refusal,
        tool_calls=[
            function_call(item.get("call_id"), item.get("name"), item.get("arguments"))
            for item in output
            if item.get("type") == "function_call"
        ],
        finish_reason="refusal" if refusal else finish,
        reply_messages=[normalize_item(item) for item in output],
    )
    return Assembled(
        response=body,
        choices=[choice],
        model=body.get("model"),
        response_id=body.get("id"),
        prompt_tokens=int_or_none(usage.get("input_tokens")),
        completion_tokens=int_or_none(usage.get("output_tokens")),
        error=error_text(body["error"]) if body.get("error") else None,
    )


def _partial_response(events: Sequence[Json]) -> Json:
    """A cut stream has no final event: rebuild what the agent saw from the item events."""
    base: Json = {}
    items: dict[int, Json] = {}
    for data in events:
        kind = data.get("type")
        index = int_or_none(data.get("output_index")) or 0
        if kind in {"response.created", "response.in_progress"} and isinstance(data.get("response"), dict):
            base = dict(data["response"])
        elif kind in {"response.output_item.added", "response.output_item.done"} and isinstance(
            data.get("item"), dict
        ):
            items[index] = dict(data["item"])
        elif kind == "response.output_text.delta":
            item = items.setdefault(index, {"type": "message", "role": "assistant", "content": []})
            parts = item.setdefault("content", [])
            if not parts:
                parts.append({"type": "output_text", "text": ""})
            parts[-1] = {**parts[-1], "text": parts[-1].get("text", "") + str(data.get("delta", ""))}
        elif kind == "response.function_call_arguments.delta":
            item = items.setdefault(index, {"type": "function_call", "arguments": ""})
            item["arguments"] = str(item.get("arguments") or "") + str(data.get("delta", ""))
    base["output"] = [items[i] for i in sorted(items)]
    base["status"] = "incomplete"
    return base


def assemble_stream(events: Sequence[SseEvent]) -> Assembled:
    parsed: list[Json] = []
    notes: list[str] = []
    error: str | None = None
    for event, data in json_events(events, notes):
        data.setdefault("type", event.event)
        if data["type"] == "error":
            error = error_text(data)
        parsed.append(data)
    final = next(
        (
            d["response"]
            for d in reversed(parsed)
            if d.get("type") in _FINAL_EVENTS and isinstance(d.get("response"), dict)
        ),
        None,
    )
    assembled = assemble(final if final is not None else _partial_response(parsed))
    assembled.notes.extend(notes)
    assembled.error = assembled.error or error
    if final is None:
        assembled.truncated = "no response.completed, response.incomplete or response.failed event"
    return assembled
