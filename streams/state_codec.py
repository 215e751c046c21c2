"""How the worker's state records spell their parts: by field name, so that adding, removing or
reordering a dataclass field never makes stored state read wrong.

State written before names were used (layout version 1) spelled each part as a list in the dataclass's
field order; ``decode`` still reads that. Records carry ``STATE_VERSION`` under ``"v"`` (absent: 1).
Fields at their default value are left out, which keeps the records that change on every call small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, NamedTuple, TypeVar

STATE_VERSION = 2

T = TypeVar("T")
# Factories whose value is always the same empty container: made once per field, only ever compared.
_EMPTY = frozenset({list, dict, set, tuple})


class _Shape(NamedTuple):
    """A dataclass's fields as the codec reads them: (name, default, factory) each (MISSING: none; a
    factory kept only where its value may differ call by call), and their names."""

    fields: tuple[tuple[str, Any, Callable[[], Any] | None], ...]
    names: frozenset[str]


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type) -> _Shape:
    """Once per class: ``dataclasses.fields`` builds its tuple anew on every call, on every state record
    the worker reads and writes (8% of the worker's logic)."""
    known = _SHAPES.get(cls)
    if known is None:
        made: list[tuple[str, Any, Callable[[], Any] | None]] = []
        for f in fields(cls):
            factory = None if f.default_factory is MISSING else f.default_factory
            if factory in _EMPTY:
                made.append((f.name, factory(), None))  # type: ignore[misc]
            else:
                made.append((f.name, f.default, factory))
        known = _SHAPES[cls] = _Shape(tuple(made), frozenset(name for name, _, _ in made))
    return known


def encode(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, without those at their default."""
    out = {}
    for name, default, factory in _shape(type(obj)).fields:
        value = getattr(obj, name)
        if value != (default if factory is None else factory()):
            out[name] = value
    return out


def decode(cls: type[T], data: list[Any] | dict[str, Any]) -> T:
    """An instance from ``encode``'s dict, or from a version-1 list in field order. Names the class no
    longer has are ignored (a field that was removed)."""
    if isinstance(data, list):
        return cls(*data)
    names = _shape(cls).names
    return cls(**{k: v for k, v in data.items() if k in names})
