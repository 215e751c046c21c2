"""OTLP as an attacker sends it, to a live gateway (real Kafka, hypercorn in this process):

- a 2 KB gzip body of 1,000,000 empty spans (and 2,000,000, 300,000 chat spans, 300,000 log records)
  is refused while `/healthz` keeps answering within 100 ms (each one stalled the API 10-28 s);
- a span's content comes only from log events sent with the same API key.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from clawr1.core.registry import OTLP_JOIN_WAIT_S
from clawr1.core.settings import Settings
from clawr1.gateway.otlp.events import NO_CONTENT_NOTE
from tests.support.gateway import LiveGateway, running_gateway
from tests.support.waiting import wait_until

PROTOBUF = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}


def _field(number: int, payload: bytes) -> bytes:
    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def _request(records: bytes) -> bytes:
    """Records (fields 2 of a ScopeSpans / ScopeLogs) as an export request, gzip-compressed."""
    return gzip.compress(_field(1, _field(2, records)), 9)


def _chat_span() -> bytes:
    span = Span()
    attribute = span.attributes.add()
    attribute.key, attribute.value.string_value = "gen_ai.operation.name", "chat"
    return _field(2, span.SerializeToString())


@pytest.fixture(scope="module")
def api(kafka_bootstrap: str) -> Iterator[LiveGateway]:
    """The stack's default limits (4 MiB bodies, 64 MiB decompressed)."""
    with running_gateway(kafka_bootstrap) as live:
        yield live


def test_an_otlp_flood_holds_no_other_request_for_100_ms(api: LiveGateway) -> None:
    """Bombs one after another on one connection while another asks /healthz (it answered in 9.9 s)."""
    empty = b"\x12\x00"  # an empty span or log record
    bombs = [("/v1/traces", _request(empty * 1_000_000)), ("/v1/traces", _request(empty * 2_000_000)),
             ("/v1/traces", _request(_chat_span() * 300_000)), ("/v1/logs", _request(empty * 300_000))]
    assert len(bombs[0][1]) < 2_048
    answers: list[tuple[str, int, str]] = []
    stop = threading.Event()

    def flood() -> None:
        with httpx.Client(base_url=api.url, timeout=60) as client:
            while not stop.is_set():
                for path, body in bombs:
                    reply = client.post(path, content=body, headers=PROTOBUF)
                    answers.append((path, reply.status_code, reply.json()["error"]))

    flooding = threading.Thread(target=flood, name="otlp-flood")
    latencies: list[float] = []
    with httpx.Client(base_url=api.url, timeout=30) as client:
        client.get("/healthz")  # the connection is open before the flood starts
        flooding.start()
        try:
            while len(answers) < 3 * len(bombs):
                started = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                latencies.append(time.perf_counter() - started)
        finally:
            stop.set()
            flooding.join(60)
    assert {status for _, status, _ in answers} == {413}, answers
    assert {error for _, _, error in answers} == {"batch_too_large"}
    # Each bomb held the event loop 10-28 s. The 100 ms is asserted of nine in ten answers, and of all
    # of them a bound this shared machine's own stalls stay under (other processes' load delays any one).
    latencies.sort()
    assert len(latencies) > 10 and latencies[len(latencies) * 9 // 10] < 0.1, latencies[-10:]
    assert latencies[-1] < 1.0, latencies[-10:]


def _span(trace: str, span: str) -> dict[str, object]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace, "spanId": span, "name": "chat", "startTimeUnixNano": "1700000000000000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}]}]}]}


def _messages(trace: str, span: str, text: str) -> dict[str, object]:
    def event(name: str, body: dict[str, object]) -> dict[str, object]:
        return {"eventName": name, "traceId": trace, "spanId": span, "body": body}

    def kvlist(**values: object) -> dict[str, object]:
        return {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in values.items()]}}

    reply = kvlist(index={"intValue": "0"}, message=kvlist(role={"stringValue": "assistant"},
                                                              content={"stringValue": text}))
    user = event("gen_ai.user.message", kvlist(content={"stringValue": text}))
    records = [user, event("gen_ai.choice", reply)]
    return {"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}


def test_a_spans_content_comes_only_from_log_events_of_its_own_key(kafka_bootstrap: str) -> None:
    settings = Settings(api_keys="a:key-a-1:events,b:key-b-2:events", extra={OTLP_JOIN_WAIT_S.name: "0.2"})
    with running_gateway(kafka_bootstrap, settings=settings) as live:
        def post(path: str, body: dict[str, object], key: str) -> None:
            reply = live.http.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
            assert reply.status_code == 200, reply.text

        planted, own = (uuid.uuid4().hex, uuid.uuid4().hex[:16]), (uuid.uuid4().hex, uuid.uuid4().hex[:16])
        post("/v1/logs", _messages(*planted, "planted by b"), "key-b-2")  # B saw A's traceparent
        post("/v1/traces", _span(*planted), "key-a-1")
        post("/v1/logs", _messages(*own, "said to a"), "key-a-1")
        post("/v1/traces", _span(*own), "key-a-1")

        def landed() -> dict[str, dict[str, object]]:
            records = {r["trajectory_id"]: r for _, r in live.read("events")}
            return records if {planted[0], own[0]} <= set(records) else {}

        records = wait_until(landed, 30, message="both steps on the events topic")
    stolen = json.loads(str(records[planted[0]]["payload_json"]))
    assert "planted by b" not in json.dumps(stolen) and stolen["metadata"]["capture_notes"][0].startswith(
        NO_CONTENT_NOTE)
    assert json.loads(str(records[own[0]]["payload_json"]))["response_text"] == "said to a"
