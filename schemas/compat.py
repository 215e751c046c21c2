"""Avro schema resolution rules, as a pure check: can a reader schema read what a writer wrote?

Used by the compatibility test (every committed schema version must stay readable by the current
schema) and by anyone evolving a schema who wants the reason before a consumer fails at run time.
"""

from __future__ import annotations

from typing import Any

_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = {"record", "enum", "fixed"}


def _collect_names(schema: Any, namespace: str, names: dict[str, dict[str, Any]]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect_names(branch, namespace, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        ns = schema.get("namespace", namespace)
        if kind in _NAMED:
            name = schema["name"]
            names[name if "." in name else f"{ns}.{name}" if ns else name] = schema
            names.setdefault(name.rsplit(".", 1)[-1], schema)
        if kind == "record":
            for field in schema["fields"]:
                _collect_names(field["type"], ns, names)
        elif kind == "array":
            _collect_names(schema["items"], ns, names)
        elif kind == "map":
            _collect_names(schema["values"], ns, names)
        elif isinstance(kind, dict | list):
            _collect_names(kind, ns, names)


class _Resolver:
    def __init__(self, writer: Any, reader: Any) -> None:
        self.writer_names: dict[str, dict[str, Any]] = {}
        self.reader_names: dict[str, dict[str, Any]] = {}
        _collect_names(writer, "", self.writer_names)
        _collect_names(reader, "", self.reader_names)
        self.errors: list[str] = []
        self._seen: set[tuple[str, str]] = set()

    def _deref(self, schema: Any, names: dict[str, dict[str, Any]]) -> Any:
        if isinstance(schema, str) and schema in names:
            return names[schema]
        if (
            isinstance(schema, dict)
            and isinstance(schema.get("type"), dict | list | str)
            and schema["type"] not in _NAMED | {"array", "map"}
            and "logicalType" in schema
        ):
            return schema["type"]
        if isinstance(schema, dict) and set(schema) <= {"type"}:
            return self._deref(schema["type"], names)
        return schema

    @staticmethod
    def _kind(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            return str(schema["type"])
        return str(schema)

    def matches(self, writer: Any, reader: Any, path: str) -> bool:
        before = len(self.errors)
        self.resolve(writer, reader, path)
        ok = len(self.errors) == before
        del self.errors[before:]
        return ok

    def resolve(self, writer: Any, reader: Any, path: str) -> None:
        writer = self._deref(writer, self.writer_names)
        reader = self._deref(reader, self.reader_names)
        wk, rk = self._kind(writer), self._kind(reader)
        if wk == "union":
            for branch in writer:
                self.resolve(branch, reader, path)
            return
        if rk == "union":
            if not any(self.matches(writer, branch, path) for branch in reader):
                self.errors.append(f"{path}: writer type {wk} matches no branch of the reader's union")
            return
        if wk != rk:
            if rk not in _PROMOTIONS.get(wk, set()):
                self.errors.append(f"{path}: writer type {wk} cannot be read as {rk}")
            return
        if wk == "record":
            self._record(writer, reader, path)
        elif wk == "enum":
            missing = set(writer["symbols"]) - set(reader["symbols"])
            if missing and "default" not in reader:
                self.errors.append(f"{path}: enum symbols {sorted(missing)} unknown to the reader")
        elif wk == "fixed":
            if writer["size"] != reader["size"]:
                self.errors.append(f"{path}: fixed size {writer['size']} != {reader['size']}")
        elif wk == "array":
            self.resolve(writer["items"], reader["items"], f"{path}[]")
        elif wk == "map":
            self.resolve(writer["values"], reader["values"], f"{path}{{}}")

    def _record(self, writer: dict[str, Any], reader: dict[str, Any], path: str) -> None:
        key = (writer["name"], reader["name"])
        if key in self._seen:
            return
        self._seen.add(key)
        if writer["name"].rsplit(".", 1)[-1] != reader["name"].rsplit(".", 1)[-1] and writer[
            "name"
        ] not in reader.get("aliases", []):
            self.errors.append(f"{path}: record {writer['name']} cannot be read as {reader['name']}")
            return
        writer_fields = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            candidates = [field["name"], *field.get("aliases", [])]
            source = next((writer_fields[n] for n in candidates if n in writer_fields), None)
            where = f"{path}.{field['name']}" if path else field["name"]
            if source is None:
                if "default" not in field:
                    self.errors.append(f"{where}: added without a default, old data cannot fill it")
            else:
                self.resolve(source["type"], field["type"], where)


def incompatibilities(writer: Any, reader: Any) -> list[str]:
    """Reasons why data written with ``writer`` cannot be read with ``reader``; empty when it can."""
    resolver = _Resolver(writer, reader)
    resolver.resolve(writer, reader, "")
    return resolver.errors
