"""Anthropic messages on the stand-in engine: body -> JSON message or its SSE events."""

from __future__ import annotations

import json
from collections.abc import Iterator

from clawr1.demo.standin import toy


def _messages(body: toy.Json) -> list[toy.Json]:
    system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    return system + list(body.get("messages") or [])


def answer(body: toy.Json, model: str) -> toy.Answer:
    messages = _messages(body)
    if not body.get("messages"):
        raise toy.BadRequest("messages: field required")
    if not isinstance(body.get("max_tokens"), int):
        raise toy.BadRequest("max_tokens: field required")
    conversation = [model, messages]
    reply = toy.make_reply(conversation, 0, toy.tool_names_of(body.get("tools")),
                       not toy.ends_with_tool_result(messages), body["max_tokens"])
    tag = toy.digest_of(conversation).hex()[:24]
    content: list[toy.Json] = [{"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name,
                            "input": json.loads(c.arguments)} for c in reply.tool_calls]
    if not reply.tool_calls:
        content = [{"type": "text", "text": reply.text}]
    stop = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
            "refusal": "refusal"}[reply.finish_reason]
    usage = {"input_tokens": len(toy.render_prompt(messages)), "output_tokens": len(reply.token_ids())}
    final = {"id": f"msg_{tag}", "type": "message", "role": "assistant", "model": model,
             "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}
    if not body.get("stream"):
        return toy.dump(final)
    return _events(final, reply)


def _events(final: toy.Json, reply: toy.Reply) -> Iterator[bytes]:
    usage = final["usage"]
    start = {**final, "content": [], "stop_reason": None,
             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}}
    yield toy.sse({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(final["content"]):
        if block["type"] == "tool_use":
            yield toy.sse({"type": "content_block_start", "index": index,
                       "content_block": {**block, "input": {}}}, "content_block_start")
            arguments = toy.dump(block["input"])
            half = len(arguments) // 2
            for part in (arguments[:half], arguments[half:]):
                delta = {"type": "input_json_delta", "partial_json": part}
                yield toy.sse({"type": "content_block_delta", "index": index, "delta": delta},
                          "content_block_delta")
        else:
            yield toy.sse({"type": "content_block_start", "index": index,
                       "content_block": {"type": "text", "text": ""}}, "content_block_start")
            yield toy.sse({"type": "ping"}, "ping")
            for piece in reply.pieces:
                yield toy.sse({"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
        yield toy.sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    stop = {"stop_reason": final["stop_reason"], "stop_sequence": None}
    output = {"output_tokens": usage["output_tokens"]}
    yield toy.sse({"type": "message_delta", "delta": stop, "usage": output}, "message_delta")
    yield toy.sse({"type": "message_stop"}, "message_stop")
