"""OTLP/HTTP bodies in and out: protobuf or JSON, optionally gzip-compressed, decoded by the official
``opentelemetry-proto`` classes, and the ``Export*ServiceResponse`` answered in kind.

OTLP/JSON differs from protobuf's canonical JSON mapping in one place: trace and span ids are hex
strings, not base64. They are rewritten to base64 before ``json_format`` parses the body; unknown fields
are ignored, as the OTLP specification asks of receivers.

Bounded work: the parsers (upb, pydantic-core) are C code that holds the interpreter for a whole parse,
so nothing reaches one unmeasured. The body is inflated with a cap on its decompressed size (checked as
it inflates); a protobuf body's fields and records are counted by walking its wire format (tags and
lengths only, by the official descriptors) and a JSON document's values by a scan that skips strings,
both in Python the event loop can interrupt, before the parser sees it. ``MAX_FIELDS`` and
``MAX_JSON_VALUES`` keep any one parse to a few tens of milliseconds (docs/otel.md).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from clawr1.core.registry import OTLP_MAX_RECORDS
from clawr1.gateway.validation import load_json

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# Decompressed bodies may be this many times the request size limit (a gzip bomb is refused, not inflated).
INFLATE_FACTOR = 16
MAX_FIELDS = 500_000
"""Protobuf fields (at every depth) in one request: upb parses ~500,000 empty messages in ~20 ms."""
MAX_JSON_VALUES = 100_000
"""Values in one JSON document (a body, a content attribute): pydantic-core parses as many in ~40 ms at
worst (one object of distinct keys)."""
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")

M = TypeVar("M", bound=Message)


class OtlpError(ValueError):
    """A body that cannot be an OTLP export request; ``status`` and ``code`` say how to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(frozen=True)
class Encoding:
    """How a request came (and so how its answer goes): protobuf or JSON."""

    json: bool

    @classmethod
    def of(cls, content_type: str) -> Encoding:
        media = content_type.split(";", 1)[0].strip().lower()
        if media in {PROTOBUF, "application/protobuf"}:
            return cls(json=False)
        if media == JSON or media.endswith("+json"):
            return cls(json=True)
        raise OtlpError(415, "unsupported_media_type",
                        f"send OTLP as {PROTOBUF} or {JSON} (got {media or 'no Content-Type'})")

    @property
    def media_type(self) -> str:
        return JSON if self.json else PROTOBUF


