"""The one Avro codec for every Kafka message: each message names the schema it was written with.

Two framings, both standard:
- Avro single-object encoding (default, no registry needed): ``C3 01`` + the writer schema's
  CRC-64-AVRO fingerprint (8 bytes, little-endian) + the Avro body.
- Confluent wire format when ``CLAWR1_SCHEMA_REGISTRY_URL`` is set: ``00`` + 4-byte big-endian
  schema id from the registry + the Avro body; schemas are registered under ``dev.clawr1.<name>``
  with confluent-kafka's Schema Registry client (basic auth from the URL, TLS files from settings).
Readers look the writer schema up by fingerprint (or registry id) and resolve it to the current
reader schema, so consumers keep reading events written by older producers.
"""

from __future__ import annotations

import io
import json
import os
import ssl
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from clawr1.core.registry import SCHEMA_REGISTRY_CA_FILE, SCHEMA_REGISTRY_CERT_FILE, SCHEMA_REGISTRY_KEY_FILE
from clawr1.schemas.batch import batch_name, batch_schema, pack, plan_of, record_name_of, unpack
from clawr1.schemas.compiled import Reader, Writer, compile_reader, compile_writer, long_at, zigzag

SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY_DIR = SCHEMA_DIR / "history"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
REGISTRY_TIMEOUT_S = 10.0


class CodecError(ValueError):
    """Base of the codec's errors; the message says what was wrong with the data."""


class EncodeError(CodecError):
    pass


class DecodeError(CodecError):
    pass


@dataclass(frozen=True)
class SchemaVersion:
    name: str
    raw: dict[str, Any]
    parsed: Any
    fingerprint: bytes


def schema_names() -> list[str]:
    """The record schemas (``*.avsc``); each also has a derived envelope schema (``<name>_batch``)."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.avsc"))


def all_schema_names() -> list[str]:
    """Every schema a message may be written with: the records and their envelopes."""
    return sorted([*schema_names(), *(batch_name(n) for n in schema_names())])


def _version(name: str, raw: dict[str, Any]) -> SchemaVersion:
    # The write hint marks the result as parsed, so fastavro's reader and writer take it as it is
    # instead of parsing the schema again on every record (a quarter of a step's encode/decode).
    parsed = fastavro.parse_schema(raw, _force=True)
    canonical = to_parsing_canonical_form(raw)
    return SchemaVersion(name, raw, parsed, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))


@cache
def current_schema(name: str) -> SchemaVersion:
    record = record_name_of(name)
    if record is not None:
        return _version(name, batch_schema(current_schema(record).raw))
    path = SCHEMA_DIR / f"{name}.avsc"
    if not path.exists():
        raise CodecError(f"unknown schema {name!r}; known: {', '.join(all_schema_names())}")
    return _version(name, json.loads(path.read_text()))


def history_versions(name: str) -> list[SchemaVersion]:
    """Earlier released versions, kept so old messages stay readable (``history/<name>.v<N>.avsc``);
    an envelope's are derived from its record's."""
    record = record_name_of(name)
    if record is not None:
        return [_version(name, batch_schema(v.raw)) for v in history_versions(record)]
    paths = sorted(HISTORY_DIR.glob(f"{name}.v*.avsc"), key=lambda p: int(p.stem.rsplit(".v", 1)[1]))
    return [_version(name, json.loads(p.read_text())) for p in paths]


@cache
def _writer(name: str) -> Writer | None:
    return compile_writer(current_schema(name).raw)


@cache
def _reader(name: str) -> Reader | None:
    return compile_reader(current_schema(name).raw)


@cache
def _plan(name: str) -> Any:
    return plan_of(current_schema(name).raw)


def pack_record(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """A plain record of schema ``name`` in the packed form its envelope carries (``schemas/batch.py``)."""
    return pack(_plan(name), record)


def unpack_record(name: str, record: dict[str, Any], int_arrays: bool = False) -> dict[str, Any]:
    """A packed record of schema ``name`` back in its plain form (``batch.unpack``)."""
    return unpack(_plan(name), record, int_arrays)


@lru_cache(maxsize=1)
def _by_fingerprint() -> dict[bytes, SchemaVersion]:
    table: dict[bytes, SchemaVersion] = {}
    for name in all_schema_names():
        for version in [*history_versions(name), current_schema(name)]:
            table[version.fingerprint] = version
    return table


@lru_cache(maxsize=1)
def _record_names() -> dict[str, str]:
    """Avro record name (e.g. ``Step``) -> schema name (``step``): a registry knows only the former."""
    return {current_schema(name).raw["name"]: name for name in all_schema_names()}


def _name_of_record(record_name: str) -> str | None:
    return _record_names().get(record_name.rsplit(".", 1)[-1])


_TLS_FILES = ((SCHEMA_REGISTRY_CA_FILE, "ssl.ca.location"),
              (SCHEMA_REGISTRY_CERT_FILE, "ssl.certificate.location"),
              (SCHEMA_REGISTRY_KEY_FILE, "ssl.key.location"))


def registry_config(url: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` configuration: basic auth from the URL's user info (the
    client reads it there), TLS files from ``CLAWR1_SCHEMA_REGISTRY_{CA,CERT,KEY}_FILE``."""
    env = os.environ if environ is None else environ
    config: dict[str, Any] = {"url": url, "timeout": REGISTRY_TIMEOUT_S}
    for option, key in _TLS_FILES:
        value = option.read(env)
        if value and not Path(value).is_file():
            raise CodecError(f"{option.name}: no such file {value!r}")
        if value:
            config[key] = value
    return config


