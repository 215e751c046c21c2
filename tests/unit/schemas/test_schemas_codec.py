"""Every schema round-trips through the codec, and schema evolution stays backward compatible."""

from __future__ import annotations

import array
import copy
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import fastavro
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from avro.schema import parse as parse_avro
from confluent_kafka.schema_registry import SchemaRegistryError

from clawr1.schemas.batch import batch_schema, pack_doubles, pack_ints, record_name_of, unpack_ints
from clawr1.schemas.codec import (
    SCHEMA_DIR,
    AvroCodec,
    CodecError,
    DecodeError,
    EncodeError,
    all_schema_names,
    current_schema,
    history_versions,
    pack_record,
    registry_config,
    schema_names,
)
from tests.support.schema_registry import RegistryStub

EXPECTED = {
    "raw_llm_call",
    "whitebox_step",
    "service_event",
    "feedback",
    "step",
    "prefix_node",
    "dead_letter",
}


def _example(schema: Any, names: dict[str, Any]) -> Any:
    """A record with a non-default value in every field, so the round trip checks each one."""
    if isinstance(schema, list):
        non_null = [s for s in schema if s != "null"]
        return _example(non_null[0], names) if non_null else None
    if isinstance(schema, str):
        if schema in names:
            return _example(names[schema], names)
        return {
            "string": "x-é",
            "bytes": b"\x00\xff",
            "int": 7,
            "long": 1_700_000_000_123,
            "double": 0.25,
            "float": 0.5,
            "boolean": True,
            "null": None,
        }[schema]
    kind = schema["type"]
    if kind == "record":
        names[schema["name"]] = schema
        return {f["name"]: _example(f["type"], names) for f in schema["fields"]}
    if kind == "array":
        return [_example(schema["items"], names), _example(schema["items"], names)]
    if kind == "map":
        return {"k": _example(schema["values"], names)}
    if kind == "enum":
        return schema["symbols"][-1]
    return _example(kind, names)


