"""Avro binary writers and readers generated from a schema: fastavro's bytes and records, in less time.

fastavro interprets the parsed schema for every datum (~0.6 us a field: 29 us to write a packed step's
47 fields, as long to read them), and on the hot path every step is written twice (the gateway's
envelope, the worker's output) and read twice (by the worker, by the sink). A writer or reader
compiled here is straight-line Python for one schema, field by field, so only the encoding itself is
left (12 us to write the same step).

Neither ever decides anything fastavro would decide otherwise: ``AvroCodec`` takes their result only
when they complete and hands the datum to fastavro on any exception, so what they do not take as it is
gets fastavro's answer or fastavro's error:
- writing: a missing field with a default, an extra field, a float for a long, a long out of range, a
  datum of the wrong type;
- reading: a truncated or corrupt body, a block with a negative count (other writers' form), invalid
  UTF-8, a boolean byte other than 0 or 1; and any body written with another schema version (the
  codec only compiles a reader for a body of the current version, which needs no resolution).

Only the types our schemas use are compiled (records, unions of null and one type, arrays, maps,
strings, bytes, int, long, double, boolean); a schema with any other is not (None) and fastavro
handles it. ``tests/unit/schemas/test_schemas_compiled.py`` compares both with fastavro on every schema.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

Writer = Callable[[Any], bytes]
Reader = Callable[[bytes, int], Any]  # (data, where the body starts) -> the datum

_BYTE = [bytes([n]) for n in range(128)]
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE = struct.Struct("<d")
_PRIMITIVES = ("null", "boolean", "int", "long", "double", "string", "bytes")


def zigzag(n: int) -> bytes:
    """An Avro int or long: zigzag, then a little-endian base-128 varint."""
    z = (n << 1) ^ (n >> 63)
    if 0 <= z < 0x80:
        return _BYTE[z]
    n = int(n)  # a numpy integer wraps above; Python ints do not
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} is out of a long's range")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def long_at(data: bytes, pos: int) -> tuple[int, int]:
    """(the long at ``pos``, the position after it)."""
    z, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        z |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than a long")


class Unsupported(Exception):
    """A type this module does not compile: fastavro handles the schema."""


class _Source(ABC):
    """A function's source, built by walking the schema once; subclasses say what each type's lines do."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names = 0
        self.records: dict[str, dict[str, Any]] = {}

    def name(self) -> str:
        self.names += 1
        return f"v{self.names}"

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def datum(self, schema: Any, value: str, depth: int) -> None:
        if isinstance(schema, list):
            if len(schema) != 2 or "null" not in schema:
                raise Unsupported(f"union {schema!r}")
            self.union(schema.index("null"), schema[1 - schema.index("null")], value, depth)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if "logicalType" in schema:
                raise Unsupported(f"logical type {schema['logicalType']!r}")
            if kind == "record":
                for name in (schema["name"], f"{schema.get('namespace')}.{schema['name']}"):
                    self.records[name] = schema
                self.record(schema, value, depth)
            elif kind in ("array", "map"):
                self.blocks(schema, value, depth)
            elif kind in _PRIMITIVES:
                self.datum(kind, value, depth)
            else:
                raise Unsupported(repr(kind))
        elif schema in self.records:
            self.record(self.records[schema], value, depth)
        elif schema in _PRIMITIVES:
            self.primitive(schema, value, depth)
        else:
            raise Unsupported(repr(schema))

    @abstractmethod
    def union(self, null: int, other: Any, value: str, depth: int) -> None:
        """Lines for this kind of type."""

    @abstractmethod
    def record(self, schema: dict[str, Any], value: str, depth: int) -> None:
        """Lines for this kind of type."""

    @abstractmethod
    def blocks(self, schema: dict[str, Any], value: str, depth: int) -> None:
        """Lines for this kind of type."""

    @abstractmethod
    def primitive(self, schema: str, value: str, depth: int) -> None:
        """Lines for this kind of type."""


class _WriterSource(_Source):
    """Lines that append the encoding of the datum ``value`` (an expression) to ``out`` (by ``w``)."""

    def primitive(self, schema: str, value: str, depth: int) -> None:
        if schema == "null":
            self.line(depth, f"if {value} is not None: raise TypeError('null expected')")
        elif schema == "boolean":
            self.line(depth, f"w(_BYTE[1] if {value} else _BYTE[0])")
        elif schema in ("int", "long"):
            self.line(depth, f"w(_zigzag({value}))")
        elif schema == "double":
            self.line(depth, f"w(_pack_double({value}))")
        else:
            data = self.name()
            if schema == "string":
                self.line(depth, f"{data} = {value}.encode()")
            else:  # bytes only: the length must count bytes, not a buffer's items
                self.line(depth, f"{data} = {value}")
                self.line(depth, f"if type({data}) is not bytes: raise TypeError('bytes expected')")
            self.line(depth, f"w(_zigzag(len({data})))")
            self.line(depth, f"w({data})")

    def union(self, null: int, other: Any, value: str, depth: int) -> None:
        datum = self.name()
        self.line(depth, f"{datum} = {value}")
        self.line(depth, f"if {datum} is None:")
        self.line(depth + 1, f"w(_BYTE[{null * 2}])")
        self.line(depth, "else:")
        self.line(depth + 1, f"w(_BYTE[{(1 - null) * 2}])")
        self.datum(other, datum, depth + 1)

    def record(self, schema: dict[str, Any], value: str, depth: int) -> None:
        datum = self.name()
        self.line(depth, f"{datum} = {value}")
        # Exactly the schema's fields, or fastavro decides (defaults, extra fields).
        self.line(depth, f"if len({datum}) != {len(schema['fields'])}: raise KeyError('fields')")
        for field in schema["fields"]:
            self.datum(field["type"], f"{datum}[{field['name']!r}]", depth)

    def blocks(self, schema: dict[str, Any], value: str, depth: int) -> None:
        """An array or a map: one block of all its items, then the empty block."""
        datum, item = self.name(), self.name()
        self.line(depth, f"{datum} = {value}")
        self.line(depth, f"if len({datum}): w(_zigzag(len({datum})))")
        if schema["type"] == "array":
            self.line(depth, f"for {item} in {datum}:")
            self.datum(schema["items"], item, depth + 1)
        else:
            key = self.name()
            self.line(depth, f"for {key}, {item} in {datum}.items():")
            self.primitive("string", key, depth + 1)
            self.datum(schema["values"], item, depth + 1)
        self.line(depth, "w(_BYTE[0])")


