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
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from clawr1.gateway.otlp import wire
from clawr1.gateway.otlp.events import NO_CONTENT_NOTE, turn_event, turn_payload
from clawr1.gateway.otlp.genai import ModelCall, Tally, log_contents, model_calls
from clawr1.gateway.otlp.join import ContentJoin
from clawr1.schemas.codec import AvroCodec
from clawr1.streams import normalize
from clawr1.streams.linking import ROOT, Assignment
from clawr1.streams.readiness import ReadinessRule
from clawr1.streams.turns import turn_from_service_event

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

    def __init__(self) -> None:
        resource = Resource.create({"service.name": "my-agent"})
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

    async def scenario() -> tuple[float, str | None]:
        join = ContentJoin()
        join.offer(user_only)  # the user message came first, in its own request
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, join.offer, choice_only)
        started = loop.time()
        await join.wait([call.key], 5.0)
        waited = loop.time() - started
        taken = join.take(call.key)
        assert taken is not None and join.take(call.key) is None
        return waited, taken.content().reply and taken.content().reply.get("content")

    waited, reply = asyncio.run(scenario())
    assert waited < 2.0 and reply == "hello"

    async def timeout() -> float:
        join = ContentJoin()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await join.wait([call.key], 0.1)
        return loop.time() - started

    assert 0.1 <= asyncio.run(timeout()) < 1.0


def test_unclaimed_log_events_expire_by_age_and_count() -> None:
    now = [0.0]
    join = ContentJoin(ttl_s=10, max_spans=2, clock=lambda: now[0])
    from clawr1.gateway.otlp.genai import SpanLogs

    join.offer({("t", "a"): SpanLogs(), ("t", "b"): SpanLogs(), ("t", "c"): SpanLogs()})
    assert len(join) == 2 and join.expired == 1 and join.take(("t", "a")) is None
    now[0] = 11.0
    join.offer({("t", "d"): SpanLogs()})
    assert len(join) == 1 and join.expired == 3
