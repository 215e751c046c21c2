"""OpenAI chat completions (``/v1/chat/completions``), plain and SSE, with vLLM/SGLang token-id fields.

vLLM puts ``prompt_token_ids`` at the top level and ``token_ids`` on each choice; streamed, the first
chunk of each choice carries the prompt ids and every later chunk the ids of its own delta. SGLang
names the per-choice field ``response_token_ids`` and puts ids in an ``sglext`` object, on a choice or
at the top level (streamed: in a final chunk, for the choice that chunk names).

A refusal (``message.refusal``, streamed ``delta.refusal``) is the choice's text, with finish reason
``refusal``: the model answered, it declined.
"""

from __future__ import annotations

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
    function_call,
    has_done_marker,
    int_or_none,
    json_events,
    json_object,
    text_or_empty,
    token_list,
    unfinished,
)
from clawr1.proxy.sse import SseEvent

NAME = "openai.chat"
PATH_SUFFIX = "/chat/completions"


def request_messages(body: Json) -> list[Json]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _logprob_values(logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    return float_list(
        [entry.get("logprob") if isinstance(entry, dict) else None for entry in logprobs["content"]]
    )


def _choice_token_ids(choice: Json) -> list[int]:
    return token_list(choice.get("token_ids")) or token_list(choice.get("response_token_ids")) \
        or ext_ids(choice)[1]


def _finish(finish_reason: Any, refusal: str) -> Any:
    return "refusal" if refusal else finish_reason


def _usage(assembled: Assembled, usage: Any) -> None:
    if isinstance(usage, dict):
        assembled.prompt_tokens = int_or_none(usage.get("prompt_tokens"))
        assembled.completion_tokens = int_or_none(usage.get("completion_tokens"))


def assemble(body: Json) -> Assembled:
    ext_prompt, ext_output = ext_ids(body)
    assembled = Assembled(
        response=body,
        model=body.get("model"),
        response_id=body.get("id"),
        prompt_token_ids=token_list(body.get("prompt_token_ids")) or ext_prompt,
    )
    _usage(assembled, body.get("usage"))
    for raw in body.get("choices") or []:
        if not isinstance(raw, dict):
            continue
        assembled.prompt_token_ids = assembled.prompt_token_ids or ext_ids(raw)[0]
        message = json_object(raw.get("message"))
        refusal = text_or_empty(message.get("refusal"))
        calls = [
            function_call(
                c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")
            )
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        assembled.choices.append(
            AssembledChoice(
                index=int_or_none(raw.get("index")) or 0,
                text=content_text(message.get("content")) or refusal,
                tool_calls=calls,
                finish_reason=_finish(raw.get("finish_reason"), refusal),
                token_ids=_choice_token_ids(raw),
                logprobs=_logprob_values(raw.get("logprobs")),
                reply_messages=[message],
            )
        )
    if ext_output and len(assembled.choices) == 1 and not assembled.choices[0].token_ids:
        assembled.choices[0].token_ids = ext_output
    return assembled


@dataclass
class _ToolCallParts:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


@dataclass
class _ChoiceParts:
    index: int
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprob_entries: list[Json] | None = None

    def add(self, raw: Json) -> None:
        delta = json_object(raw.get("delta"))
        self.role = delta.get("role") or self.role
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            parts = self.tool_calls.setdefault(int_or_none(call.get("index")) or 0, _ToolCallParts())
            parts.id = parts.id or call.get("id")
            function = json_object(call.get("function"))
            parts.name = parts.name or function.get("name")
            if isinstance(function.get("arguments"), str):
                parts.arguments.append(function["arguments"])
        if raw.get("finish_reason"):
            self.finish_reason = raw["finish_reason"]
        self.token_ids.extend(_choice_token_ids(raw))
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            self.logprob_entries = (self.logprob_entries or []) + logprobs["content"]

    def message(self) -> Json:
        message: Json = {"role": self.role, "content": "".join(self.content) if self.content else None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [
                function_call(p.id, p.name, "".join(p.arguments)) for _, p in sorted(self.tool_calls.items())
            ]
        return message


def assemble_stream(events: Sequence[SseEvent]) -> Assembled:
    choices: dict[int, _ChoiceParts] = {}
    top: Json = {}
    assembled = Assembled(response={})
    sglext_output: dict[int, list[int]] = {}
    for _event, chunk in json_events(events, assembled.notes):
        if "error" in chunk:
            assembled.error = error_text(chunk)
            continue
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None:
                top.setdefault(key, chunk[key])
        if chunk.get("usage"):
            top["usage"] = chunk["usage"]
        if not assembled.prompt_token_ids:
            assembled.prompt_token_ids = token_list(chunk.get("prompt_token_ids"))
        raws = [raw for raw in chunk.get("choices") or [] if isinstance(raw, dict)]
        ext_prompt, ext_output = ext_ids(chunk)
        assembled.prompt_token_ids = assembled.prompt_token_ids or ext_prompt
        if ext_output:  # a top-level sglext belongs to the one choice its chunk names
            sglext_output[(int_or_none(raws[0].get("index")) or 0) if len(raws) == 1 else 0] = ext_output
        for raw in raws:
            index = int_or_none(raw.get("index")) or 0
            choices.setdefault(index, _ChoiceParts(index)).add(raw)
    for index, ids in sglext_output.items():
        if index in choices and not choices[index].token_ids:
            choices[index].token_ids = ids
    response: Json = {
        "id": top.get("id"),
        "object": "chat.completion",
        "created": top.get("created"),
        "model": top.get("model"),
        "choices": [],
    }
    for index, parts in sorted(choices.items()):
        choice: Json = {"index": index, "message": parts.message(), "finish_reason": parts.finish_reason}
        if parts.logprob_entries is not None:
            choice["logprobs"] = {"content": parts.logprob_entries}
        response["choices"].append(choice)
        refusal = "".join(parts.refusal)
        assembled.choices.append(
            AssembledChoice(
                index=index,
                text="".join(parts.content) or refusal,
                tool_calls=choice["message"].get("tool_calls", []),
                finish_reason=_finish(parts.finish_reason, refusal),
                token_ids=parts.token_ids,
                logprobs=_logprob_values(choice.get("logprobs")),
                reply_messages=[choice["message"]],
            )
        )
    if "usage" in top:
        response["usage"] = top["usage"]
    assembled.response = response
    assembled.model = top.get("model")
    assembled.response_id = top.get("id")
    assembled.truncated = unfinished(assembled.choices, has_done_marker(events))
    _usage(assembled, top.get("usage"))
    return assembled
