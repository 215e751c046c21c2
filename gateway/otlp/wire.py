"""OTLP/HTTP bodies in and out: protobuf or JSON, optionally gzip-compressed, decoded by the official
``opentelemetry-proto`` classes (never by hand), and the ``Export*ServiceResponse`` answered in kind.

OTLP/JSON differs from protobuf's canonical JSON mapping in one place: trace and span ids are hex
strings, not base64. They are rewritten to base64 before ``json_format`` parses the body; unknown fields
are ignored, as the OTLP specification asks of receivers.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# Decompressed bodies may be this many times the request size limit (a gzip bomb is refused, not inflated).
INFLATE_FACTOR = 16
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


def decode(message: type[M], body: bytes, encoding: Encoding) -> M:
    """``body`` parsed as ``message`` (an export request), or ``OtlpError`` 400 with the parser's reason."""
    parsed = message()
    try:
        if encoding.json:
            document = json.loads(body)
            if not isinstance(document, dict):
                raise OtlpError(400, "malformed_body", "an OTLP/JSON body is one JSON object")
            json_format.ParseDict(_hex_ids_to_base64(document), parsed, ignore_unknown_fields=True)
        else:
            parsed.ParseFromString(body)
    except (ValueError, DecodeError, json_format.ParseError, RecursionError) as exc:
        if isinstance(exc, OtlpError):
            raise
        kind = "OTLP/JSON" if encoding.json else "OTLP protobuf"
        raise OtlpError(400, "malformed_body",
                        f"the body is not a valid {kind} {message.DESCRIPTOR.name}: {exc}") from exc
    return parsed


def decode_traces(body: bytes, encoding: Encoding) -> ExportTraceServiceRequest:
    return decode(ExportTraceServiceRequest, body, encoding)


def decode_logs(body: bytes, encoding: Encoding) -> ExportLogsServiceRequest:
    return decode(ExportLogsServiceRequest, body, encoding)


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
