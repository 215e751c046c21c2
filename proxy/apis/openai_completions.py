"""OpenAI (legacy) completions (``/v1/completions``), plain and SSE.

vLLM puts both ``prompt_token_ids`` and ``token_ids`` on each choice; logprobs come as parallel
lists (``tokens``, ``token_logprobs``) aligned with the generated ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clawr1.proxy.apis.base import (
    Assembled,
    AssembledChoice,
    Json,
    error_text,
    ext_ids,
    float_list,
    has_done_marker,
    int_or_none,
    json_events,
    text_or_empty,
    token_list,
    unfinished,
)
from clawr1.proxy.sse import SseEvent

NAME = "openai.completions"
PATH_SUFFIX = "/completions"


def request_messages(body: Json) -> list[Json]:
    """A prompt is a one-message conversation; a batch or token-id prompt is kept as its JSON text."""
    prompt = body.get("prompt")
    if prompt is None:
        return []
    content = prompt if isinstance(prompt, str) else json.dumps(prompt, separators=(",", ":"))
    return [{"role": "user", "content": content}]


def _token_logprobs(logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        return None
    return float_list(logprobs["token_logprobs"])


def _usage(assembled: Assembled, usage: Any) -> None:
    if isinstance(usage, dict):
        assembled.prompt_tokens = int_or_none(usage.get("prompt_tokens"))
        assembled.completion_tokens = int_or_none(usage.get("completion_tokens"))


def _choice(
    index: int, text: str, finish_reason: Any, token_ids: list[int], logprobs: list[float] | None
) -> AssembledChoice:
    return AssembledChoice(
        index=index,
        text=text,
        finish_reason=finish_reason,
        token_ids=token_ids,
        logprobs=logprobs,
        reply_messages=[{"role": "assistant", "content": text}],
    )


def assemble(body: Json) -> Assembled:
    assembled = Assembled(
        response=body,
        model=body.get("model"),
        response_id=body.get("id"),
        prompt_token_ids=token_list(body.get("prompt_token_ids")),
    )
    _usage(assembled, body.get("usage"))
    for raw in body.get("choices") or []:
        if not isinstance(raw, dict):
            continue
        assembled.prompt_token_ids = assembled.prompt_token_ids or token_list(raw.get("prompt_token_ids"))
        text = text_or_empty(raw.get("text"))
        assembled.choices.append(
            _choice(
                int_or_none(raw.get("index")) or 0,
                text,
                raw.get("finish_reason"),
                token_list(raw.get("token_ids")) or ext_ids(raw)[1],
                _token_logprobs(raw.get("logprobs")),
            )
        )
    return assembled


@dataclass
class _ChoiceParts:
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: dict[str, list[Any]] | None = None

    def add(self, raw: Json) -> None:
        if isinstance(raw.get("text"), str):
            self.text.append(raw["text"])
        if raw.get("finish_reason"):
            self.finish_reason = raw["finish_reason"]
        self.token_ids.extend(token_list(raw.get("token_ids")) or ext_ids(raw)[1])
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict):
            merged = self.logprobs if self.logprobs is not None else {}
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                if isinstance(logprobs.get(key), list):
                    merged.setdefault(key, []).extend(logprobs[key])
            self.logprobs = merged


def assemble_stream(events: Sequence[SseEvent]) -> Assembled:
    choices: dict[int, _ChoiceParts] = {}
    top: Json = {}
    assembled = Assembled(response={})
    for _event, chunk in json_events(events, assembled.notes):
        if "error" in chunk:
            assembled.error = error_text(chunk)
            continue
        for key in ("id", "created", "model"):
            if chunk.get(key) is not None:
                top.setdefault(key, chunk[key])
        if chunk.get("usage"):
            top["usage"] = chunk["usage"]
        assembled.prompt_token_ids = assembled.prompt_token_ids or token_list(chunk.get("prompt_token_ids"))
        for raw in chunk.get("choices") or []:
            if isinstance(raw, dict):
                if not assembled.prompt_token_ids:
                    assembled.prompt_token_ids = token_list(raw.get("prompt_token_ids"))
                choices.setdefault(int_or_none(raw.get("index")) or 0, _ChoiceParts()).add(raw)
    response: Json = {
        "id": top.get("id"),
        "object": "text_completion",
        "created": top.get("created"),
        "model": top.get("model"),
        "choices": [],
    }
    for index, parts in sorted(choices.items()):
        text = "".join(parts.text)
        response["choices"].append(
            {"index": index, "text": text, "logprobs": parts.logprobs, "finish_reason": parts.finish_reason}
        )
        assembled.choices.append(
            _choice(index, text, parts.finish_reason, parts.token_ids, _token_logprobs(parts.logprobs))
        )
    if "usage" in top:
        response["usage"] = top["usage"]
    assembled.response = response
    assembled.model = top.get("model")
    assembled.response_id = top.get("id")
    assembled.truncated = unfinished(assembled.choices, has_done_marker(events))
    _usage(assembled, top.get("usage"))
    return assembled
