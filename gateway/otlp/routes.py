"""``POST /v1/traces`` and ``POST /v1/logs``: OTLP/HTTP in, service ``turn`` events out (key kind ``events``).

Thin: ``wire`` decodes, ``genai`` finds the model calls and their content, ``join`` pairs spans with
the log events that carry their messages (sent with the same API key), ``events`` writes the records.
A traces request is answered 200 once Kafka acknowledged every step it held (as the other ingest routes
answer 202); a logs request once its content is held for its span. Errors keep the API's one shape
(docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from clawr1.core.metrics import OTLP_LOG_RECORDS, OTLP_SPANS
from clawr1.core.registry import OTLP_MAX_RECORDS
from clawr1.gateway.errors import ApiError, ErrorBody
from clawr1.gateway.otlp import wire
from clawr1.gateway.otlp.events import turn_event
from clawr1.gateway.otlp.genai import ModelCall, SpanKey, SpanLogs, Tally, log_contents, model_calls
from clawr1.gateway.otlp.join import ContentJoin
from clawr1.gateway.publisher import OutMessage
from clawr1.schemas.codec import AvroCodec, EncodeError

T = TypeVar("T")
WORKERS = 2
"""Threads that do the OTLP routes' work. It is Python under one interpreter lock, so more threads add
no throughput; two let a small request pass a large one, and bound what concurrent floods hold (memory,
and the default executor the rest of the API uses stays free)."""


@dataclass
class OtlpIngest:
    """What the OTLP routes need from the API process (given by ``clawr1.gateway.app``).

    Every step whose work grows with the body (inflating, counting, parsing, walking the spans, checking,
    redacting, encoding) runs in one of ``WORKERS`` threads under the limits of ``wire``; the event loop
    only joins, waits and publishes, work bounded by the model calls one request may hold."""

    publish: Callable[[list[OutMessage]], Awaitable[None]]
    codec: AvroCodec
    topic: str
    schema: str
    max_request_bytes: int
    max_calls: int
    wait_s: float
    max_records: int = OTLP_MAX_RECORDS.default
    join: ContentJoin = field(default_factory=ContentJoin)
    workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WORKERS, thread_name_prefix="otlp"))
    # Raises (429) while the pipeline is behind: checked before a body is read, so a refused export's
    # log events are not taken from the join for nothing.
    admit: Callable[[], None] = lambda: None

    async def _in_worker(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.workers, work, *args)

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)

    def _inflated(self, request: Request, raw: bytes) -> bytes:
        return wire.inflate(raw, request.headers.get("content-encoding", ""),
                            self.max_request_bytes * wire.INFLATE_FACTOR)

    def _calls(self, request: Request, raw: bytes, encoding: wire.Encoding) -> tuple[list[ModelCall], Tally]:
        decoded = wire.decode_traces(self._inflated(request, raw), encoding, self.max_records)
        tally = Tally()
        calls = model_calls(decoded, tally)
        if len(calls) > self.max_calls:
            raise ApiError(413, "batch_too_large", f"{len(calls)} GenAI model-call spans exceed the limit of "
                           f"{self.max_calls} per request (max_batch_steps); export smaller batches")
        return calls, tally

    def _log_contents(self, request: Request, raw: bytes,
                      encoding: wire.Encoding) -> tuple[dict[SpanKey, SpanLogs], Tally]:
        decoded = wire.decode_logs(self._inflated(request, raw), encoding, self.max_records)
        tally = Tally()
        return log_contents(decoded, tally), tally

    def encode(self, joined: list[tuple[ModelCall, SpanLogs | None]], source_name: str) -> list[OutMessage]:
        received_at_ms = int(time.time() * 1000)
        calls = [call if logs is None else call.with_content(logs.content()) for call, logs in joined]
        outgoing = [turn_event(call, source_name, received_at_ms) for call in calls]
        try:
            return [OutMessage(self.topic, o.key, self.codec.encode(self.schema, o.record)) for o in outgoing]
        except EncodeError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from exc

    async def traces(self, request: Request, source_name: str) -> bytes:
        self.admit()
        encoding = wire.Encoding.of(request.headers.get("content-type", ""))
        raw = await request.body()
        calls, tally = await self._in_worker(self._calls, request, raw, encoding)
        incomplete = [(source_name, *call.key) for call in calls if not call.content.complete]
        if incomplete and self.wait_s > 0:
            await self.join.wait(incomplete, self.wait_s)
        joined = [(call, self.join.take((source_name, *call.key))) for call in calls]
        if joined:
            await self.publish(await self._in_worker(self.encode, joined, source_name))
        for outcome, count in tally.counts.items():
            OTLP_SPANS.labels(outcome=outcome).inc(count)
        warning = tally.warning(("not_genai", "genai_other"), "spans (only GenAI model calls become steps)")
        return wire.answer(ExportTraceServiceResponse, warning, encoding)

    async def logs(self, request: Request, source_name: str) -> bytes:
        self.admit()
        encoding = wire.Encoding.of(request.headers.get("content-type", ""))
        raw = await request.body()
        contents, tally = await self._in_worker(self._log_contents, request, raw, encoding)
        expired = self.join.expired
        self.join.offer(source_name, contents)
        tally.counts["expired"] += self.join.expired - expired
        for outcome, count in tally.counts.items():
            OTLP_LOG_RECORDS.labels(outcome=outcome).inc(count)
        warning = tally.warning(("not_genai", "no_span"), "log records (only a span's GenAI events are read)")
        return wire.answer(ExportLogsServiceResponse, warning, encoding)


def _body(description: str) -> dict[str, Any]:
    return {"required": True, "content": {
        wire.PROTOBUF: {"schema": {"type": "string", "format": "binary", "description": description}},
        wire.JSON: {"schema": {"type": "object", "description": f"{description} (OTLP/JSON)"}},
    }}


_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "accepted (a partial_success error_message says what was ignored)", "content": {
        wire.PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
        wire.JSON: {"schema": {"type": "object"}}}},
    **{status: {"model": ErrorBody, "description": text} for status, text in {
        400: "malformed OTLP body (the reason says what the parser found)",
        401: "missing or invalid API key", 403: "the key's kinds do not grant this route",
        413: "body or decompressed body too large, or too many spans, log records, model-call spans, "
             "protobuf fields or JSON values",
        422: "a model call the pool could not keep (start time, content nested too deep or too large)",
        429: "the pipeline is behind past CLAWR1_MAX_LAG_S: retry after Retry-After seconds",
        415: "not application/x-protobuf or application/json, or an unsupported Content-Encoding",
        503: "Kafka unavailable or overloaded: retry after Retry-After seconds",
    }.items()},
}


def otlp_router(ingest: OtlpIngest, authorize: Callable[..., Any]) -> APIRouter:
    """The two OTLP/HTTP routes; ``authorize`` is the API's key check (kind ``events``, ``ROUTE_KINDS``)."""
    router = APIRouter(prefix="/v1", tags=["otlp"])
    authenticated = Depends(authorize)

    async def answered(encoding_of: Request, handle: Awaitable[bytes]) -> Response:
        try:
            body = await handle
        except wire.OtlpError as exc:
            raise ApiError(exc.status, exc.code, str(exc)) from exc
        media = wire.Encoding.of(encoding_of.headers.get("content-type", "")).media_type
        return Response(body, 200, media_type=media)

    @router.post("/traces", status_code=200, response_class=Response, responses=_ANSWERS,
                 openapi_extra={"requestBody": _body("ExportTraceServiceRequest")},
                 summary="OTLP/HTTP traces: GenAI model-call spans become steps (source kind otel)")
    async def export_traces(request: Request, source_name: str = authenticated) -> Response:
        return await answered(request, ingest.traces(request, source_name))

    @router.post("/logs", status_code=200, response_class=Response, responses=_ANSWERS,
                 openapi_extra={"requestBody": _body("ExportLogsServiceRequest")},
                 summary="OTLP/HTTP logs: GenAI message events, joined to their spans")
    async def export_logs(request: Request, source_name: str = authenticated) -> Response:
        return await answered(request, ingest.logs(request, source_name))

    return router