def test_every_event_kind_has_a_schema() -> None:
    assert set(schema_names()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_round_trip(name: str) -> None:
    codec = AvroCodec()
    record = _example(current_schema(name).raw, {})
    data = codec.encode(name, record)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == current_schema(name).fingerprint
    decoded_name, decoded = codec.decode(data)
    assert decoded_name == name
    assert decoded == record


def test_encode_rejects_a_record_missing_a_required_field() -> None:
    with pytest.raises(EncodeError, match="whitebox_step"):
        AvroCodec().encode("whitebox_step", {"step_id": "s"})


@pytest.mark.parametrize(
    "data", [b"", b"garbage", b"\xc3\x01" + b"\x00" * 8 + b"body", b"\x00\x00\x00\x00\x01x"]
)
def test_decode_rejects_unknown_or_malformed_bytes(data: bytes) -> None:
    with pytest.raises(DecodeError):
        AvroCodec().decode(data)


def test_decode_rejects_truncated_body() -> None:
    codec = AvroCodec()
    data = codec.encode("feedback", _example(current_schema("feedback").raw, {}))
    with pytest.raises(DecodeError, match="corrupt"):
        codec.decode(data[:14])


def test_decode_checks_the_expected_kind() -> None:
    codec = AvroCodec()
    data = codec.encode("feedback", _example(current_schema("feedback").raw, {}))
    with pytest.raises(DecodeError, match="expected a 'step'"):
        codec.decode(data, expect="step")


def _committed_versions(name: str) -> list[dict[str, Any]]:
    """The schema as committed at HEAD (when this is a git checkout) and every released history version;
    an envelope's are derived from its record's, as the codec derives them."""
    record = record_name_of(name)
    if record is not None:
        return [batch_schema(raw) for raw in _committed_versions(record)]
    versions = [v.raw for v in history_versions(name)]
    path = Path("schemas") / f"{name}.avsc"
    shown = subprocess.run(
        ["git", "show", f"HEAD:{path}"], cwd=SCHEMA_DIR.parent, capture_output=True, text=True, check=False
    )
    if shown.returncode == 0:
        versions.append(json.loads(shown.stdout))
    return versions


def incompatibilities(writer: dict[str, Any], reader: dict[str, Any]) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader``, by Apache Avro's own schema
    resolution check (as Karapace runs it); empty when it can."""
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        parse_avro(json.dumps(reader)), parse_avro(json.dumps(writer))
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    return [f"at {', '.join(sorted(result.locations))}: {message}" for message in sorted(result.messages)]


def test_packed_arrays_are_little_endian_and_refuse_what_arrays_refuse() -> None:
    ids = [0, 1, 2**31 - 1, -(2**31), 151_935]
    assert pack_ints(ids) == array.array("i", ids).tobytes() and unpack_ints(pack_ints(ids)) == ids
    assert pack_ints(iter(ids)) == pack_ints(tuple(ids)) == pack_ints(ids)  # any iterable, as before
    assert pack_doubles([1, -0.5]) == array.array("d", [1.0, -0.5]).tobytes()
    with pytest.raises(OverflowError):
        pack_ints([2**31])
    with pytest.raises(TypeError):
        pack_ints([1.5])


@pytest.mark.parametrize("name", all_schema_names())
def test_current_schema_reads_every_committed_version(name: str) -> None:
    current = current_schema(name).raw
    for old in _committed_versions(name):
        assert incompatibilities(old, current) == [], f"{name}: incompatible with a committed version"
        # fastavro itself must agree: data written with the old version reads with the current one.
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(old, _force=True), _example(old, {}))
        buf.seek(0)
        fastavro.schemaless_reader(
            buf, fastavro.parse_schema(old, _force=True), fastavro.parse_schema(current, _force=True)
        )


def test_compatibility_check_catches_a_deliberately_incompatible_change() -> None:
    old = current_schema("step").raw
    broken = copy.deepcopy(old)
    broken["fields"].append({"name": "new_required", "type": "string"})  # no default: old data can't fill it
    retyped = copy.deepcopy(old)
    position = next(i for i, f in enumerate(retyped["fields"]) if f["name"] == "step_index")
    retyped["fields"][position]["type"] = "string"
    assert any("new_required" in e for e in incompatibilities(old, broken))
    assert any(f"/fields/{position}/type" in e and "string" in e for e in incompatibilities(old, retyped))
    widened = copy.deepcopy(old)
    widened["fields"].append({"name": "optional", "type": ["null", "string"], "default": None})
    widened["fields"][position]["type"] = "long"  # int -> long promotes
    assert incompatibilities(old, widened) == []
    # The same holds for the derived envelope: a record change reaches it.
    assert incompatibilities(batch_schema(old), batch_schema(broken))
    assert incompatibilities(batch_schema(old), batch_schema(widened)) == []


def test_old_writer_versions_decode_into_the_current_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message written with an older version resolves to the current reader schema, defaults filled."""
    import clawr1.schemas.codec as codec_module

    old = copy.deepcopy(current_schema("feedback").raw)
    old["fields"] = [f for f in old["fields"] if f["name"] != "comment"]
    history = tmp_path / "history"
    history.mkdir()
    (history / "feedback.v1.avsc").write_text(json.dumps(old))
    monkeypatch.setattr(codec_module, "HISTORY_DIR", history)
    codec_module._by_fingerprint.cache_clear()
    try:
        old_version = codec_module.history_versions("feedback")[0]
        record = _example(old, {})
        body = io.BytesIO()
        fastavro.schemaless_writer(body, old_version.parsed, record)
        data = b"\xc3\x01" + old_version.fingerprint + body.getvalue()
        name, decoded = AvroCodec().decode(data)
        assert name == "feedback"
        assert decoded["comment"] is None
        assert decoded["target_id"] == record["target_id"]
    finally:
        codec_module._by_fingerprint.cache_clear()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_current_schema_is_a_released_version(name: str) -> None:
    """Producers write the current schema: it must be kept in history/ so its messages stay readable
    after the next change. To evolve a schema, edit it and add it as history/<name>.v<N+1>.avsc."""
    released = {v.fingerprint for v in history_versions(name)}
    assert current_schema(name).fingerprint in released, (
        f"schemas/{name}.avsc changed: add it as schemas/history/{name}.v{len(released) + 1}.avsc"
    )


def test_registry_mode_uses_the_confluent_wire_format_and_resolves_ids() -> None:
    with RegistryStub() as registry:
        writer = AvroCodec(registry.url)
        record = _example(current_schema("step").raw, {})
        data = writer.encode("step", record)
        assert writer.encode("step", record) == data
        assert data[0] == 0 and int.from_bytes(data[1:5], "big") == 1
        assert registry.subjects == {"dev.clawr1.step": [1]}  # registered once, under the codec's subject
        # A fresh reader knows nothing yet: it looks the id up in the registry, once.
        reader = AvroCodec(registry.url)
        assert reader.decode(data) == ("step", record)
        assert reader.decode(data) == ("step", record)
        assert registry.requests.count(("GET", "/schemas/ids/1")) == 1
        with pytest.raises(DecodeError, match="not in the registry"):
            reader.decode(b"\x00\x00\x00\x00\x09" + data[5:])
    with pytest.raises(DecodeError, match="no schema registry"):
        AvroCodec().decode(data)


def test_registry_mode_reads_ids_other_producers_registered() -> None:
    """An older version registered by another producer resolves to the current schema; a schema that is
    not one of ours is refused by name."""
    old = history_versions("feedback")[0]
    record = _example(old.raw, {})
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old.parsed, record)
    with RegistryStub(first_id=100) as registry:
        old_id = registry.add(old.raw)
        invoice = {"type": "record", "name": "Invoice", "fields": [{"name": "n", "type": "int"}]}
        other_id = registry.add(invoice)
        reader = AvroCodec(registry.url)
        name, decoded = reader.decode(b"\x00" + old_id.to_bytes(4, "big") + body.getvalue())
        assert name == "feedback" and decoded["target_id"] == record["target_id"]
        assert set(decoded) == {f["name"] for f in current_schema("feedback").raw["fields"]}
        with pytest.raises(DecodeError, match="'Invoice', not a Claw-R1 schema"):
            reader.decode(b"\x00" + other_id.to_bytes(4, "big") + body.getvalue())


