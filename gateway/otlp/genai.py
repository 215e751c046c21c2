"""OpenTelemetry GenAI spans and log events as model calls: pure functions over decoded OTLP requests.

A span is a *GenAI span* when it carries ``gen_ai.*`` attributes, and a *model call* when its
``gen_ai.operation.name`` is an inference (``chat``, ``text_completion``, ``generate_content``); tool
executions, agent invocations and embeddings are GenAI spans that are not steps. Message content comes
in either of the two shapes current instrumentations use, and both are read:

- the GenAI semantic conventions' ``gen_ai.input.messages`` / ``gen_ai.output.messages`` /
  ``gen_ai.system_instructions`` / ``gen_ai.tool.definitions`` (JSON strings on spans, structured values
  on the ``gen_ai.client.inference.operation.details`` log event), messages made of typed parts;
- the older per-message log events (semantic conventions 1.30: ``gen_ai.system.message``,
  ``gen_ai.user.message``, ``gen_ai.assistant.message``, ``gen_ai.tool.message``, ``gen_ai.choice``)
  whose bodies hold OpenAI-style content and tool calls.

Either way the messages become OpenAI chat messages, the shape the streams, linking and the chat
templates read.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from clawr1.core.epoch import MAX_EPOCH_MS, is_epoch_ms
from clawr1.core.json_depth import JsonTooDeep
from clawr1.gateway.otlp.wire import MAX_JSON_VALUES, OtlpError, json_values_within
from clawr1.gateway.validation import load_json

INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {f"gen_ai.{role}.message": role for role in ("system", "user", "assistant", "tool")}
CHOICE_EVENT = "gen_ai.choice"

SpanKey = tuple[str, str]
"""(trace id, span id), lower-case hex: what ties a log record to its span."""

Json = dict[str, Any]
LOG_RECORD_OVERHEAD = 256
"""Bytes counted for a held log record beyond its values' objects (its event tuple, its place)."""


def footprint(value: Any) -> int:
    """The bytes the objects of ``value`` take (``sys.getsizeof`` summed over every node, iteratively):
    what a held value costs in memory, many times its encoded size for a kvlist of small values."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list | tuple):
            pending += item
    return total


def _refused(reason: str) -> OtlpError:
    return OtlpError(422, "invalid_request", reason)


def _structured(value: Any, where: str) -> Any:
    """A content attribute: a JSON string on spans (parsed as the API parses JSON,
    ``gateway.validation.load_json``, once ``wire.json_values_within`` bounded it), a structured value on
    events (passed). An unparsable string stays a string,
    which no reader takes; one too deep or too large for the API is refused (422), never half-read."""
    if not isinstance(value, str):
        return value
    if not json_values_within(value, MAX_JSON_VALUES):
        raise _refused(f"{where} holds more than {MAX_JSON_VALUES} JSON values")
    try:
        return load_json(value, where)
    except JsonTooDeep as exc:
        raise _refused(str(exc)) from exc
    except ValueError:
        return value


# --- OTLP values ------------------------------------------------------------------------------------

def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as plain Python (kvlists as dicts, arrays as lists)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- content ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Content:
    """The messages of one model call: its prompt as OpenAI chat messages, its reply (an assistant
    message), the finish reason and the tool definitions it offered (OpenAI ``tools`` shape)."""

    messages: tuple[Json, ...] = ()
    reply: Json | None = None
    finish_reason: str | None = None
    tools: tuple[Json, ...] = ()
    choices: int = 0
    """How many replies the call had (only the first becomes the step's action)."""

    @property
    def has_prompt(self) -> bool:
        return any(m.get("content") for m in self.messages)

    @property
    def has_reply(self) -> bool:
        reply = self.reply or {}
        calls = reply.get("tool_calls") or []
        return bool(reply.get("content")) or any("arguments" in (c.get("function") or {}) for c in calls)

    @property
    def complete(self) -> bool:
        return self.has_prompt and self.has_reply

    def merged(self, other: Content) -> Content:
        """This content, with what it lacks taken from ``other`` (another source for the same span)."""
        return Content(
            self.messages if self.has_prompt or not other.messages else other.messages,
            self.reply if self.has_reply or other.reply is None else other.reply,
            self.finish_reason or other.finish_reason,
            self.tools or other.tools,
            max(self.choices, other.choices),
        )


def _tool_call(part: Mapping[str, Any]) -> Json:
    function: Json = {"name": part.get("name") or ""}
    if "arguments" in part and part["arguments"] is not None:
        function["arguments"] = _text(part["arguments"])
    return {"id": part.get("id"), "type": "function", "function": function}


def _semconv_message(message: Mapping[str, Any]) -> list[Json]:
    """One semantic-conventions message (role + typed parts) as OpenAI chat messages: tool results
    become one ``tool`` message each, text parts join into the content, tool calls into ``tool_calls``."""
    role = str(message.get("role") or "user")
    parts = [p for p in message.get("parts") or [] if isinstance(p, Mapping)]
    responses = [p for p in parts if p.get("type") == "tool_call_response"]
    if responses:
        return [{"role": "tool", "tool_call_id": p.get("id"), "content": _text(p.get("response"))}
                for p in responses]
    texts = [str(p.get("content") or "") for p in parts if p.get("type") == "text"]
    others = [dict(p) for p in parts if p.get("type") not in {"text", "tool_call", "reasoning"}]
    content: Any = "".join(texts) if not others else [
        *({"type": "text", "text": t} for t in texts), *others]
    out: Json = {"role": role, "content": content if content != "" else None}
    calls = [_tool_call(p) for p in parts if p.get("type") == "tool_call"]
    if calls:
        out["tool_calls"] = calls
    if message.get("name"):
        out["name"] = message["name"]
    return [out]


def _system_message(instructions: Any) -> list[Json]:
    parts = instructions if isinstance(instructions, list) else []
    text = "".join(str(p.get("content") or "") for p in parts if isinstance(p, Mapping))
    return [{"role": "system", "content": text}] if text else []


def _openai_tools(definitions: Any) -> tuple[Json, ...]:
    """``gen_ai.tool.definitions`` in the OpenAI ``tools`` shape the chat templates render."""
    tools = []
    for item in definitions if isinstance(definitions, list) else []:
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("function"), Mapping):  # already OpenAI-shaped
            tools.append(dict(item))
            continue
        function = {k: item[k] for k in ("name", "description", "parameters") if item.get(k) is not None}
        tools.append({"type": item.get("type") or "function", "function": function})
    return tuple(tools)


