"""OTLP GenAI spans and log events -> model calls -> service turn events, and the wire format.

Spans and log records are made by the official OpenTelemetry SDK and encoded by the official OTLP
encoder, so what is decoded here is what an exporter sends; the attribute and event names are the
GenAI semantic conventions' (both the current message attributes and the 1.30 per-message events).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from clawr1.core.epoch import is_epoch_ms
from clawr1.gateway.otlp import wire
from clawr1.gateway.otlp.events import NO_CONTENT_NOTE, turn_event, turn_payload
from clawr1.gateway.otlp.genai import ModelCall, SpanLogs, Tally, log_contents, model_calls
from clawr1.gateway.otlp.join import ContentJoin
from clawr1.schemas.codec import AvroCodec
from clawr1.streams import normalize
from clawr1.streams.linking import ROOT, Assignment
from clawr1.streams.readiness import ReadinessRule
from clawr1.streams.turns import turn_from_service_event
from tests.support.waiting import wait_until_async

TOOL_ARGS = {"query": "kafka"}
INPUT = [
    {"role": "user", "parts": [{"type": "text", "content": "Find kafka."}]},
    {"role": "assistant",
     "parts": [{"type": "tool_call", "id": "c1", "name": "grep", "arguments": TOOL_ARGS}]},
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "notes.txt:1: kafka"}]},
]
OUTPUT = [{"role": "assistant", "parts": [{"type": "text", "content": "It is in notes.txt."}],
           "finish_reason": "stop"}]
CALL_ATTRIBUTES = {
    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m-req",
    "gen_ai.response.model": "m-resp", "gen_ai.response.id": "chatcmpl-42", "gen_ai.usage.input_tokens": 31,
    "gen_ai.usage.output_tokens": 7, "gen_ai.request.temperature": 0.5,
    "gen_ai.response.finish_reasons": ("stop",),
}


def openai_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "grep", "arguments": arguments}}


class Telemetry:
    """An SDK tracer and logger writing to memory, and the OTLP requests their output encodes to."""

    def __init__(self, service: str = "my-agent") -> None:
        resource = Resource.create({"service.name": service})
        self.spans = InMemorySpanExporter()
        self.logs = InMemoryLogRecordExporter()
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.tracer = self.tracer_provider.get_tracer("test.genai")
        self.logger = self.logger_provider.get_logger("test.genai")

    def event(self, name: str, body: Any = None, **attributes: Any) -> None:
        self.logger.emit(LogRecord(event_name=name, body=body, attributes=attributes or None))

    def traces(self) -> bytes:
        return bytes(encode_spans(self.spans.get_finished_spans()).SerializeToString())

    def log_request(self) -> bytes:
        return bytes(encode_logs(self.logs.get_finished_logs()).SerializeToString())


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    yield telemetry
    telemetry.tracer_provider.shutdown()
    telemetry.logger_provider.shutdown()


PROTOBUF = wire.Encoding(json=False)


def calls_of(otel: Telemetry, tally: Tally | None = None) -> list[ModelCall]:
    return model_calls(wire.decode_traces(otel.traces(), PROTOBUF), tally or Tally())


def test_span_attributes_carry_the_messages_in_openai_chat_shape(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat m-req", attributes={
            **CALL_ATTRIBUTES,
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
            "gen_ai.input.messages": json.dumps(INPUT), "gen_ai.output.messages": json.dumps(OUTPUT)}):
        pass
    [call] = calls_of(otel)
    assert list(call.content.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find kafka."},
        {"role": "assistant", "content": None, "tool_calls": [openai_call("c1", '{"query":"kafka"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "notes.txt:1: kafka"},
    ]
    payload = turn_payload(call)
    assert payload["response_text"] == "It is in notes.txt." and payload["tool_calls"] == []
    assert (payload["model"], payload["response_id"]) == ("m-resp", "chatcmpl-42")
    assert payload["agent"] == "my-agent"  # the resource's service.name
    assert payload["usage"] == {"prompt_tokens": 31, "completion_tokens": 7}
    assert payload["sampling_params"] == {"temperature": 0.5}
    assert payload["metadata"]["capture_notes"] == [] and payload["metadata"]["finish_reason"] == "stop"
    assert payload["metadata"]["otel"]["trace_id"] == call.trace_id


def test_the_1_30_message_events_give_the_same_conversation(otel: Telemetry) -> None:
    """Per-message log events in the span's context (what instrumentations on conventions 1.30 emit)."""
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        otel.event("gen_ai.user.message", {"content": "Find kafka."})
        otel.event("gen_ai.assistant.message", {"tool_calls": [openai_call("c1", '{"query": "kafka"}')]})
        otel.event("gen_ai.tool.message", {"content": "notes.txt:1: kafka", "id": "c1"})
        otel.event("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "tool_calls": [openai_call("c2", '{"query":"avro"}')]}})
    [call] = calls_of(otel)
    assert not call.content.complete  # the span itself carries no messages
    tally = Tally()
    logs = log_contents(wire.decode_logs(otel.log_request(), PROTOBUF), tally)
    assert tally.counts == {"genai_event": 4}
    joined = call.with_content(logs[call.key].content())
    assert [m["role"] for m in joined.content.messages] == ["user", "assistant", "tool"]
    assert joined.content.messages[2]["tool_call_id"] == "c1"
    payload = turn_payload(joined)
    assert payload["tool_calls"] == [openai_call("c2", '{"query":"avro"}')]
    assert payload["metadata"]["capture_notes"] == []


def test_the_details_event_carries_structured_messages(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        otel.event("gen_ai.client.inference.operation.details", None, **{
            "gen_ai.input.messages": INPUT, "gen_ai.output.messages": OUTPUT})
    [call] = calls_of(otel)
    logs = log_contents(wire.decode_logs(otel.log_request(), PROTOBUF), Tally())
    joined = call.with_content(logs[call.key].content())
    assert joined.content.complete and joined.content.reply == {"role": "assistant",
                                                               "content": "It is in notes.txt."}
    assert joined.content.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"query":"kafka"}'


def test_only_model_calls_become_steps_and_the_rest_is_counted(otel: Telemetry) -> None:
    span, agent = otel.tracer.start_as_current_span, {"gen_ai.operation.name": "invoke_agent"}
    with span("http GET /"), span("agent", attributes=agent):
        with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
            pass
        with otel.tracer.start_as_current_span("tool", attributes={"gen_ai.operation.name": "execute_tool"}):
            pass
    tally = Tally()
    [call] = calls_of(otel, tally)
    assert tally.counts == {"not_genai": 1, "genai_other": 2, "model_call": 1}
    assert call.operation == "chat" and call.parent_span_id
    assert tally.warning(("not_genai", "genai_other"), "spans") == "ignored 1 not genai, 2 genai other spans"


def test_a_span_without_content_lands_with_a_note_and_is_never_ready(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        pass
    [call] = calls_of(otel)
    payload = turn_payload(call)
    assert payload["prompt_messages"] == [] and payload["usage"]["prompt_tokens"] == 31
    [note] = payload["metadata"]["capture_notes"]
    assert note.startswith(NO_CONTENT_NOTE) and "prompt and reply" in note
    step = _normalized(call)
    assert (step["status"], step["source_kind"], step["model"]) == ("no_content", "otel", "m-resp")
    ready_anyway = {**step, "reward": 1.0, "reward_status": "final", "trajectory_reward": None,
                    "trajectory_reward_status": "pending"}
    assert not ReadinessRule.parse("final_reward").is_ready(ready_anyway)


def _normalized(call: ModelCall) -> dict[str, Any]:
    """The call through the Avro codec and the streams' normalization, as the stream worker does it."""
    codec = AvroCodec()
    outgoing = turn_event(call, "svc", 1_700_000_000_000)
    _, record = codec.decode(codec.encode("service_event", outgoing.record), expect="service_event")
    turn = turn_from_service_event(record)
    assert turn is not None
    assignment = Assignment(outgoing.key, 0, None, ROOT)
    [fact] = normalize.steps_from_turn(turn, [assignment], None)
    return fact.step


def test_a_complete_call_normalizes_into_an_otel_step(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, "gen_ai.input.messages": json.dumps(INPUT),
            "gen_ai.output.messages": json.dumps(OUTPUT)}):
        pass
    [call] = calls_of(otel)
    step = _normalized(call)
    assert (step["status"], step["source_kind"], step["response_id"]) == ("ok", "otel", "chatcmpl-42")
    assert (step["usage_prompt_tokens"], step["usage_completion_tokens"]) == (31, 7)
    assert step["response_text"] == "It is in notes.txt." and len(json.loads(step["prompt_messages"])) == 3
    assert step["trajectory_id"] == call.trace_id and json.loads(step["metadata_json"])["api"] == "otel.genai"


def test_ids_come_from_the_span_unless_the_span_names_them(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        pass
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, "gen_ai.conversation.id": "conv-1", "clawr1.step_index": 3,
            "clawr1.prompt_group_id": "g1", "clawr1.prompt_group_size": 4, "clawr1.policy_version": 9}):
        pass
    plain, named = calls_of(otel)
    first = turn_event(plain, "svc", 1)
    assert first.key == plain.trace_id and first.record["step_index"] is None
    assert turn_event(plain, "svc", 2).id == first.id  # an exporter's retry is the same step
    assert turn_event(plain, "other-key", 1).id != first.id
    second = turn_event(named, "svc", 1)
    payload = json.loads(second.record["payload_json"])
    assert (second.key, second.record["step_index"]) == ("conv-1", 3)
    assert (payload["prompt_group_id"], payload["prompt_group_size"]) == ("g1", 4)
    assert payload["policy_version"] == 9


