"""OpenAI chat completions on the stand-in engine: body -> JSON answer or SSE chunks, with vLLM's
token ids, SGLang's ``sglext`` ids, logprobs, tool calls and refusals."""

from __future__ import annotations

from collections.abc import Sequence

from clawr1.demo.standin import toy


def _sglext(input_ids: list[int] | None, output_ids: list[int] | None) -> toy.Json:
    return {k: v for k, v in (("input_ids", input_ids), ("output_ids", output_ids)) if v is not None}


def _openai_finish(reply: toy.Reply) -> str:
    """OpenAI ends a refusal with ``stop``; the refusal itself is in ``refusal``."""
    return "stop" if reply.finish_reason == "refusal" else reply.finish_reason


def answer(body: toy.Json, model: str, sglext: tuple[bool, bool]) -> toy.Answer:
    """``sglext``: SGLang's ids asked for (input ids, output ids), honoured by ``sglang-*`` models."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if not messages:
        raise toy.BadRequest("messages must be a non-empty list")
    # A request's `seed` varies the reply as sampling would, so GRPO rollouts of one prompt differ.
    conversation = [model, messages, *([body["seed"]] if body.get("seed") is not None else [])]
    replies = [toy.make_reply(conversation, i, toy.tool_names_of(body.get("tools")),
                          not toy.ends_with_tool_result(messages),
                          body.get("max_completion_tokens") or body.get("max_tokens"))
               for i in range(int(body.get("n") or 1))]
    prompt_ids = toy.render_prompt(messages)
    sglang = model.startswith("sglang")
    want_ids = bool(body.get("return_token_ids")) and not sglang
    want_logprobs = bool(body.get("logprobs"))
    sglext_in, sglext_out = sglext if sglang else (False, False)
    response_id = f"chatcmpl-{toy.digest_of(conversation).hex()[:24]}"
    usage = {"prompt_tokens": len(prompt_ids),
             "total_tokens": len(prompt_ids) + sum(len(r.token_ids()) for r in replies),
             "completion_tokens": sum(len(r.token_ids()) for r in replies)}
    if body.get("stream"):
        head = {"id": response_id, "object": "chat.completion.chunk", "created": toy.CREATED, "model": model}
        streams = [_chunks(head, i, r, prompt_ids, want_ids, want_logprobs) for i, r in enumerate(replies)]
        events = list(toy.interleave(streams))
        if sglext_in or sglext_out:
            events += [toy.sse({**head, "choices": [{"index": i, "delta": {}, "finish_reason": None}],
                            "sglext": _sglext(prompt_ids if sglext_in else None,
                                              r.token_ids() if sglext_out else None)})
                       for i, r in enumerate(replies)]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(toy.sse({**head, "choices": [], "usage": usage}))
        events.append(toy.sse("[DONE]"))
        return iter(events)
    choices = []
    for i, reply in enumerate(replies):
        ids = reply.token_ids()
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in reply.tool_calls]
        refused = reply.finish_reason == "refusal"
        choice: toy.Json = {
            "index": i,
            "message": {"role": "assistant", "content": None if calls or refused else reply.text,
                        "refusal": reply.text if refused else None, "annotations": None, "audio": None,
                        "function_call": None, "tool_calls": calls, "reasoning_content": None},
            "logprobs": {"content": _logprobs(ids, 0)} if want_logprobs else None,
            "finish_reason": _openai_finish(reply),
            "stop_reason": None,
            "token_ids": ids if want_ids else None,
        }
        if sglext_out:
            choice["sglext"] = _sglext(None, ids)
        choices.append(choice)
    plain: toy.Json = {
        "id": response_id, "object": "chat.completion", "created": toy.CREATED, "model": model,
        "choices": choices, "service_tier": None, "system_fingerprint": None,
        "usage": {**usage, "prompt_tokens_details": None}, "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if want_ids else None, "kv_transfer_params": None,
    }
    if sglext_in:
        plain["sglext"] = _sglext(prompt_ids, None)
    return toy.dump(plain)


def _logprobs(ids: Sequence[int], start: int) -> list[toy.Json]:
    return [{"token": f"token_id:{t}", "logprob": toy.toy_logprob(t, start + k),
             "bytes": [t] if t < 256 else [], "top_logprobs": []} for k, t in enumerate(ids)]


def _chunks(head: toy.Json, index: int, reply: toy.Reply, prompt_ids: list[int], want_ids: bool,
            want_logprobs: bool) -> list[bytes]:
    position = 0

    def chunk(delta: toy.Json, ids: list[int], finish: str | None = None) -> bytes:
        nonlocal position
        choice: toy.Json = {"index": index, "delta": delta,
                        "logprobs": {"content": _logprobs(ids, position)} if want_logprobs and ids else None,
                        "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        if want_ids:
            choice["token_ids"] = ids
        position += len(ids)
        return toy.sse({**head, "choices": [choice]})

    first: toy.Json = {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]}
    if want_ids:
        first["prompt_token_ids"] = prompt_ids
    events = [toy.sse(first)]
    text_key = "refusal" if reply.finish_reason == "refusal" else "content"
    events += [chunk({text_key: piece}, toy.encode(piece)) for piece in reply.pieces]
    for k, call in enumerate(reply.tool_calls):
        half = len(call.arguments) // 2
        events.append(chunk({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": ""}}]},
                            toy.encode(call.opening())))
        for part in (call.arguments[:half], call.arguments[half:]):
            events.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": part}}]},
                                toy.encode(part)))
        events.append(chunk({}, toy.encode(toy.TOOL_CLOSE)))
    events.append(chunk({}, [] if reply.finish_reason == "length" else [toy.EOS], _openai_finish(reply)))
    return events
