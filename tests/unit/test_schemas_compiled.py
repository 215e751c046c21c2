"""The compiled Avro writers and readers give fastavro's bytes and records, and the codec falls back to
fastavro for whatever they do not take as it is."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawr1.schemas.codec import SINGLE_OBJECT_MAGIC, AvroCodec, EncodeError, all_schema_names, current_schema
from clawr1.schemas.compiled import compile_reader, compile_writer, reader_source, writer_source

SCHEMAS = all_schema_names()


def datum(schema: Any, records: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """Valid data of an Avro schema (the types our schemas use)."""
    records = {} if records is None else records
    if isinstance(schema, list):
        return st.one_of(*(datum(branch, records) for branch in schema))
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            records[schema["name"]] = schema
            return st.fixed_dictionaries({f["name"]: datum(f["type"], records) for f in schema["fields"]})
        if kind == "array":
            return st.lists(datum(schema["items"], records), max_size=4)
        if kind == "map":
            return st.dictionaries(st.text(max_size=6), datum(schema["values"], records), max_size=3)
        return datum(kind, records)
    if schema in records:
        return datum(records[schema], records)
    return {
        "null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1), "double": st.floats(), "string": st.text(max_size=8),
        "bytes": st.binary(max_size=16),
    }[schema]


def fastavro_bytes(name: str, record: Any) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, current_schema(name).parsed, record, strict_allow_default=True)
    return body.getvalue()


def fastavro_record(name: str, body: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(body), current_schema(name).parsed, None)


def outcome(read: Any) -> str:
    """A read's record (as its repr: types, key order and NaNs compare too) or its error's name."""
    try:
        return repr(read())
    except Exception as exc:  # noqa: BLE001 - which error is part of the outcome
        return f"error {type(exc).__name__}"


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_schema_is_compiled(name: str) -> None:
    schema = current_schema(name).raw
    assert compile_writer(schema) is not None, writer_source(schema)
    assert compile_reader(schema) is not None, reader_source(schema)


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_writer_writes_fastavros_bytes(name: str, data: st.DataObject) -> None:
    record = data.draw(datum(current_schema(name).raw))
    writer = compile_writer(current_schema(name).raw)
    assert writer is not None
    assert writer(record) == fastavro_bytes(name, record)


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_reader_reads_fastavros_records(name: str, data: st.DataObject) -> None:
    body = fastavro_bytes(name, data.draw(datum(current_schema(name).raw)))
    reader = compile_reader(current_schema(name).raw)
    assert reader is not None
    assert outcome(lambda: reader(b"xx" + body, 2)) == outcome(lambda: fastavro_record(name, body))


@pytest.mark.parametrize("name", ["step_batch", "whitebox_step_batch", "feedback", "prefix_node_batch"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_body_reads_as_fastavro_reads_it(name: str, data: st.DataObject) -> None:
    """Cut short or with a byte changed, a body decodes to fastavro's record or fails as fastavro does."""
    body = fastavro_bytes(name, data.draw(datum(current_schema(name).raw)))
    cut = data.draw(st.integers(0, len(body)))
    at, byte = data.draw(st.integers(0, max(len(body) - 1, 0))), data.draw(st.integers(0, 255))
    damaged = [body[:cut], body[:at] + bytes([byte]) + body[at + 1:]]
    for bad in damaged:
        framed = SINGLE_OBJECT_MAGIC + current_schema(name).fingerprint + bad
        codec = outcome(lambda f=framed: AvroCodec().decode(f)[1])
        expected = outcome(lambda b=bad: fastavro_record(name, b))
        assert codec == expected or (codec == "error DecodeError" and expected.startswith("error "))


def feedback() -> dict[str, Any]:
    return {"feedback_id": "f1", "target_kind": "step", "target_id": "s1", "reward": 0.5,
            "components": {"a": 1.0}, "final": True, "source": "human", "source_name": "", "label": None,
            "comment": None, "correction": None, "received_at_ms": 1_760_000_000_000, "terminal": False,
            "privileged": False}


def as_fastavro(codec: AvroCodec, name: str, record: Any) -> bytes | str:
    """What the codec gives: the body after the framing, or its error's type."""
    try:
        return codec.encode(name, record)[10:]
    except EncodeError as exc:
        return type(exc.__cause__).__name__


@pytest.mark.parametrize(("change", "outcome"), [
    (lambda r: r.pop("comment"), "bytes"),  # a missing field with a default: fastavro writes the default
    (lambda r: r.update(extra=1), "ValueError"),  # an extra field: fastavro refuses it
    (lambda r: r.update(received_at_ms=1.76e12), "bytes"),  # a float for a long: fastavro takes it
    (lambda r: r.update(received_at_ms=2**63), "error"),  # out of a long's range
    (lambda r: r.update(received_at_ms=np.int64(2**62)), "bytes"),  # numpy ints wrap in the fast path
    (lambda r: r.update(comment=b"bytes"), "error"),  # bytes for a string
])
def test_records_the_compiled_writer_does_not_take_as_they_are_get_fastavros_answer(change: Any,
                                                                                      outcome: str) -> None:
    record = feedback()
    assert set(record) == {f["name"] for f in current_schema("feedback").raw["fields"]}
    change(record)
    got = as_fastavro(AvroCodec(), "feedback", record)
    try:
        expected: bytes | str = fastavro_bytes("feedback", record)
    except Exception as exc:  # noqa: BLE001 - whichever error fastavro raises is the expected one
        expected = type(exc).__name__
    assert got == expected
    assert isinstance(got, bytes) == (outcome == "bytes")