def test_a_failed_call_is_a_failed_step(otel: Telemetry) -> None:
    failed = {**CALL_ATTRIBUTES, "error.type": "APIError"}
    with otel.tracer.start_as_current_span("chat", attributes=failed) as span:
        span.set_status(Status(StatusCode.ERROR, "upstream 500"))
    [call] = calls_of(otel)
    step = _normalized(call)
    assert (step["status"], step["error"]) == ("failed", "APIError upstream 500")


# --- the wire -------------------------------------------------------------------------------------------

def test_json_bodies_with_hex_ids_decode_like_protobuf(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        pass
    [span] = otel.spans.get_finished_spans()
    trace_id, span_id = f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace_id, "spanId": span_id, "name": "chat", "kind": 3,
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000250000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                       {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "31"}}],
        "futureField": True}]}]}]}
    [call] = model_calls(wire.decode_traces(json.dumps(body).encode(), wire.Encoding(json=True)), Tally())
    assert (call.trace_id, call.span_id, call.end_ms - call.start_ms) == (trace_id, span_id, 250)
    assert call.attributes["gen_ai.usage.input_tokens"] == 31


@pytest.mark.parametrize(("body", "encoding", "reason"), [
    (b"\x0a\xff\xff", PROTOBUF, "not a valid OTLP protobuf ExportTraceServiceRequest"),
    (b"[1, 2]", wire.Encoding(json=True), "one JSON object"),
    (b"{not json", wire.Encoding(json=True), "not a valid OTLP/JSON"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}', wire.Encoding(json=True),
     "not a hex id"),
    (b'{"resourceSpans": "many"}', wire.Encoding(json=True), "not a valid OTLP/JSON"),
])
def test_a_malformed_body_is_refused_with_the_reason(body: bytes, encoding: wire.Encoding,
                                                     reason: str) -> None:
    with pytest.raises(wire.OtlpError, match=reason) as refused:
        wire.decode_traces(body, encoding)
    assert refused.value.status == 400