class SchemaRegistry:
    """The codec's view of a Confluent Schema Registry: ids of our schemas and our schemas of ids.

    HTTP, auth, TLS, retries and the id cache are confluent-kafka's ``SchemaRegistryClient``; this keeps
    the parsed writer schema per id, so a message costs no registry call and no schema parse after the
    first of its id."""

    def __init__(self, url: str, environ: Mapping[str, str] | None = None) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        try:
            self._client = SchemaRegistryClient(registry_config(url, environ))
        except (OSError, ssl.SSLError) as exc:
            names = ", ".join(option.name for option, _ in _TLS_FILES)
            raise CodecError(f"the schema registry's TLS files ({names}) cannot be loaded: {exc}") from exc
        self._ids: dict[tuple[str, bytes], int] = {}
        self._schemas: dict[int, SchemaVersion] = {}

    def register(self, subject: str, version: SchemaVersion) -> int:
        key = (subject, version.fingerprint)
        if key not in self._ids:
            from confluent_kafka.schema_registry import Schema

            schema_id = int(self._client.register_schema(subject, Schema(json.dumps(version.raw), "AVRO")))
            self._ids[key] = schema_id
            self._schemas[schema_id] = version
        return self._ids[key]

    def schema(self, schema_id: int) -> SchemaVersion:
        if schema_id not in self._schemas:
            from confluent_kafka.schema_registry import SchemaRegistryError

            try:
                raw = json.loads(self._client.get_schema(schema_id).schema_str)
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    raise DecodeError(f"schema id {schema_id} is not in the registry") from exc
                raise
            name = _name_of_record(str(raw.get("name", "")))
            if name is None:
                raise DecodeError(f"schema id {schema_id} is {raw.get('name')!r}, not a Claw-R1 schema")
            self._schemas[schema_id] = _version(name, raw)
        return self._schemas[schema_id]


