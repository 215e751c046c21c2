"""Anthropic messages (``/v1/messages``), plain and streamed as typed events.

The system prompt travels beside the messages; it is put first as a system message so the
conversation key covers it, as it does for the OpenAI APIs. A refusal is ``stop_reason: "refusal"``
with whatever text came before it; a stream without ``message_stop`` was cut.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from clawr1.proxy.apis.base import (
    Assembled,
    AssembledChoice,
    Json,
    error_text,
    function_call,
    int_or_none,
    json_events,
    json_object,
    loads_whole,
)
from clawr1.proxy.sse import SseEvent

NAME = "anthropic.messages"
PATH_SUFFIX = "/messages"


def request_messages(body: Json) -> list[Json]:
    messages: list[Json] = []
    if body.get("system"):
        messages.append({"role": "system", "content": body["system"]})
    raw = body.get("messages")
    if isinstance(raw, list):
        messages.extend(m for m in raw if isinstance(m, dict))
    return messages


def _prompt_tokens(usage: Json) -> int | None:
    """Anthropic counts cached prompt tokens apart from ``input_tokens``; the prompt is all of them."""
    parts = [
        int_or_none(usage.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    return None if parts[0] is None else sum(p for p in parts if p is not None)


def assemble(body: Json) -> Assembled:
    blocks = [b for b in body.get("content") or [] if isinstance(b, dict)]
    usage = json_object(body.get("usage"))
    choice = AssembledChoice(
        index=0,
        text="".join(b.get("text", "") for b in blocks if b.get("type") == "text"),
        tool_calls=[
            function_call(b.get("id"), b.get("name"), json.dumps(b.get("input"), ensure_ascii=False))
            for b in blocks
            if b.get("type") == "tool_use"
        ],
        finish_reason=body.get("stop_reason"),
        reply_messages=[{"role": body.get("role", "assistant"), "content": blocks}],
    )
    return Assembled(
        response=body,
        choices=[choice],
        model=body.get("model"),
        response_id=body.get("id"),
        prompt_tokens=_prompt_tokens(usage),
        completion_tokens=int_or_none(usage.get("output_tokens")),
    )


def _apply_delta(block: Json, delta: Json, partial_json: dict[int, list[str]], index: int) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "input_json_delta":
        partial_json.setdefault(index, []).append(str(delta.get("partial_json", "")))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))


def assemble_stream(events: Sequence[SseEvent]) -> Assembled:
    message: Json = {"content": []}
    blocks: dict[int, Json] = {}
    partial_json: dict[int, list[str]] = {}
    notes: list[str] = []
    error: str | None = None
    stopped = False
    for event, data in json_events(events, notes):
        kind = data.get("type", event.event)
        stopped = stopped or kind == "message_stop"
        index = int_or_none(data.get("index")) or 0
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = {**data["message"], "content": []}
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            blocks[index] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            _apply_delta(block, data["delta"], partial_json, index)
        elif kind == "message_delta":
            delta = json_object(data.get("delta"))
            message.update({k: v for k, v in delta.items() if k in {"stop_reason", "stop_sequence"}})
            if isinstance(data.get("usage"), dict):
                message["usage"] = {**(message.get("usage") or {}), **data["usage"]}
        elif kind == "error":
            error = error_text(data)
    for index, pieces in partial_json.items():
        text = "".join(pieces)
        try:
            blocks[index]["input"] = loads_whole(text) if text else {}
        except ValueError:
            notes.append(f"tool input of block {index} is not complete JSON")
            blocks[index]["input"] = text
    message["content"] = [blocks[i] for i in sorted(blocks)]
    assembled = assemble(message)
    assembled.notes.extend(notes)
    assembled.error = error
    assembled.truncated = None if stopped else "no message_stop"
    return assembled