def test_registry_basic_auth_comes_from_the_url() -> None:
    with RegistryStub(credentials=("clawr1", "s3cret")) as registry:
        data = AvroCodec(registry.url_with_credentials()).encode("feedback", _example(
            current_schema("feedback").raw, {}))
        assert data[0] == 0 and registry.subjects == {"dev.clawr1.feedback": [1]}
        with pytest.raises(SchemaRegistryError, match="Unauthorized"):
            AvroCodec(registry.url).decode(data)


def test_registry_tls_files_come_from_settings(tmp_path: Path) -> None:
    files = {name: tmp_path / name for name in ("ca.pem", "client.pem", "client.key")}
    for path in files.values():
        path.write_text("not a PEM")
    env = {"CLAWR1_SCHEMA_REGISTRY_CA_FILE": str(files["ca.pem"]),
           "CLAWR1_SCHEMA_REGISTRY_CERT_FILE": str(files["client.pem"]),
           "CLAWR1_SCHEMA_REGISTRY_KEY_FILE": str(files["client.key"])}
    assert registry_config("https://registry:8081", env) == {
        "url": "https://registry:8081", "timeout": 10.0, "ssl.ca.location": str(files["ca.pem"]),
        "ssl.certificate.location": str(files["client.pem"]), "ssl.key.location": str(files["client.key"])}
    assert registry_config("https://registry:8081", {}) == {"url": "https://registry:8081", "timeout": 10.0}
    # The client loads them at once: a bad file stops the role at start, not at its first message.
    with pytest.raises(CodecError, match="cannot be loaded"):
        AvroCodec("https://registry:8081", env)
    with pytest.raises(CodecError, match="CLAWR1_SCHEMA_REGISTRY_CA_FILE: no such file .*absent.pem"):
        AvroCodec("https://registry:8081", {"CLAWR1_SCHEMA_REGISTRY_CA_FILE": str(tmp_path / "absent.pem")})


@pytest.mark.parametrize("sizes", [[1], [1, 1], [3, 1, 2], [1] * 70, [64, 1], [200]])
def test_joined_envelopes_are_the_envelope_of_all_their_records(sizes: list[int]) -> None:
    """Byte for byte what encoding every record at once writes, for counts whose varint takes one byte
    and more (64 and up)."""
    codec = AvroCodec()
    record = pack_record("step", _example(current_schema("step").raw, {}))
    records = [{**record, "step_id": f"s{i}"} for i in range(sum(sizes))]
    values, start = [], 0
    for size in sizes:
        values.append(codec.encode_batch("step", records[start:start + size]))
        start += size
    assert codec.join_batches("step", values) == codec.encode_batch("step", records)


def test_envelopes_that_cannot_be_joined_as_they_are_are_left_to_the_caller() -> None:
    codec = AvroCodec()
    record = pack_record("step", _example(current_schema("step").raw, {}))
    envelope = codec.encode_batch("step", [record])
    single = codec.encode("step", _example(current_schema("step").raw, {}))
    assert codec.join_batches("step", []) is None
    assert codec.join_batches("step", [envelope, single]) is None  # another schema's header
    assert codec.join_batches("step", [single]) is None
    assert codec.join_batches("prefix_node", [envelope]) is None  # not the envelope asked for
    assert codec.join_batches("step", [envelope, envelope[:-1]]) is None  # no closing 0
    negative = envelope[:10] + b"\x01" + envelope[11:]  # a block count of -1 (other writers' form)
    assert codec.join_batches("step", [envelope, negative]) is None
    with RegistryStub() as registry:  # Confluent framing: a 5-byte header
        framed = AvroCodec(registry.url)
        value = framed.encode_batch("step", [record])
        assert framed.join_batches("step", [value, value]) == framed.encode_batch("step", [record, record])