class AvroCodec:
    """Encode records of a named schema; decode any known writer version into the current schema."""

    def __init__(self, registry_url: str = "", environ: Mapping[str, str] | None = None) -> None:
        self.registry = SchemaRegistry(registry_url, environ) if registry_url else None

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        version = current_schema(name)
        body = io.BytesIO()
        if self.registry is not None:
            schema_id = self.registry.register(f"dev.clawr1.{name}", version)
            body.write(CONFLUENT_MAGIC + struct.pack(">I", schema_id))
        else:
            body.write(SINGLE_OBJECT_MAGIC + version.fingerprint)
        writer = _writer(name)
        if writer is not None:
            try:
                return body.getvalue() + writer(record)
            except Exception:  # noqa: BLE001, S110 - fastavro then writes it, or says why it cannot
                pass
        try:
            fastavro.schemaless_writer(body, version.parsed, record, strict_allow_default=True)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise EncodeError(f"record does not match schema {name!r}: {exc}") from exc
        return body.getvalue()

    def writer_of(self, data: bytes) -> SchemaVersion:
        if data[:2] == SINGLE_OBJECT_MAGIC and len(data) >= 10:
            version = _by_fingerprint().get(data[2:10])
            if version is None:
                raise DecodeError(f"unknown writer schema fingerprint {data[2:10].hex()}")
            return version
        if data[:1] == CONFLUENT_MAGIC and len(data) >= 5:
            if self.registry is None:
                raise DecodeError("Confluent-framed message but no schema registry is configured")
            return self.registry.schema(struct.unpack(">I", data[1:5])[0])
        raise DecodeError("not an Avro single-object or Confluent-framed message")

    def decode(self, data: bytes | None, expect: str | None = None) -> tuple[str, dict[str, Any]]:
        """Returns (schema name, record in the current reader schema). No bytes (a message without a
        value) is a DecodeError, as a corrupt body is."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        writer = self.writer_of(data)
        if expect is not None and writer.name != expect:
            raise DecodeError(f"expected a {expect!r} message, got {writer.name!r}")
        reader = current_schema(writer.name)
        offset = _body_start(data)
        compiled = _reader(writer.name) if reader.fingerprint == writer.fingerprint else None
        if compiled is not None:
            try:
                return writer.name, compiled(data, offset)
            except Exception:  # noqa: BLE001, S110 - fastavro then reads it, or says why it cannot
                pass
        try:
            record = fastavro.schemaless_reader(
                io.BytesIO(data[offset:]),
                writer.parsed,
                None if reader.fingerprint == writer.fingerprint else reader.parsed,
            )
        except Exception as exc:  # noqa: BLE001 - fastavro raises many types on corrupt bodies
            raise DecodeError(f"corrupt {writer.name!r} body: {exc}") from exc
        return writer.name, record  # type: ignore[return-value]

    def decode_records(self, data: bytes | None, expect: str, plain: bool = True,
                       int_arrays: bool = False) -> list[dict[str, Any]]:
        """The records of a message written as one ``expect`` record or as its envelope (``<expect>_batch``),
        plain (token arrays as lists; with ``int_arrays``, an envelope's int arrays as int32 numpy arrays)
        or, with ``plain=False``, as they came. A packed array of impossible size is a DecodeError."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        name = self.writer_of(bytes(data)).name
        if name not in (expect, batch_name(expect)):
            raise DecodeError(f"expected a {expect!r} message, got {name!r} (nor an envelope of {expect!r})")
        _, record = self.decode(data)
        if name == expect:
            return [record]
        if not plain:
            return record["records"]
        try:
            return [unpack_record(expect, r, int_arrays) for r in record["records"]]
        except ValueError as exc:
            raise DecodeError(f"corrupt {name!r} body: a packed array: {exc}") from exc

    def decode_all(self, data: bytes | None) -> tuple[str, list[dict[str, Any]]]:
        """(record schema name, its plain records) of a message written as one record or an envelope."""
        name, record = self.decode(data)
        base = record_name_of(name)
        if base is None:
            return name, [record]
        return base, [unpack_record(base, r) for r in record["records"]]

    def encode_batch(self, name: str, packed_records: list[dict[str, Any]]) -> bytes:
        """One envelope message of ``name`` records, given in their packed form (``batch.pack_record``)."""
        return self.encode(batch_name(name), {"records": packed_records})

    def join_batches(self, name: str, values: Sequence[bytes]) -> bytes | None:
        """Envelopes of ``name`` records as one, without decoding them; None when that cannot be done.

        An envelope's body is its one field, the records' array: a count, the records, a closing 0. So
        envelopes written with one schema version (the same header) join as the header, the summed
        count, every envelope's record bytes and one 0. Only for envelopes this codec wrote: it writes an
        array as one block with a positive count, and the join cannot see a second block that another
        writer may have used (the records would be miscounted). What it can see (a negative count, a
        header that differs, another schema) returns None, and the caller decodes and encodes."""
        if not values:
            return None
        first = values[0]
        header = _body_start(first)
        try:
            if self.writer_of(first).name != batch_name(name):
                return None
        except DecodeError:
            return None
        count, parts = 0, []
        for value in values:
            if value[:header] != first[:header] or value[-1:] != b"\x00":
                return None
            try:
                n, start = long_at(value, header)
            except (IndexError, ValueError):
                return None
            if n <= 0 or start >= len(value):
                return None
            count += n
            parts.append(memoryview(value)[start:-1])
        return b"".join([first[:header], zigzag(count), *parts, b"\x00"])


def _body_start(data: bytes) -> int:
    """Where a framed message's Avro body starts: after the single-object header (magic and the
    fingerprint) or the Confluent one (magic and the schema id)."""
    return 10 if data[:2] == SINGLE_OBJECT_MAGIC else 5


@lru_cache(maxsize=4)
def codec_for(registry_url: str = "") -> AvroCodec:
    return AvroCodec(registry_url)
