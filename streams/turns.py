"""A *turn* is one prompt and the model's replies to it, whichever source captured it.

Black-box LLM calls (proxy) and service ``turn`` events (gateway) carry the same facts in
different shapes; both are validated into a ``Turn`` here, so linking and normalization see one
type. Anything that cannot become a turn raises ``InvalidEvent`` with a reason for the dead-letter
topic.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from clawr1.core.conversation import prefix_digests

TokenIds = list[int] | np.ndarray
"""Token ids as they came: a list (a lone record, stored state, a service's JSON) or an int32 array (an
envelope's packed ids, ``AvroCodec.decode_records(int_arrays=True)``). Code that handles them takes
either: ``len``, iteration, indexing and orjson with ``OPT_SERIALIZE_NUMPY`` (which writes both as
the same JSON), never truth value, ``==`` or ``+``."""

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "max_output_tokens",
    "n", "stop", "stop_sequences", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "logit_bias", "reasoning_effort", "reasoning", "thinking", "response_format",
    "tool_choice", "parallel_tool_calls",
)


# X-Claw-Metadata (the compat port's registration metadata, compact JSON): merged into each step's
# metadata up to this size; a larger or malformed one is dropped with a capture note.
METADATA_HEADER = "x-claw-metadata"
MAX_METADATA_HEADER_BYTES = 8192


class InvalidEvent(ValueError):
    """The event decoded but cannot be normalized; the message is the dead letter's reason."""


@dataclass(frozen=True)
class Reply:
    """One sampled answer (a choice). ``messages`` is the reply as the agent will echo it back."""

    index: int
    text: str
    tool_calls: list[Any]
    messages: list[dict[str, Any]]
    finish_reason: str | None = None
    token_ids: TokenIds = field(default_factory=list)
    logprobs: list[float] | None = None


@dataclass(frozen=True)
class Turn:
    event_id: str
    source_kind: str  # blackbox_agent | whitebox_agent | blackbox_service | otel
    source_name: str
    api: str
    messages: list[dict[str, Any]]
    replies: list[Reply]
    created_at_ms: int
    updated_at_ms: int
    trajectory_id: str | None = None  # explicit (X-Claw-Trajectory-Id, service event)
    step_id: str | None = None  # explicit (service event)
    step_index: int | None = None  # explicit (service event)
    prompt_group_id: str | None = None
    prompt_group_size: int | None = None
    prompt_token_ids: TokenIds = field(default_factory=list)
    engine_tokens: bool = False
    raw_prompt: str | None = None  # completions API: the prompt is text, not chat messages
    engine_response_id: str | None = None
    model: str | None = None
    agent: str | None = None
    policy_version: int | None = None
    terminal: bool = False
    latency_ms: int | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reward: float | None = None
    reward_final: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)
    channel: str = "train"  # train | val
    connection: str = ""  # the proxy's id of the agent's client connection (a linking hint), "" unknown
    engine: str | None = None  # the engine the reverse port sent the call to

    @property
    def failed(self) -> bool:
        return self.error is not None

    @cached_property
    def message_digests(self) -> list[str]:
        """``prefix_digests`` of the messages, once per turn: linking and normalizing ask for them
        several times a call, and each pass hashes the whole history."""
        return prefix_digests(self.messages)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"{what} is not JSON: {exc}") from exc


