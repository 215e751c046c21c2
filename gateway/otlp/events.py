"""A model call (span plus its content) as the black-box service ``turn`` event the streams normalize.

The record is the one ``POST /v1/events`` writes (schemas/service_event.avsc) with ``source_kind =
"otel"``, so the stream worker links, tokenizes and joins it as it does a service's turns, and the step
says where it came from. Its id is derived from the trace and span ids: an exporter's retry of the same
span is the same step.

Ids: ``clawr1.trajectory_id`` (span, else resource attribute), else ``gen_ai.conversation.id``, else the
trace id names the trajectory; ``clawr1.step_index``, ``clawr1.prompt_group_id`` / ``_size``,
``clawr1.policy_version`` and ``clawr1.terminal`` place the step when given (docs/otel.md).

Secrets are kept out as on every way in (``clawr1.gateway.redacting``, the capture proxy's one list of
names and shapes): the payload gets the JSON rule (a secret-named field's value becomes ``[REDACTED]``
at any depth), every string the text rule (secret-shaped tokens anywhere, the JSON rule for JSON inside
a string such as tool arguments), an id or name holding a secret becomes a stable stand-in, and
``server.address`` loses its userinfo.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from clawr1.core.ids import id_problem
from clawr1.core.redaction import redact_id, redact_url
from clawr1.gateway.models import AVRO_INT_LIMIT, AVRO_LONG_LIMIT, ID_MAX, NAME_MAX
from clawr1.gateway.otlp.genai import ModelCall
from clawr1.gateway.otlp.wire import OtlpError
from clawr1.gateway.records import Outgoing, compact_json, deterministic_id
from clawr1.gateway.redacting import redact_turn

SOURCE_KIND = "otel"
NO_CONTENT_NOTE = "no message content"
"""Opens the capture note of a call whose prompt or reply did not come with it; the streams give such a
step the status ``no_content`` (never training-ready). clawr1.streams.normalize reads it."""

SAMPLING_ATTRIBUTES = {
    "gen_ai.request.temperature": "temperature", "gen_ai.request.top_p": "top_p",
    "gen_ai.request.top_k": "top_k", "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.presence_penalty": "presence_penalty", "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.seed": "seed", "gen_ai.request.choice.count": "n",
}
_OTEL_ATTRIBUTES = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
                    "gen_ai.response.finish_reasons", "gen_ai.output.type", "gen_ai.request.stream",
                    "server.address", "server.port", "gen_ai.usage.cache_read_input_tokens",
                    "gen_ai.usage.cache_creation_input_tokens", "gen_ai.usage.reasoning_output_tokens")


def _attribute(call: ModelCall, *names: str) -> Any:
    """The first of ``names`` set on the span, else on its resource."""
    for source in (call.attributes, call.resource):
        for name in names:
            if source.get(name) is not None:
                return source[name]
    return None


def _string(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _count(value: Any, low: int = 0, high: int = AVRO_LONG_LIMIT) -> int | None:
    """A whole number attribute (OTLP ints, or whole doubles) within the Avro field's bounds."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None


def _usage(attrs: Mapping[str, Any]) -> dict[str, int]:
    names = {"prompt_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
             "completion_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")}
    usage = {}
    for field, keys in names.items():
        value = next((_count(attrs[k]) for k in keys if k in attrs), None)
        if value is not None:
            usage[field] = value
    return usage


