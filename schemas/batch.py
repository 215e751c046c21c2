"""Batch envelopes: many records of one schema in one Kafka message, with token arrays packed.

Kafka moves record batches; a message per step made every step pay the framework, the broker and the
codec once. An envelope carries the records a producer has for one partition at once, and its schema
is *derived* from the record's own schema by one rule, so the ``.avsc`` files stay the one source of
truth and every released record version has a readable envelope version too:

- every ``array<int>`` becomes ``bytes`` holding the same numbers as little-endian int32, and every
  ``array<double>`` ``bytes`` of little-endian float64 (also inside unions and nested records): the
  codec then reads and writes an array as one block instead of element by element (a 640-token step
  took ~70 µs each way as Avro arrays, ~10 µs packed);
- record names get ``Packed`` appended, and the envelope is ``<Name>Batch {records: [<Name>Packed]}``;
  its schema name is ``<name>_batch``.

``clawr1.schemas.codec.pack_record`` / ``unpack_record`` turn a record between its plain and packed forms
by the same rule; ``AvroCodec.decode_records`` reads a message's records whichever form it was written in.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH_SUFFIX = "_batch"
_INTS = "int32"
_DOUBLES = "float64"
_LITTLE_ENDIAN = sys.byteorder == "little"
_INT32 = np.iinfo(np.int32)


def batch_name(name: str) -> str:
    return name + BATCH_SUFFIX


def record_name_of(name: str) -> str | None:
    """The record schema a batch schema name wraps (``step_batch`` -> ``step``), else None."""
    return name[: -len(BATCH_SUFFIX)] if name.endswith(BATCH_SUFFIX) else None


# ------------------------------------------------------------------ schemas


def _packed_type(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_packed_type(branch) for branch in schema]
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "array" and schema.get("items") == "int":
            return {"type": "bytes", "doc": "packed: little-endian int32"}
        if kind == "array" and schema.get("items") == "double":
            return {"type": "bytes", "doc": "packed: little-endian float64"}
        if kind == "array":
            return {**schema, "items": _packed_type(schema["items"])}
        if kind == "map":
            return {**schema, "values": _packed_type(schema["values"])}
        if kind == "record":
            return _packed_record(schema)
    return schema


def _packed_default(field_type: Any, default: Any) -> Any:
    """Avro writes a bytes default as a string; an array default of [] becomes ""."""
    if isinstance(default, list) and _array_kind(field_type) is not None:
        return ""
    return default


def _packed_record(schema: dict[str, Any]) -> dict[str, Any]:
    fields = []
    for field in schema["fields"]:
        packed = {**field, "type": _packed_type(field["type"])}
        if "default" in field:
            packed["default"] = _packed_default(field["type"], field["default"])
        fields.append(packed)
    return {**schema, "name": schema["name"] + "Packed", "fields": fields}


def batch_schema(record: dict[str, Any]) -> dict[str, Any]:
    """The envelope schema of a record schema (see the module doc)."""
    packed = _packed_record(record)
    envelope: dict[str, Any] = {
        "type": "record",
        "name": record["name"] + "Batch",
        "doc": f"Many {record['name']} records in one message, token arrays packed (schemas/batch.py).",
        "fields": [{"name": "records", "type": {"type": "array", "items": packed}}],
    }
    if "namespace" in record:
        envelope["namespace"] = record["namespace"]
    return envelope


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class _Plan:
    """Which fields of a record the rule packs: ``kind`` per array field, nested plans per record."""

    arrays: tuple[tuple[str, str], ...]
    nested: tuple[tuple[str, bool, _Plan], ...]  # (field, is a list of records, plan)


def _array_kind(schema: Any) -> str | None:
    for branch in schema if isinstance(schema, list) else [schema]:
        if isinstance(branch, dict) and branch.get("type") == "array" \
                and branch.get("items") in ("int", "double"):
            return _INTS if branch["items"] == "int" else _DOUBLES
    return None


def _nested_record(schema: Any) -> tuple[bool, dict[str, Any]] | None:
    for branch in schema if isinstance(schema, list) else [schema]:
        if isinstance(branch, dict) and branch.get("type") == "record":
            return False, branch
        if isinstance(branch, dict) and branch.get("type") == "array" and isinstance(branch["items"], dict) \
                and branch["items"].get("type") == "record":
            return True, branch["items"]
    return None


def plan_of(record: dict[str, Any]) -> _Plan:
    """Which fields of records of this (plain) schema the rule packs."""
    return _plan(record)


def _plan(record: dict[str, Any]) -> _Plan:
    arrays, nested = [], []
    for field in record["fields"]:
        kind = _array_kind(field["type"])
        if kind is not None:
            arrays.append((field["name"], kind))
            continue
        inner = _nested_record(field["type"])
        if inner is not None:
            nested.append((field["name"], inner[0], _plan(inner[1])))
    return _Plan(tuple(arrays), tuple(nested))


def _pack(values: Sequence[Any] | Any, code: str) -> bytes:
    if isinstance(values, np.ndarray) and values.ndim == 1 and code == "i" and _fits_int32(values):
        return values.astype("<i4").tobytes()  # the worker's ids, kept as arrays: one copy, no Python ints
    # ``struct`` packs a list about 3x faster than ``array`` (the worker packs every step's token ids);
    # whatever it refuses goes through ``array``, which packs it or raises as it always did.
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except (struct.error, TypeError):
        packed = array.array(code, values)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _fits_int32(values: np.ndarray) -> bool:
    if values.dtype.kind not in "iu":
        return False
    if np.can_cast(values.dtype, np.int32):  # by its type alone: a decoded envelope's ids
        return True
    return values.size == 0 or bool(_INT32.min <= values.min() and values.max() <= _INT32.max)


def pack_ints(values: Sequence[int] | Any) -> bytes:
    return _pack(values, "i")


def pack_doubles(values: Sequence[float] | Any) -> bytes:
    return _pack(values, "d")


def _unpack(data: bytes, code: str) -> list[Any]:
    values = array.array(code)
    values.frombytes(data)
    if not _LITTLE_ENDIAN:
        values.byteswap()
    return values.tolist()


def unpack_ints(data: bytes) -> list[int]:
    return _unpack(data, "i")


def unpack_doubles(data: bytes) -> list[float]:
    return _unpack(data, "d")


def unpack_int_array(data: bytes) -> np.ndarray:
    """Packed int32 ids as a read-only int32 array over ``data``: no Python int per token (the worker)."""
    return np.frombuffer(data, dtype="<i4").astype(np.int32, copy=False)


def _apply(plan: _Plan, record: dict[str, Any], pack: bool, int_arrays: bool = False) -> dict[str, Any]:
    out = dict(record)
    for field, kind in plan.arrays:
        value = out.get(field)
        if value is None:
            continue
        if pack:
            out[field] = pack_ints(value) if kind == _INTS else pack_doubles(value)
        elif kind == _INTS:
            out[field] = unpack_int_array(value) if int_arrays else unpack_ints(value)
        else:
            out[field] = unpack_doubles(value)
    for field, many, inner in plan.nested:
        value = out.get(field)
        if value is None:
            continue
        out[field] = [_apply(inner, v, pack, int_arrays) for v in value] if many \
            else _apply(inner, value, pack, int_arrays)
    return out


def pack(plan: _Plan, record: dict[str, Any]) -> dict[str, Any]:
    """The packed form of a record (a new dict; arrays, as lists or as int numpy arrays, become bytes)."""
    return _apply(plan, record, pack=True)


def unpack(plan: _Plan, record: dict[str, Any], int_arrays: bool = False) -> dict[str, Any]:
    """The plain form of a packed record (a new dict; bytes become lists, or, with ``int_arrays``, int
    arrays become int32 numpy arrays: see ``unpack_int_array``)."""
    return _apply(plan, record, pack=False, int_arrays=int_arrays)