def _messages(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise InvalidEvent(f"{what} must be a list of message objects")
    return value


def _token_ids(value: Any, what: str) -> TokenIds:
    if value is None:
        return []
    if isinstance(value, np.ndarray):  # an envelope's packed ids: int32 by the codec, only the sign to check
        if value.size and value.min() < 0:
            raise InvalidEvent(f"{what} must be a list of non-negative integers")
        return value
    # Type and sign checked in C (``map``/``set``/``min``): a 640-token step made this a hot loop.
    if not isinstance(value, list) or value and (not set(map(type, value)) <= {int} or min(value) < 0):
        raise InvalidEvent(f"{what} must be a list of non-negative integers")
    return value


def _finite(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidEvent(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _optional(payload: dict[str, Any], key: str, kind: type) -> Any:
    value = payload.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
        raise InvalidEvent(f"payload {key} has the wrong type: {type(value).__name__}")
    return value


def assistant_message(text: str, tool_calls: list[Any]) -> dict[str, Any]:
    """A reply in OpenAI chat shape, for sources that give text and tool calls but no message."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _reply(choice: dict[str, Any]) -> Reply:
    tool_calls = _json(choice["tool_calls_json"], "tool_calls_json") or []
    if not isinstance(tool_calls, list):
        raise InvalidEvent("tool_calls_json must be a JSON list")
    messages = _messages(_json(choice["reply_messages_json"], "reply_messages_json"), "reply_messages_json")
    if not messages:  # written before the proxy recorded replies: rebuild the OpenAI shape
        messages = [assistant_message(choice["text"], tool_calls)]
    return Reply(
        index=choice["index"],
        text=choice["text"],
        tool_calls=tool_calls,
        messages=messages,
        finish_reason=choice["finish_reason"],
        token_ids=_token_ids(choice["token_ids"], "choice token_ids"),
        logprobs=choice["logprobs"],
    )


def header_metadata(headers: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The agent's ``X-Claw-Metadata`` object and the capture notes it needs (it is dropped when it
    is larger than ``MAX_METADATA_HEADER_BYTES`` or not a JSON object: never a dead call)."""
    text = headers.get(METADATA_HEADER)
    if text is None:
        return {}, []
    size = len(text.encode())
    if size > MAX_METADATA_HEADER_BYTES:
        return {}, [f"X-Claw-Metadata dropped: {size} bytes, over the {MAX_METADATA_HEADER_BYTES}-byte bound"]
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return {}, ["X-Claw-Metadata dropped: not a JSON object"]
    return value, []


def _capture_metadata(record: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A captured call's step metadata: the agent's X-Claw-Metadata, then the capture's own facts
    (which win a name both use; the note names the keys that lost)."""
    agent, notes = header_metadata(record["request_headers"])
    captured = {
        "api": record["api"],
        "event_id": record["event_id"],
        "url": record["url"],
        "upstream": record["upstream"],
        "streamed": record["streamed"],
        "response_status": record["response_status"],
        "first_byte_ms": record["first_byte_ms"],
        "finished_ms": record["finished_ms"],
        "tools": body.get("tools"),
    }
    shadowed = sorted(set(agent) & (set(captured) | {"capture_notes"}))
    if shadowed:
        notes.append(f"X-Claw-Metadata keys {shadowed} kept the capture's values")
    return {**agent, **captured, "capture_notes": [*record["capture_notes"], *notes]}


def turn_from_llm_call(record: dict[str, Any]) -> Turn:
    """A proxy-captured call (raw_llm_call.avsc) as a turn; one reply per choice.

    The proxy already put the conversation (``messages_json``) and each reply as the agent will
    echo it (``reply_messages_json``) in one chat shape per API; linking compares exactly those.
    """
    api = record["api"]
    messages = _messages(_json(record["messages_json"], "messages_json"), "messages_json")
    try:
        body = json.loads(record["request_body"])
    except ValueError:
        body = None  # the proxy noted it in capture_notes; the call is still a (prompt-less) step
    body = body if isinstance(body, dict) else {}
    status = record["response_status"]
    error = record["error"]
    if error is None and (status is None or status >= 400):
        error = f"upstream status {status}" if status is not None else "no response"
    replies = [_reply(choice) for choice in sorted(record["choices"], key=lambda c: c["index"])]
    if error is None and not replies:
        error = "response has no choices"
    finished = record["finished_ms"]
    started = record["request_started_ms"]
    completions = api == "openai.completions" and len(messages) == 1
    return Turn(
        event_id=record["event_id"],
        source_kind="blackbox_agent",
        source_name=record.get("source_name") or record["proxy_instance"],
        api=api,
        messages=messages,
        replies=replies,
        created_at_ms=started,
        updated_at_ms=finished if finished is not None else record["captured_at_ms"],
        trajectory_id=record["trajectory_id"] or None,
        prompt_group_id=record["prompt_group_id"] or None,
        prompt_group_size=record["prompt_group_size"],
        prompt_token_ids=_token_ids(record["prompt_token_ids"], "prompt_token_ids"),
        engine_tokens=record["token_source"] == "engine",
        raw_prompt=str(messages[0].get("content", "")) if completions else None,
        engine_response_id=record["response_id"],
        model=record["model"],
        agent=record["agent"],
        policy_version=record["policy_version"],
        terminal=record["terminal"],
        latency_ms=finished - started if finished is not None else None,
        usage_prompt_tokens=record["prompt_tokens"],
        usage_completion_tokens=record["completion_tokens"],
        sampling_params={k: body[k] for k in SAMPLING_KEYS if k in body},
        error=error,
        metadata=_capture_metadata(record, body),
        channel=record["channel"],
        connection=record["client_connection"],
        engine=record.get("engine"),
    )


def turn_from_service_event(record: dict[str, Any]) -> Turn | None:
    """A service ``turn`` event (service_event.avsc) as a turn; other event kinds are not steps.

    The payload is the gateway's ``TurnPayload`` (docs/gateway.md), plus optional engine token ids
    ``prompt_token_ids`` / ``response_token_ids`` / ``logprobs`` from services that have them. The
    gateway's OTLP route writes the same event for a GenAI span (``source_kind`` ``otel``, an ``error``
    for a failed call, and possibly no messages: the span carried none).
    """
    if record["kind"] != "turn":
        return None
    payload = _json(record["payload_json"], "payload_json")
    if not isinstance(payload, dict):
        raise InvalidEvent("payload_json must be a JSON object")
    messages = _messages(payload.get("prompt_messages"), "payload prompt_messages")
    text = _optional(payload, "response_text", str) or ""
    tool_calls = _optional(payload, "tool_calls", list) or []
    step_index = record["step_index"]
    if step_index is not None and step_index < 0:
        raise InvalidEvent(f"step_index must be >= 0, got {step_index}")
    response_ids = _token_ids(payload.get("response_token_ids"), "payload response_token_ids")
    logprobs = _optional(payload, "logprobs", list)
    if logprobs is not None and not all(isinstance(x, int | float) and not isinstance(x, bool)
                                        for x in logprobs):
        raise InvalidEvent("payload logprobs must be a list of numbers")
    usage = _optional(payload, "usage", dict) or {}
    source_kind = record.get("source_kind") or "blackbox_service"
    api = "otel.genai" if source_kind == "otel" else "service.turn"
    return Turn(
        event_id=record["event_id"],
        source_kind=source_kind,
        source_name=record["source_name"],
        api=api,
        messages=messages,
        replies=[Reply(0, text, tool_calls, [assistant_message(text, tool_calls)], token_ids=response_ids,
                       logprobs=logprobs)],
        created_at_ms=record["timestamp_ms"],
        updated_at_ms=record["received_at_ms"],
        trajectory_id=record["trajectory_id"],
        step_id=record["step_id"] or None,
        step_index=step_index,
        prompt_group_id=_optional(payload, "prompt_group_id", str),
        prompt_group_size=_optional(payload, "prompt_group_size", int),
        prompt_token_ids=_token_ids(payload.get("prompt_token_ids"), "payload prompt_token_ids"),
        engine_tokens=len(response_ids) > 0,
        engine_response_id=_optional(payload, "response_id", str),
        model=_optional(payload, "model", str),
        agent=_optional(payload, "agent", str),
        policy_version=_optional(payload, "policy_version", int),
        terminal=bool(_optional(payload, "terminal", bool)),
        latency_ms=_optional(payload, "latency_ms", int),
        usage_prompt_tokens=_optional(usage, "prompt_tokens", int),
        usage_completion_tokens=_optional(usage, "completion_tokens", int),
        sampling_params=_optional(payload, "sampling_params", dict) or {},
        error=_optional(payload, "error", str),
        reward=_finite(payload.get("reward"), "payload reward"),
        reward_final=_optional(payload, "reward_final", bool) is not False,
        metadata={"api": api, "event_id": record["event_id"], **(_optional(payload, "metadata", dict) or {})},
        channel=_optional(payload, "channel", str) or "train",
    )


def turn_from_whitebox(record: dict[str, Any]) -> Turn:
    """A white-box step (whitebox_step.avsc) as a turn; its ids are the engine's, as the agent holds them."""
    if not record["step_id"] or not record["trajectory_id"]:
        raise InvalidEvent("step_id and trajectory_id must not be empty")
    if record["step_index"] < 0:
        raise InvalidEvent(f"step_index must be >= 0, got {record['step_index']}")
    messages = _messages(_json(record["prompt_messages"], "prompt_messages"), "prompt_messages") \
        if record["prompt_messages"] else []
    metadata = _json(record["metadata_json"], "metadata_json")
    if not isinstance(metadata, dict):
        raise InvalidEvent("metadata_json must be a JSON object")
    text = record["response_text"] or ""
    return Turn(
        event_id=record["step_id"],
        source_kind="whitebox_agent",
        source_name=record["source_name"],
        api="whitebox",
        messages=messages,
        replies=[Reply(0, text, [], [assistant_message(text, [])],
                       token_ids=_token_ids(record["response_token_ids"], "response_token_ids"),
                       logprobs=record["response_logprobs"])],
        created_at_ms=record["received_at_ms"],
        updated_at_ms=record["received_at_ms"],
        trajectory_id=record["trajectory_id"],
        step_id=record["step_id"],
        step_index=record["step_index"],
        prompt_group_id=record["prompt_group_id"],
        prompt_group_size=record["prompt_group_size"],
        prompt_token_ids=_token_ids(record["prompt_token_ids"], "prompt_token_ids"),
        engine_tokens=True,
        model=record["model"],
        agent=record["agent"],
        policy_version=record["policy_version"],
        terminal=record["terminal"],
        reward=_finite(record["reward"], "reward"),
        reward_final=record["reward_final"],
        metadata=metadata,
        channel=record["channel"],
    )