def semconv_content(attrs: Mapping[str, Any], where: str = "the span") -> Content:
    """Content from the GenAI conventions' message attributes (span or details event); empty without.
    ``OtlpError`` 422 (naming ``where``) for one the API would refuse."""
    def read(name: str) -> Any:
        return _structured(attrs.get(name), f"{name} of {where}")

    inputs = read("gen_ai.input.messages")
    outputs = read("gen_ai.output.messages")
    messages = [*_system_message(read("gen_ai.system_instructions"))]
    for message in inputs if isinstance(inputs, list) else []:
        if isinstance(message, Mapping):
            messages += _semconv_message(message)
    outputs = [m for m in outputs if isinstance(m, Mapping)] if isinstance(outputs, list) else []
    reply = _semconv_message(outputs[0])[0] if outputs else None
    if reply is not None:
        reply["role"] = "assistant"
    finish = outputs[0].get("finish_reason") if outputs else None
    return Content(tuple(messages), reply, str(finish) if finish else None,
                   _openai_tools(read("gen_ai.tool.definitions")), len(outputs))


def _legacy_message(role: str, body: Any) -> Json:
    """A 1.30 message event's body (``content``, ``tool_calls``, a tool's ``id``) as a chat message."""
    body = body if isinstance(body, Mapping) else {}
    message: Json = {"role": role, "content": body.get("content")}
    calls = [c for c in body.get("tool_calls") or [] if isinstance(c, Mapping)]
    if calls:
        message["tool_calls"] = [_legacy_call(c) for c in calls]
    if role == "tool" and body.get("id") is not None:
        message["tool_call_id"] = body["id"]
    return message


def _legacy_call(call: Mapping[str, Any]) -> Json:
    function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    assert isinstance(function, Mapping)
    return _tool_call({"id": call.get("id"), "name": function.get("name"),
                       **({"arguments": function["arguments"]} if "arguments" in function else {})})


def legacy_content(events: Iterable[tuple[str, Any]]) -> Content:
    """Content from a span's 1.30 events in emission order (``(event name, body)``)."""
    messages: list[Json] = []
    choices: dict[int, Json] = {}
    for name, body in events:
        if name in _MESSAGE_EVENTS:
            messages.append(_legacy_message(_MESSAGE_EVENTS[name], body))
        elif name == CHOICE_EVENT and isinstance(body, Mapping):
            index = body.get("index")
            choices[index if isinstance(index, int) else len(choices)] = dict(body)
    first = choices[min(choices)] if choices else None
    reply = None
    if first is not None:
        reply = _legacy_message("assistant", first.get("message"))
    finish = first.get("finish_reason") if first else None
    return Content(tuple(messages), reply, str(finish) if finish else None, (), len(choices))


