"""OpenAI (legacy) completions on the stand-in engine: body -> JSON answer or SSE chunks, with vLLM's
token ids and logprobs; prompts as text, token ids, or a batch of either."""

from __future__ import annotations

from collections.abc import Sequence

from clawr1.demo.standin import toy


def answer(body: toy.Json, model: str) -> toy.Answer:
    prompts = toy.completion_prompts(body.get("prompt"))
    if prompts is None:
        raise toy.BadRequest("prompt must be a string, token ids, or a list of either")
    n = int(body.get("n") or 1)
    want_ids = bool(body.get("return_token_ids"))
    logprobs = body.get("logprobs")
    response_id = f"cmpl-{toy.digest_of(model, [p for p, _ in prompts]).hex()[:24]}"
    choices = []
    for p_index, (prompt, prompt_ids) in enumerate(prompts):
        for k in range(n):
            reply = toy.make_reply([model, prompt], k, (), False, body.get("max_tokens"))
            choices.append((p_index * n + k, prompt_ids, reply))
    prompt_tokens = sum(len(c[1]) for c in choices[::n])
    completion_tokens = sum(len(c[2].token_ids()) for c in choices)
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
             "completion_tokens": completion_tokens}
    if body.get("stream"):
        head = {"id": response_id, "object": "text_completion", "created": toy.CREATED, "model": model}
        streams = [_chunks(head, i, ids, r, want_ids, logprobs is not None) for i, ids, r in choices]
        events = list(toy.interleave(streams))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(toy.sse({**head, "choices": [], "usage": usage}))
        events.append(toy.sse("[DONE]"))
        return iter(events)
    out = []
    for index, prompt_ids, reply in choices:
        ids = reply.token_ids()
        out.append({"index": index, "text": reply.text,
                    "logprobs": _logprobs(ids, 0) if logprobs is not None else None,
                    "finish_reason": reply.finish_reason, "stop_reason": None, "prompt_logprobs": None,
                    "prompt_token_ids": prompt_ids if want_ids else None,
                    "token_ids": ids if want_ids else None})
    return toy.dump({
        "id": response_id, "object": "text_completion", "created": toy.CREATED, "model": model,
        "choices": out, "service_tier": None, "system_fingerprint": None, "usage": usage,
        "kv_transfer_params": None,
    })


def _logprobs(ids: Sequence[int], start: int) -> toy.Json:
    return {"text_offset": list(range(start, start + len(ids))),
            "token_logprobs": [toy.toy_logprob(t, start + k) for k, t in enumerate(ids)],
            "tokens": [f"token_id:{t}" for t in ids],
            "top_logprobs": [{} for _ in ids]}


def _chunks(head: toy.Json, index: int, prompt_ids: list[int], reply: toy.Reply, want_ids: bool,
            want_logprobs: bool) -> list[bytes]:
    events = []
    position = 0
    pieces: list[tuple[str, list[int], str | None]] = [
        (piece, toy.encode(piece), None) for piece in reply.pieces]
    pieces.append(("", [] if reply.finish_reason == "length" else [toy.EOS], reply.finish_reason))
    for n, (text, ids, finish) in enumerate(pieces):
        choice: toy.Json = {"index": index, "text": text,
                        "logprobs": _logprobs(ids, position) if want_logprobs else None,
                        "finish_reason": finish}
        if want_ids:
            if n == 0:
                choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        position += len(ids)
        events.append(toy.sse({**head, "choices": [choice]}))
    return events
