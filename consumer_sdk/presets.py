"""Named curation filter sets stored in the pool, so every trainer and analyst means the same by a name.

A preset is the JSON of a :class:`Filters` (only the fields that differ from the defaults). Saving a
name again replaces it for every later reader; consumers resolve a preset once, when they open.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from clawr1.consumer_sdk.errors import PresetNotFound, UsageError
from clawr1.consumer_sdk.filters import Filters
from clawr1.consumer_sdk.queries import PRESETS_SQL
from clawr1.consumer_sdk.source import TransportKind, parse_source
from clawr1.consumer_sdk.transport import Transport, open_transport
from clawr1.pool.consumer_tables import PRESETS_TABLE

__all__ = ["list_presets", "load_preset", "save_preset"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UsageError(f"preset name must be 1-128 characters of letters, digits, '._:-', got {name!r}")
    return name


def read_presets(transport: Transport, names: list[str]) -> dict[str, Filters]:
    """The newest filters of each named preset (all presets when ``names`` is empty)."""
    rows = transport.query(PRESETS_SQL, {"names": names}).to_pylist()
    return {row["name"]: Filters.from_json(row["filters_json"]) for row in rows}


def read_preset(transport: Transport, name: str) -> Filters:
    found = read_presets(transport, [_check_name(name)])
    if name not in found:
        raise PresetNotFound(f"no curation preset named {name!r} in the pool")
    return found[name]


@contextmanager
def _connected(source: str, transport: TransportKind | None, api_key: str | None) -> Iterator[Transport]:
    link = open_transport(parse_source(source, transport), api_key=api_key)
    try:
        yield link
    finally:
        link.close()


def save_preset(
    source: str,
    name: str,
    *,
    transport: TransportKind | None = None,
    api_key: str | None = None,
    **filters: Any,
) -> Filters:
    """Store ``filters`` under ``name`` (replacing an older preset of that name); returns them validated."""
    validated = Filters.from_kwargs(**filters)
    _check_name(name)
    with _connected(source, transport, api_key) as link:
        link.insert(PRESETS_TABLE, [[name, validated.to_json(), time.time_ns()]],
                    ["name", "filters_json", "saved_at_ns"])
    return validated


def load_preset(
    source: str, name: str, *, transport: TransportKind | None = None, api_key: str | None = None
) -> Filters:
    """The filters saved under ``name``; raises :class:`PresetNotFound` if there are none."""
    with _connected(source, transport, api_key) as link:
        return read_preset(link, name)


def list_presets(
    source: str, *, transport: TransportKind | None = None, api_key: str | None = None
) -> dict[str, Filters]:
    """Every saved preset, by name."""
    with _connected(source, transport, api_key) as link:
        return read_presets(link, [])