class _ReaderSource(_Source):
    """Lines that read a datum of the schema at ``pos`` in ``data`` into the name ``value``."""

    def long(self, value: str, depth: int) -> None:
        self.line(depth, "b = data[pos]")
        self.line(depth, "if b < 0x80:")
        self.line(depth + 1, f"{value} = (b >> 1) ^ -(b & 1)")
        self.line(depth + 1, "pos += 1")
        self.line(depth, "else:")
        self.line(depth + 1, f"{value}, pos = _long_at(data, pos)")

    def primitive(self, schema: str, value: str, depth: int) -> None:
        if schema == "null":
            self.line(depth, f"{value} = None")
        elif schema == "boolean":
            self.line(depth, f"{value} = _BOOLEAN[data[pos]]")
            self.line(depth, "pos += 1")
        elif schema in ("int", "long"):
            self.long(value, depth)
        elif schema == "double":
            self.line(depth, f"{value} = _unpack_double(data, pos)[0]")
            self.line(depth, "pos += 8")
        else:
            size = self.name()
            self.long(size, depth)
            self.line(depth, f"if {size} < 0 or pos + {size} > len(data): raise ValueError('truncated')")
            decode = ".decode()" if schema == "string" else ""
            self.line(depth, f"{value} = data[pos:pos + {size}]{decode}")
            self.line(depth, f"pos += {size}")

    def union(self, null: int, other: Any, value: str, depth: int) -> None:
        branch = self.name()
        self.long(branch, depth)
        self.line(depth, f"if {branch} == {null}:")
        self.line(depth + 1, f"{value} = None")
        self.line(depth, f"elif {branch} == {1 - null}:")
        self.datum(other, value, depth + 1)
        self.line(depth, "else:")
        self.line(depth + 1, "raise ValueError('no such union branch')")

    def record(self, schema: dict[str, Any], value: str, depth: int) -> None:
        fields = []
        for field in schema["fields"]:
            name = self.name()
            self.datum(field["type"], name, depth)
            fields.append(f"{field['name']!r}: {name}")
        self.line(depth, f"{value} = {{{', '.join(fields)}}}")

    def blocks(self, schema: dict[str, Any], value: str, depth: int) -> None:
        """An array or a map of blocks with positive counts, up to the empty block."""
        count, item = self.name(), self.name()
        self.line(depth, f"{value} = {'[]' if schema['type'] == 'array' else '{}'}")
        self.line(depth, "while True:")
        self.long(count, depth + 1)
        self.line(depth + 1, f"if {count} <= 0:")
        self.line(depth + 2, f"if {count}: raise ValueError('a block with its size')")
        self.line(depth + 2, "break")
        self.line(depth + 1, f"for _ in range({count}):")
        if schema["type"] == "array":
            self.datum(schema["items"], item, depth + 2)
            self.line(depth + 2, f"{value}.append({item})")
        else:
            key = self.name()
            self.primitive("string", key, depth + 2)
            self.datum(schema["values"], item, depth + 2)
            self.line(depth + 2, f"{value}[{key}] = {item}")


def writer_source(schema: dict[str, Any]) -> str:
    """The Python source of ``schema``'s writer (``write(datum) -> bytes``)."""
    source = _WriterSource()
    source.line(0, "def write(datum):")
    source.line(1, "out = []")
    source.line(1, "w = out.append")
    source.datum(schema, "datum", 1)
    source.line(1, "return b''.join(out)")
    return "\n".join(source.lines)


def reader_source(schema: dict[str, Any]) -> str:
    """The Python source of ``schema``'s reader (``read(data, pos) -> datum``)."""
    source = _ReaderSource()
    source.line(0, "def read(data, pos):")
    source.datum(schema, "datum", 1)
    source.line(1, "if pos > len(data): raise ValueError('truncated')")
    source.line(1, "return datum")
    return "\n".join(source.lines)


def _compiled(make_source: Callable[[dict[str, Any]], str], schema: dict[str, Any], name: str) -> Any:
    try:
        source = make_source(schema)
    except Unsupported:
        return None
    scope: dict[str, Any] = {"_zigzag": zigzag, "_long_at": long_at, "_BYTE": _BYTE,
                             "_BOOLEAN": {0: False, 1: True}, "_pack_double": _DOUBLE.pack,
                             "_unpack_double": _DOUBLE.unpack_from}
    exec(compile(source, f"<avro {name} of {schema.get('name')}>", "exec"), scope)  # noqa: S102
    return scope[name]


def compile_writer(schema: dict[str, Any]) -> Writer | None:
    """``schema``'s writer, or None when it uses a type this module does not compile."""
    writer: Writer | None = _compiled(writer_source, schema, "write")
    return writer


def compile_reader(schema: dict[str, Any]) -> Reader | None:
    """``schema``'s reader (for bodies written with ``schema`` itself), or None as ``compile_writer``."""
    reader: Reader | None = _compiled(reader_source, schema, "read")
    return reader