def inflate(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """The body as sent before ``Content-Encoding`` (gzip or deflate), at most ``limit`` bytes."""
    encoding = content_encoding.strip().lower()
    if encoding in {"", "identity"}:
        return raw
    if encoding not in {"gzip", "deflate"}:
        raise OtlpError(415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported; "
                        "send gzip or an uncompressed body")
    window = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(window)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise OtlpError(400, "malformed_body", f"the body is not valid {encoding}: {exc}") from exc
    if len(body) > limit:
        raise OtlpError(413, "payload_too_large", f"the decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise OtlpError(400, "malformed_body", f"the {encoding} body is truncated")
    return body


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON's hex trace/span ids as the base64 that protobuf's JSON mapping expects for bytes."""
    if isinstance(node, list):
        return [_hex_ids_to_base64(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _ID_FIELDS and isinstance(value, str):
            try:
                value = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError as exc:
                raise OtlpError(400, "malformed_body", f"{key} {value!r} is not a hex id") from exc
        out[key] = _hex_ids_to_base64(value)
    return out


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{,]')


def json_values_within(text: str, limit: int) -> bool:
    """Whether ``text`` holds at most ``limit`` JSON values (counted as its commas and opening brackets
    outside strings). Counting every comma and bracket is a C-speed upper bound that settles most texts;
    the exact count skips strings, one Python step per token, so the event loop can interrupt it."""
    if text.count(",") + text.count("{") + text.count("[") <= limit:
        return True
    values = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group()[0] != '"':
            values += 1
            if values > limit:
                return False
    return True


def _varint(body: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(body) and shift < 64:
        byte = body[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
    raise DecodeError("a varint runs past the end of its message")


@functools.cache
def _message_fields(descriptor: Descriptor) -> dict[int, Descriptor]:
    return {field.number: field.message_type for field in descriptor.fields if field.message_type is not None}


def count_records(body: bytes, message: Descriptor, record: Descriptor, max_records: int) -> int:
    """How many ``record`` messages the serialized ``message`` holds, from its wire format alone (no
    object is built); ``OtlpError`` 413 beyond ``max_records`` records or ``MAX_FIELDS`` fields,
    ``DecodeError`` when it is not protobuf. Iterative: any depth walks in constant stack."""
    pending: list[tuple[int, int, Descriptor | None]] = [(0, len(body), message)]
    fields = records = 0
    size = len(body)
    while pending:
        at, end, descriptor = pending.pop()
        nested_of = _message_fields(descriptor) if descriptor is not None else {}
        while at < end:
            tag = body[at]  # one byte for every field number OTLP uses below 16
            at += 1
            if tag >= 0x80:
                tag, at = _varint(body, at - 1)
            fields += 1
            if fields > MAX_FIELDS:
                raise OtlpError(413, "payload_too_large", f"the body holds more than {MAX_FIELDS} protobuf "
                                "fields; export smaller batches")
            kind = tag & 7
            if kind == 2:
                length, at = (body[at], at + 1) if at < size and body[at] < 0x80 else _varint(body, at)
                if at + length > end:
                    raise DecodeError("a field runs past the end of its message")
                nested = nested_of.get(tag >> 3)
                if nested is record:
                    records += 1
                    if records > max_records:
                        raise _too_many(record, max_records)
                if nested is not None and length:
                    pending.append((at, at + length, nested))
                at += length
            elif kind == 0:
                _, at = _varint(body, at)
            elif kind in (1, 5):
                at += 8 if kind == 1 else 4
            else:
                raise DecodeError(f"wire type {kind} is not one OTLP uses")
        if at != end:
            raise DecodeError("a field runs past the end of its message")
    return records


def _too_many(record: Descriptor, limit: int) -> OtlpError:
    what = "spans" if record is Span.DESCRIPTOR else "log records"
    return OtlpError(413, "batch_too_large", f"the body holds more than {limit} {what} "
                     "(CLAWR1_OTLP_MAX_RECORDS); export smaller batches")


def decode(message: type[M], body: bytes, encoding: Encoding, record: Descriptor, max_records: int,
           count: Callable[[M], int]) -> M:
    """``body`` parsed as ``message`` (an export request), or ``OtlpError``: 400 with the parser's reason,
    413 past the limits (at most ``max_records`` ``record`` messages, see ``count_records``)."""
    parsed = message()
    kind = "OTLP/JSON" if encoding.json else "OTLP protobuf"
    try:
        if encoding.json:
            if not json_values_within(body.decode("utf-8", "replace"), MAX_JSON_VALUES):
                raise OtlpError(413, "payload_too_large", f"the body holds more than {MAX_JSON_VALUES} JSON "
                                "values; export smaller batches")
            document = load_json(body, "the OTLP/JSON body")  # as the API parses JSON: 200 levels at most
            if not isinstance(document, dict):
                raise OtlpError(400, "malformed_body", "an OTLP/JSON body is one JSON object")
            json_format.ParseDict(_hex_ids_to_base64(document), parsed, ignore_unknown_fields=True)
            if count(parsed) > max_records:
                raise _too_many(record, max_records)
        else:
            count_records(body, message.DESCRIPTOR, record, max_records)
            parsed.ParseFromString(body)
    except (ValueError, DecodeError, json_format.ParseError, RecursionError) as exc:
        if isinstance(exc, OtlpError):
            raise
        raise OtlpError(400, "malformed_body",
                        f"the body is not a valid {kind} {message.DESCRIPTOR.name}: {exc}") from exc
    return parsed


_MAX_RECORDS = OTLP_MAX_RECORDS.default


def _spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def _log_records(request: ExportLogsServiceRequest) -> int:
    return sum(len(scope.log_records) for resource in request.resource_logs for scope in resource.scope_logs)


def decode_traces(body: bytes, encoding: Encoding,
                  max_records: int = _MAX_RECORDS) -> ExportTraceServiceRequest:
    return decode(ExportTraceServiceRequest, body, encoding, Span.DESCRIPTOR, max_records, _spans)


def decode_logs(body: bytes, encoding: Encoding,
                max_records: int = _MAX_RECORDS) -> ExportLogsServiceRequest:
    return decode(ExportLogsServiceRequest, body, encoding, LogRecord.DESCRIPTOR, max_records, _log_records)


def answer(response_type: type[ExportTraceServiceResponse] | type[ExportLogsServiceResponse], warning: str,
           encoding: Encoding) -> bytes:
    """Everything accepted, in the request's encoding; ``warning`` (OTLP's partial success with nothing
    rejected) says what was ignored."""
    response = response_type()
    if warning:
        response.partial_success.error_message = warning
    if encoding.json:
        return json.dumps(json_format.MessageToDict(response)).encode()
    return response.SerializeToString()