def test_content_types_and_encodings() -> None:
    assert wire.Encoding.of("application/x-protobuf").json is False
    assert wire.Encoding.of("application/json; charset=utf-8").json is True
    with pytest.raises(wire.OtlpError) as refused:
        wire.Encoding.of("text/plain")
    assert refused.value.status == 415
    assert wire.inflate(gzip.compress(b"x" * 100), "gzip", 100) == b"x" * 100
    with pytest.raises(wire.OtlpError, match="exceeds") as bomb:
        wire.inflate(gzip.compress(b"x" * 101), "gzip", 100)
    assert bomb.value.status == 413
    with pytest.raises(wire.OtlpError, match="not valid gzip"):
        wire.inflate(b"not gzip", "gzip", 100)
    with pytest.raises(wire.OtlpError, match="truncated"):
        wire.inflate(gzip.compress(b"x" * 100)[:-12], "gzip", 100)
    with pytest.raises(wire.OtlpError) as unknown:
        wire.inflate(b"", "br", 100)
    assert unknown.value.status == 415


def test_the_answer_says_what_was_ignored() -> None:
    answer = ExportTraceServiceResponse.FromString(wire.answer(ExportTraceServiceResponse, "ignored 2 spans",
                                                               PROTOBUF))
    assert answer.partial_success.rejected_spans == 0
    assert answer.partial_success.error_message == "ignored 2 spans"
    assert json.loads(wire.answer(ExportTraceServiceResponse, "", wire.Encoding(json=True))) == {}


# --- the join -------------------------------------------------------------------------------------------

