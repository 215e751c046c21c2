"""The OpenAI Responses API on the stand-in engine: body -> JSON response or its SSE events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clawr1.demo.standin import toy


def _messages(body: toy.Json) -> list[toy.Json]:
    messages: list[toy.Json] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or []:
        if item.get("type") == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output"), "type": "function_call_output"})
        elif item.get("type") == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": item.get("name"), "arguments": item.get("arguments")}}]})
        else:
            messages.append({"role": item.get("role", "user"), "content": item.get("content")})
    return messages


def answer(body: toy.Json, model: str) -> toy.Answer:
    messages = _messages(body)
    if not messages:
        raise toy.BadRequest("input must not be empty")
    conversation = [model, messages]
    if body.get("previous_response_id"):  # a continuation answers (and is named) apart from a new input
        conversation.append(body["previous_response_id"])
    reply = toy.make_reply(conversation, 0, toy.tool_names_of(body.get("tools")),
                       not toy.ends_with_tool_result(messages), body.get("max_output_tokens"))
    tag = toy.digest_of(conversation).hex()[:24]
    items: list[toy.Json] = [{"id": f"fc_{tag}", "type": "function_call", "status": "completed",
                          "call_id": c.id, "name": c.name, "arguments": c.arguments}
                         for c in reply.tool_calls]
    if not reply.tool_calls:
        items = [{"id": f"msg_{tag}", "type": "message", "status": "completed", "role": "assistant",
                  "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}]
    prompt_len = len(toy.render_prompt(messages))
    truncated = reply.finish_reason == "length"
    final = {"id": f"resp_{tag}", "object": "response", "created_at": toy.CREATED,
             "status": "incomplete" if truncated else "completed",
             "error": None,
             "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
             "instructions": body.get("instructions"), "model": model, "output": items,
             "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools") or [],
             "text": {"format": {"type": "text"}}, "temperature": 1.0, "top_p": 1.0, "metadata": {},
             "usage": {"input_tokens": prompt_len, "input_tokens_details": {"cached_tokens": 0},
                       "output_tokens": len(reply.token_ids()),
                       "output_tokens_details": {"reasoning_tokens": 0},
                       "total_tokens": prompt_len + len(reply.token_ids())}}
    if not body.get("stream"):
        return toy.dump(final)
    return _events(final, reply)


def _events(final: toy.Json, reply: toy.Reply) -> Iterator[bytes]:
    sequence = 0

    def event(kind: str, **data: Any) -> bytes:
        nonlocal sequence
        sequence += 1
        return toy.sse({"type": kind, "sequence_number": sequence - 1, **data}, kind)

    started = {**final, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(final["output"]):
        if item["type"] == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            half = len(item["arguments"]) // 2
            for part in (item["arguments"][:half], item["arguments"][half:]):
                yield event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=part)
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        arguments=item["arguments"])
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", item_id=item["id"], output_index=index,
                        content_index=0, part=part)
            for piece in reply.pieces:
                yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                            content_index=0, delta=piece, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=reply.text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part={**part, "text": reply.text})
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed" if final["status"] == "completed" else "response.incomplete",
                response=final)