def _finite(value: Any) -> Any:
    """``value`` with non-finite numbers (OTLP doubles may be NaN) as null: the record is JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    return value


def redacted(payload: dict[str, Any]) -> dict[str, Any]:
    """A turn payload with its secrets replaced as every way in replaces them (``redact_turn``), and
    ``server.address`` without its userinfo."""
    out = redact_turn(payload)
    otel = out["metadata"]["otel"]
    if isinstance(otel.get("server.address"), str):
        address = redact_url(f"//{otel['server.address']}")[2:]  # without user:password@
        if address != otel["server.address"]:
            out = {**out, "metadata": {**out["metadata"], "otel": {**otel, "server.address": address}}}
    return out


def turn_payload(call: ModelCall) -> dict[str, Any]:
    """The ``turn`` payload (docs/gateway.md's TurnPayload fields, plus ``error``) of a call, its secrets
    replaced (``redacted``); without its prompt or reply it is kept with what there is and a ``no message
    content`` note."""
    content, attrs = call.content, call.attributes
    reply = content.reply or {}
    notes = []
    if not content.complete:
        missing = " and ".join(w for w, ok in (("prompt", content.has_prompt), ("reply", content.has_reply))
                               if not ok)
        notes.append(f"{NO_CONTENT_NOTE}: the span and its log events carried no {missing} (turn on the "
                     "instrumentation's content capture: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)")
    otel = {"trace_id": call.trace_id, "span_id": call.span_id, "parent_span_id": call.parent_span_id or None,
            "span_name": call.name, "scope": call.scope,
            "service": _string(call.resource.get("service.name"), NAME_MAX),
            **{name: attrs[name] for name in _OTEL_ATTRIBUTES if name in attrs}}
    if content.choices > 1:
        otel["choices"] = content.choices
    metadata: dict[str, Any] = {"otel": otel, "capture_notes": notes}
    if content.tools:
        metadata["tools"] = list(content.tools)  # the chat template renders them when re-tokenizing
    if content.finish_reason:
        metadata["finish_reason"] = content.finish_reason
    payload: dict[str, Any] = {
        "prompt_messages": list(content.messages),
        "response_text": reply.get("content") if isinstance(reply.get("content"), str) else "",
        "tool_calls": reply.get("tool_calls") or [],
        "response_id": _string(attrs.get("gen_ai.response.id"), ID_MAX),
        "model": _string(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"), NAME_MAX),
        "agent": _string(_attribute(call, "gen_ai.agent.name", "clawr1.agent", "service.name"), NAME_MAX),
        "policy_version": _count(_attribute(call, "clawr1.policy_version")),
        "prompt_group_id": _string(_attribute(call, "clawr1.prompt_group_id"), ID_MAX),
        "prompt_group_size": _count(_attribute(call, "clawr1.prompt_group_size"), 1, AVRO_INT_LIMIT),
        "terminal": _attribute(call, "clawr1.terminal") is True,
        "sampling_params": {key: attrs[name] for name, key in SAMPLING_ATTRIBUTES.items() if name in attrs},
        "latency_ms": _count(call.end_ms - call.start_ms) if call.end_ms else None,
        "usage": _usage(attrs),
        "error": call.error,
        "metadata": metadata,
    }
    return redacted({k: _finite(v) for k, v in payload.items() if v is not None})


def trajectory_of(call: ModelCall) -> str:
    explicit = _attribute(call, "clawr1.trajectory_id", "gen_ai.conversation.id")
    trajectory = _string(redact_id(explicit) if isinstance(explicit, str) else None, ID_MAX)
    problem = id_problem(trajectory) if trajectory else None
    if problem is not None:  # the id rule of every way in (a CR/LF id was stored, then 404 in the dashboard)
        raise OtlpError(422, "invalid_request", f"span {call.span_id}: the trajectory id: {problem}")
    return trajectory or call.trace_id


def turn_event(call: ModelCall, source_name: str, received_at_ms: int) -> Outgoing:
    """The service_event record of one call, keyed by its trajectory."""
    trajectory = trajectory_of(call)
    event_id = deterministic_id("otel", source_name, call.trace_id, call.span_id)
    record = {
        "event_id": event_id,
        "kind": "turn",
        "trajectory_id": trajectory,
        "step_id": None,
        "step_index": _count(_attribute(call, "clawr1.step_index"), 0, AVRO_INT_LIMIT),
        "timestamp_ms": call.start_ms or received_at_ms,
        "payload_json": compact_json(turn_payload(call)),
        "source_name": source_name,
        "received_at_ms": received_at_ms,
        "source_kind": SOURCE_KIND,
    }
    return Outgoing(event_id, trajectory, record)