# --- spans ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelCall:
    """One inference span: where it sits in its trace, what the conventions say about it, and the
    content its own attributes carry (the log events' content is joined later)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ms: int
    end_ms: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    scope: str
    error: str | None
    content: Content = field(default_factory=Content)

    @property
    def key(self) -> SpanKey:
        return self.trace_id, self.span_id

    @property
    def operation(self) -> str:
        return str(self.attributes.get("gen_ai.operation.name") or "")

    def with_content(self, content: Content | None) -> ModelCall:
        return self if content is None else replace(self, content=self.content.merged(content))


@dataclass
class Tally:
    """What a request held, by outcome: the ``clawr1_otlp_*`` metrics and the answer's warning."""

    counts: Counter[str] = field(default_factory=Counter)

    def warning(self, ignored: Iterable[str], what: str) -> str:
        parts = [f"{self.counts[outcome]} {outcome.replace('_', ' ')}" for outcome in ignored
                 if self.counts[outcome]]
        return f"ignored {', '.join(parts)} {what}" if parts else ""


def is_genai(attrs: Mapping[str, Any]) -> bool:
    return any(key.startswith("gen_ai.") for key in attrs)


def _error(status: Status, attrs: Mapping[str, Any]) -> str | None:
    if status.code != Status.STATUS_CODE_ERROR:
        return None
    kind = attrs.get("error.type")
    return " ".join(str(p) for p in (kind, status.message) if p) or "the span's status is ERROR"


def model_calls(request: ExportTraceServiceRequest, tally: Tally) -> list[ModelCall]:
    """The request's inference spans; every other span is counted in ``tally`` (``not_genai``,
    ``genai_other``) and left out. ``OtlpError`` 422 for a call the pool could not keep (its start is no
    epoch time, its content is too deep or too large)."""
    calls = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = "/".join(p for p in (scope_spans.scope.name, scope_spans.scope.version) if p)
            for span in scope_spans.spans:
                attrs = attributes(span.attributes)
                if not is_genai(attrs):
                    tally.counts["not_genai"] += 1
                    continue
                if attrs.get("gen_ai.operation.name") not in INFERENCE_OPERATIONS:
                    tally.counts["genai_other"] += 1
                    continue
                tally.counts["model_call"] += 1
                where = f"span {span.trace_id.hex()}/{span.span_id.hex()}"
                start_ms = span.start_time_unix_nano // 1_000_000
                if not is_epoch_ms(start_ms):
                    raise _refused(f"startTimeUnixNano {span.start_time_unix_nano} of {where} is not an "
                                   f"epoch time the pool can store (0 to {MAX_EPOCH_MS * 1_000_000} ns)")
                calls.append(ModelCall(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(), name=span.name, start_ms=start_ms,
                    end_ms=span.end_time_unix_nano // 1_000_000,
                    attributes=attrs, resource=resource, scope=scope, error=_error(span.status, attrs),
                    content=semconv_content(attrs, where)))
    return calls


# --- logs ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpanLogs:
    """The GenAI log events of one span seen so far: 1.30 message events in emission order, and the
    content of a details event. A span's events may come in several requests: ``plus`` adds them up.
    ``size``: the bytes their values' objects take (``footprint``, plus ``LOG_RECORD_OVERHEAD`` each), what
    the join counts."""

    events: tuple[tuple[str, Any], ...] = ()
    details: Content = field(default_factory=Content)
    size: int = 0

    def plus(self, later: SpanLogs) -> SpanLogs:
        return SpanLogs(self.events + later.events, self.details.merged(later.details),
                        self.size + later.size)

    def content(self) -> Content:
        return self.details.merged(legacy_content(self.events))


def log_contents(request: ExportLogsServiceRequest, tally: Tally) -> dict[SpanKey, SpanLogs]:
    """The request's GenAI log events per span (both shapes); other records are counted in ``tally``
    (``not_genai``, ``no_span``: a GenAI event not tied to a span) and left out."""
    out: dict[SpanKey, SpanLogs] = {}
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attrs = attributes(record.attributes)
                name = record.event_name or str(attrs.get("event.name") or "")
                if not name.startswith("gen_ai."):
                    tally.counts["not_genai"] += 1
                    continue
                if not record.span_id or not record.trace_id:
                    tally.counts["no_span"] += 1
                    continue
                tally.counts["genai_event"] += 1
                key = (record.trace_id.hex(), record.span_id.hex())
                seen = out.get(key, SpanLogs())
                if name == DETAILS_EVENT:
                    details = semconv_content(attrs, f"the {name} event of span {key[0]}/{key[1]}")
                    size = footprint((details.messages, details.reply, details.finish_reason, details.tools))
                    out[key] = seen.plus(SpanLogs(details=details, size=size + LOG_RECORD_OVERHEAD))
                else:
                    body = any_value(record.body)
                    size = footprint(body) + LOG_RECORD_OVERHEAD
                    out[key] = seen.plus(SpanLogs(events=((name, body),), size=size))
    return out