def test_a_span_waits_for_its_log_events_until_they_come_or_time_runs_out(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        otel.event("gen_ai.user.message", {"content": "hi"})
        otel.event("gen_ai.choice", {"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "hello"}})
    [call] = calls_of(otel)
    logs = log_contents(wire.decode_logs(otel.log_request(), PROTOBUF), Tally())
    user_only = {key: type(value)(events=value.events[:1]) for key, value in logs.items()}
    choice_only = {key: type(value)(events=value.events[1:]) for key, value in logs.items()}

    key = ("agent", *call.key)

    async def scenario() -> tuple[float, str | None]:
        join = ContentJoin()
        join.offer("agent", user_only)  # the user message came first, in its own request
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, join.offer, "agent", choice_only)
        started = loop.time()
        await join.wait([key], 5.0)
        waited = loop.time() - started
        taken = join.take(key)
        assert taken is not None and join.take(key) is None
        return waited, taken.content().reply and taken.content().reply.get("content")

    waited, reply = asyncio.run(scenario())
    assert waited < 2.0 and reply == "hello"

    async def timeout() -> float:
        join = ContentJoin()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await join.wait([key], 0.1)
        return loop.time() - started

    assert 0.1 <= asyncio.run(timeout()) < 1.0


def test_unclaimed_log_events_expire_by_age_and_bytes() -> None:
    now = [0.0]
    join = ContentJoin(ttl_s=10, max_bytes=200, clock=lambda: now[0])
    join.offer("k", {("t", span): SpanLogs(size=100) for span in "abc"})
    assert len(join) == 2 and join.expired == 1 and join.take(("k", "t", "a")) is None
    assert join.held_bytes("k") == 200
    now[0] = 11.0
    join.offer("k", {("t", "d"): SpanLogs(size=10)})
    assert len(join) == 1 and join.expired == 3 and join.held_bytes("k") == 10
    now[0] = 22.0
    join.offer("other", {})  # a request without GenAI events still lets the old ones go
    assert len(join) == 0 and join.expired == 4 and join.held_bytes("k") == 0


# --- admission: bounded work, the pool's rules, redaction ---------------------------------------------------

def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (what every OTLP message level nests in)."""
    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def _nested(records: bytes) -> bytes:
    """``records`` (fields of a ScopeSpans / ScopeLogs) as an export request: resource (1) -> scope (2)."""
    return _field(1, _field(2, records))


def test_a_flood_of_spans_or_log_records_is_refused_before_any_is_parsed() -> None:
    """1,000,000 empty spans in 1,983 gzip bytes: refused after 10,000 of them were counted (the count
    walks the wire format; the parser, which holds the interpreter, never sees the body)."""
    bomb = gzip.compress(_nested(b"\x12\x00" * 1_000_000), 9)
    assert len(bomb) < 2_100
    body = wire.inflate(bomb, "gzip", 64 << 20)
    with pytest.raises(wire.OtlpError, match="more than 10000 spans") as spans:
        wire.decode_traces(body, PROTOBUF)
    assert spans.value.status == 413
    with pytest.raises(wire.OtlpError, match="more than 300 log records") as records:
        wire.decode_logs(_nested(b"\x12\x00" * 301), PROTOBUF, max_records=300)
    assert records.value.status == 413
    assert len(wire.decode_logs(_nested(b"\x12\x00" * 300), PROTOBUF, 300).resource_logs[0]
               .scope_logs[0].log_records) == 300


def test_a_span_of_countless_fields_or_a_json_body_of_countless_values_is_refused() -> None:
    one_span = _nested(_field(2, b"\x4a\x00" * wire.MAX_FIELDS))  # a span of empty attributes
    with pytest.raises(wire.OtlpError, match="protobuf fields") as fields:
        wire.decode_traces(one_span, PROTOBUF)
    assert fields.value.status == 413
    spans = ",".join(["{}"] * wire.MAX_JSON_VALUES)
    body = f'{{"resourceSpans": [{{"scopeSpans": [{{"spans": [{spans}]}}]}}]}}'.encode()
    with pytest.raises(wire.OtlpError, match="JSON values") as values:
        wire.decode_traces(body, wire.Encoding(json=True))
    assert values.value.status == 413
    # Commas and brackets inside strings are no values: the exact count skips them.
    assert wire.json_values_within(json.dumps(["," * 500, "{[" * 500]), 5)
    assert not wire.json_values_within(json.dumps([[1, 2], {"a": 3}]), 4)


def _deep(levels: int) -> Any:
    return json.loads("[" * levels + "]" * levels)


@pytest.mark.parametrize("attribute", ["gen_ai.input.messages", "gen_ai.output.messages",
                                       "gen_ai.tool.definitions"])
def test_content_nested_deeper_than_the_api_accepts_is_refused_not_a_crash(otel: Telemetry,
                                                                          attribute: str) -> None:
    """100,000 levels (a RecursionError, so a 500, before) and 600-deep parts: a 422 naming the span."""
    deep_parts = [{"role": "user", "parts": [{"type": "text", "content": "x", "extra": _deep(600)}]}]
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, attribute: "[" * 100_000 + "]" * 100_000}):
        pass
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, attribute: json.dumps(deep_parts)}):
        pass
    for span in otel.spans.get_finished_spans():
        request = encode_spans([span]).SerializeToString()
        with pytest.raises(wire.OtlpError, match=f"{attribute} of span .* nests deeper") as refused:
            model_calls(wire.decode_traces(request, PROTOBUF), Tally())
        assert refused.value.status == 422
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, attribute: json.dumps([_deep(150)])}):
        pass
    model_calls(wire.decode_traces(encode_spans([otel.spans.get_finished_spans()[-1]]).SerializeToString(),
                                   PROTOBUF), Tally())  # as deep as the API takes: read


def test_a_string_holding_json_too_deep_to_redact_is_never_stored_unchecked(otel: Telemetry) -> None:
    """As the proxy keeps such a text: JSON nested past the one limit cannot be read field by field, so
    the text is replaced, never stored as it came (it was a RecursionError, then a 500)."""
    for depth in (150, 300, 5_000):
        text = "[" * depth + '{"password": "hunter2xx"}' + "]" * depth  # a message's text, itself JSON
        messages = [{"role": "user", "parts": [{"type": "text", "content": text}]}]
        with otel.tracer.start_as_current_span("chat", attributes={
                **CALL_ATTRIBUTES, "gen_ai.input.messages": json.dumps(messages),
                "gen_ai.output.messages": json.dumps(OUTPUT)}):
            pass
    within, *deep = calls_of(otel)
    kept = turn_event(within, "svc", 1).record["payload_json"]
    assert "hunter2xx" not in kept and "nested deeper" not in kept  # read field by field
    for call in deep:
        payload = turn_event(call, "svc", 1).record["payload_json"]
        assert "hunter2xx" not in payload and "nested deeper than 200 levels" in payload


def test_deep_bodies_are_a_400_in_either_encoding() -> None:
    deep_json = b'{"resourceSpans": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(wire.OtlpError, match="nests deeper than 200 levels") as json_body:
        wire.decode_traces(deep_json, wire.Encoding(json=True))
    value = b""
    for _ in range(2_000):  # AnyValue { array_value { values { ... } } }
        value = _field(5, _field(1, value))
    attribute = _field(9, _field(2, value))  # span.attributes { value }
    with pytest.raises(wire.OtlpError, match="not a valid OTLP protobuf") as protobuf:
        wire.decode_traces(_nested(_field(2, attribute)), PROTOBUF)
    assert json_body.value.status == protobuf.value.status == 400


def test_a_start_time_the_pool_cannot_store_is_refused_at_admission() -> None:
    """2^64-1 ns was answered 200, then dead-lettered by the sink ("not an epoch time"): the same rule
    (clawr1.core.epoch) now refuses it."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.start_time_unix_nano = b"\x01" * 16, b"\x02" * 8, 2**64 - 1
    attribute = span.attributes.add()
    attribute.key, attribute.value.string_value = "gen_ai.operation.name", "chat"
    with pytest.raises(wire.OtlpError, match="startTimeUnixNano 18446744073709551615 .* not an epoch") as bad:
        model_calls(request, Tally())
    assert bad.value.status == 422
    span.start_time_unix_nano = 1_700_000_000_000_000_000
    [call] = model_calls(request, Tally())
    assert call.start_ms == 1_700_000_000_000 and is_epoch_ms(call.start_ms)


OPENAI_KEY = "sk-proj-" + "a1B2c3D4" * 5
GITHUB_TOKEN = "ghp_" + "x1Y2" * 9
BEARER = "Bearer abcdef0123456789abcdef"


def test_secrets_in_otlp_content_are_redacted_as_the_proxy_redacts_them() -> None:
    otel = Telemetry(service=f"agent {GITHUB_TOKEN}")
    messages = [
        {"role": "user", "parts": [{"type": "text", "content": f"my key is {OPENAI_KEY}"},
                                   {"type": "blob", "api_key": "plain-secret-1", "password": "hunter2xx"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "login",
                                         "arguments": {"token": "plain-secret-2", "user": "bob"}}]},
    ]
    output = [{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "c2", "name": "call", "arguments": {"password": "plain-secret-3"}},
        {"type": "text", "content": f"use {BEARER}"}], "finish_reason": f"stop {GITHUB_TOKEN}"}]
    schema = {"type": "object", "properties": {"password": {"type": "string"}}}
    tools = [{"name": "login", "parameters": schema, "secret": "plain-secret-4"}]
    try:
        with otel.tracer.start_as_current_span(f"chat {OPENAI_KEY}", attributes={
                **CALL_ATTRIBUTES, "gen_ai.input.messages": json.dumps(messages),
                "gen_ai.output.messages": json.dumps(output), "gen_ai.tool.definitions": json.dumps(tools),
                "gen_ai.conversation.id": f"conv/{OPENAI_KEY}",
                "server.address": "bob:hunter2pass@api.example.com"}):
            pass
        [call] = calls_of(otel)
    finally:
        otel.tracer_provider.shutdown()
        otel.logger_provider.shutdown()
    event = turn_event(call, "svc", 1)
    stored = json.dumps(event.record) + event.key
    for secret in (OPENAI_KEY, GITHUB_TOKEN, BEARER, "plain-secret-1", "hunter2", "plain-secret-2",
                   "plain-secret-3", "plain-secret-4"):
        assert secret not in stored, secret
    payload = json.loads(event.record["payload_json"])
    assert payload["metadata"]["otel"]["server.address"] == "api.example.com"
    assert payload["metadata"]["tools"][0]["function"]["parameters"]["properties"] == {
        "password": {"type": "string"}}  # a schema names secrets, holds none
    assert json.loads(payload["prompt_messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "token": "[REDACTED]", "user": "bob"}
    assert event.key == turn_event(call, "svc", 2).key != f"conv/{OPENAI_KEY}"  # a stable stand-in


# --- the join is per API key, bounded in bytes, expired by time -------------------------------------------

def test_one_keys_log_events_never_fill_or_push_out_anothers(otel: Telemetry) -> None:
    with otel.tracer.start_as_current_span("chat", attributes=CALL_ATTRIBUTES):
        otel.event("gen_ai.user.message", {"content": "hi"})
        otel.event("gen_ai.choice", {"index": 0, "message": {"role": "assistant", "content": "hello"}})
    [call] = calls_of(otel)
    logs = log_contents(wire.decode_logs(otel.log_request(), PROTOBUF), Tally())
    join = ContentJoin(max_bytes=10_000)
    join.offer("b", logs)  # key B knows A's trace and span ids (a traceparent header shows them)
    assert not join.has_reply(("a", *call.key)) and join.take(("a", *call.key)) is None
    join.offer("a", logs)
    join.offer("b", {(f"{i:032x}", f"{i:016x}"): SpanLogs(size=100) for i in range(20_001)})
    assert join.held_bytes("b") <= 10_000 and join.expired > 20_000 - 100
    taken = join.take(("a", *call.key))
    assert taken is not None and taken.content().reply == {"role": "assistant", "content": "hello"}


def test_unclaimed_log_events_go_by_time_without_another_request() -> None:
    async def scenario() -> tuple[int, int]:
        join = ContentJoin(ttl_s=0.05)
        join.offer("k", {("t", "s"): SpanLogs(size=10)})
        held = len(join)
        await wait_until_async(lambda: len(join) == 0, 5.0)
        return held, join.expired

    assert asyncio.run(scenario()) == (1, 1)


def test_a_trajectory_id_with_a_line_break_is_refused_as_on_every_way_in(otel: Telemetry) -> None:
    """clawr1.core.ids: the API, the proxy's hints and curation refuse it; a CR/LF id from OTLP was stored,
    then answered 404 by the dashboard."""
    with otel.tracer.start_as_current_span("chat", attributes={
            **CALL_ATTRIBUTES, "clawr1.trajectory_id": "t\r\nX-Injected: 1",
            "gen_ai.output.messages": json.dumps(OUTPUT)}):
        pass
    [call] = calls_of(otel)
    with pytest.raises(wire.OtlpError, match="trajectory id") as refused:
        turn_event(call, "svc", 1)
    assert refused.value.status == 422
