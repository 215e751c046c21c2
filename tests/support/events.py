"""Builders of raw events as the proxy and the gateway write them, for the tests and the benchmarks.

Each builder returns the record the way a consumer decodes it (every schema default filled in),
by a round trip through the project's Avro codec, so tests feed the logic exactly what Kafka
would deliver.
"""

from __future__ import annotations

import json
from typing import Any

from clawr1.core.conversation import conversation_key
from clawr1.core.routing import routable_id
from clawr1.schemas.codec import codec_for

CODEC = codec_for()


def decoded(schema: str, record: dict[str, Any]) -> dict[str, Any]:
    return CODEC.decode(CODEC.encode(schema, record), expect=schema)[1]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def llm_call(
    event_id: str,
    messages: list[dict[str, Any]],
    replies: list[str],
    *,
    at: int = 1_000,
    trajectory_id: str | None = None,
    prompt_ids: list[int] | None = None,
    reply_ids: list[list[int]] | None = None,
    status: int | None = 200,
    error: str | None = None,
    group: tuple[str, int] | None = None,
    terminal: bool = False,
    response_id: str | None = None,
    policy_version: int | None = None,
    usage: tuple[int, int] | None = None,
    reply_messages: list[list[dict[str, Any]]] | None = None,
    connection: str = "",
    channel: str = "train",
    model: str = "m1",
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A captured OpenAI chat call; ``reply_ids`` given means the engine returned token ids;
    ``reply_messages`` replaces each choice's echoed reply (tool calls, thinking blocks)."""
    engine = prompt_ids is not None
    choices = (
        []
        if status is None or status >= 400
        else [
            {
                "index": i,
                "text": text,
                "token_ids": (reply_ids or [])[i] if engine else [],
                "finish_reason": "stop",
                "reply_messages_json": json.dumps(reply_messages[i] if reply_messages else [assistant(text)]),
            }
            for i, text in enumerate(replies)
        ]
    )
    body = {"model": model, "messages": messages, "temperature": 0.7, "n": len(replies),
            **({"tools": tools} if tools else {})}
    record = {
        "event_id": event_id,
        "captured_at_ms": at + 50,
        "proxy_instance": "proxy-a",
        "api": "openai.chat",
        "method": "POST",
        "url": "http://engine/v1/chat/completions",
        "upstream": "http://engine",
        "request_headers": {"content-type": "application/json"},
        "request_body": json.dumps(body),
        "streamed": False,
        "response_status": status,
        "error": error,
        "request_started_ms": at,
        "first_byte_ms": at + 10,
        "finished_ms": at + 40,
        "model": model,
        "prompt_tokens": usage[0] if usage else None,
        "completion_tokens": usage[1] if usage else None,
        "prompt_token_ids": prompt_ids or [],
        "choices": choices,
        "token_source": "engine" if engine else "none",
        "trajectory_id": trajectory_id,
        "prompt_group_id": group[0] if group else None,
        "prompt_group_size": group[1] if group else None,
        "policy_version": policy_version,
        "agent": "agent-x",
        "terminal": terminal,
        "conversation_key": conversation_key(messages),
        "messages_json": json.dumps(messages),
        "response_id": response_id,
        "client_connection": connection,
        "channel": channel,
    }
    return decoded("raw_llm_call", record)


def llm_key(record: dict[str, Any]) -> str:
    """The proxy's Kafka key: the trajectory hint, else the conversation root."""
    return record["trajectory_id"] or record["conversation_key"]


def whitebox_step(
    step_id: str,
    trajectory_id: str,
    index: int,
    *,
    prompt_ids: list[int] | None = None,
    response_ids: list[int] | None = None,
    messages: list[dict[str, Any]] | None = None,
    text: str | None = None,
    reward: float | None = None,
    final: bool = True,
    at: int = 5_000,
    terminal: bool = False,
    group: tuple[str, int] | None = None,
) -> dict[str, Any]:
    return decoded(
        "whitebox_step",
        {
            "step_id": step_id,
            "trajectory_id": trajectory_id,
            "step_index": index,
            "prompt_group_id": group[0] if group else None,
            "prompt_group_size": group[1] if group else None,
            "prompt_token_ids": prompt_ids or [],
            "response_token_ids": response_ids or [],
            "prompt_messages": None if messages is None else json.dumps(messages),
            "response_text": text,
            "reward": reward,
            "reward_final": final,
            "terminal": terminal,
            "policy_version": 3,
            "model": "m-wb",
            "agent": "wb-agent",
            "source_name": "team-wb",
            "received_at_ms": at,
        },
    )


def service_event(
    event_id: str,
    trajectory_id: str,
    payload: dict[str, Any],
    *,
    kind: str = "turn",
    step_index: int | None = None,
    step_id: str | None = None,
    at: int = 8_000,
) -> dict[str, Any]:
    return decoded(
        "service_event",
        {
            "event_id": event_id,
            "kind": kind,
            "trajectory_id": trajectory_id,
            "step_id": step_id,
            "step_index": step_index,
            "timestamp_ms": at,
            "payload_json": json.dumps(payload),
            "source_name": "svc-a",
            "received_at_ms": at + 5,
        },
    )


def feedback(
    feedback_id: str,
    target_kind: str,
    target_id: str,
    *,
    reward: float | None = None,
    final: bool = True,
    source: str = "reward_model",
    source_name: str = "rm-a",
    at: int = 9_000,
    components: dict[str, float] | None = None,
    label: str | None = None,
    comment: str | None = None,
    correction: str | None = None,
    terminal: bool = False,
    privileged: bool = True,
) -> dict[str, Any]:
    """Feedback as the gateway writes it; by default from a reward model's key (kind reward), which
    counts on any source's trajectory (``privileged``)."""
    return decoded(
        "feedback",
        {
            "feedback_id": feedback_id,
            "target_kind": target_kind,
            "target_id": target_id,
            "reward": reward,
            "components": components or {},
            "final": final,
            "source": source,
            "source_name": source_name,
            "label": label,
            "comment": comment,
            "correction": correction,
            "received_at_ms": at,
            "terminal": terminal,
            "privileged": privileged,
        },
    )


def build_tokenizer(path: str) -> str:
    """A small word-level ``tokenizer.json`` made with the ``tokenizers`` library (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [
        "[UNK]",
        "user",
        "assistant",
        "system",
        "hi",
        "hello",
        "there",
        "q",
        "a",
        "b",
        "more",
        "answer",
        "<",
        ">",
        "|",
        "_",
        "im",
        "start",
        "end",
        "tool",
        "call",
        "/",
    ]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.save(path)
    return path


def growing_conversation(trajectory_id: str, turns: int, first_prompt: int, reply: int,
                         added: int) -> list[dict[str, Any]]:
    """White-box steps of one conversation without rewards: each turn's prompt is the one before, its reply
    (``reply`` token ids) and ``added`` new ones, as an agent's context grows."""
    prompt: list[int] = list(range(first_prompt))
    steps = []
    for n in range(turns):
        response = [50_000 + n] * reply
        step_id = routable_id(trajectory_id, f"{trajectory_id}/{n}".encode())
        steps.append(whitebox_step(step_id, trajectory_id, n, prompt_ids=list(prompt), response_ids=response,
                                   reward=None))
        prompt += response + [60_000 + n] * added
    return steps
