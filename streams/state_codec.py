"""How the worker's state records spell their parts: by field name, so that adding, removing or
reordering a dataclass field never makes stored state read wrong.

State written before names were used (layout version 1) spelled each part as a list in the dataclass's
field order; ``decode`` still reads that. Records carry ``STATE_VERSION`` under ``"v"`` (absent: 1).
Fields at their default value are left out, which keeps the records that change on every call small.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from typing import Any, TypeVar

STATE_VERSION = 2

T = TypeVar("T")


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def encode(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, without those at their default."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value != _default(f):
            out[f.name] = value
    return out


def decode(cls: type[T], data: list[Any] | dict[str, Any]) -> T:
    """An instance from ``encode``'s dict, or from a version-1 list in field order. Names the class no
    longer has are ignored (a field that was removed)."""
    if isinstance(data, list):
        return cls(*data)
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})
