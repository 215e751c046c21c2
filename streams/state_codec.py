"""How the worker's state records spell their parts: by field name, so that adding, removing or
reordering a dataclass field never makes stored state read wrong.

State written before names were used (layout version 1) spelled each part as a list in the dataclass's
field order; ``decode`` still reads that. Records carry ``STATE_VERSION`` under ``"v"`` (absent: 1).
Fields at their default value are left out, which keeps the records that change on every call small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

STATE_VERSION = 2

T = TypeVar("T")
# Factories whose value is always the same empty container: made once per field, only ever compared.
_EMPTY = frozenset({list, dict, set, tuple})


_Defaults = tuple[tuple[str, Any, Callable[[], Any] | None], ...]
_DEFAULTS: dict[type, _Defaults] = {}
_NAMES: dict[type, frozenset[str]] = {}


def _defaults(cls: type) -> _Defaults:
    """(name, default, factory) of each field of ``cls`` (MISSING: none; a factory left only where its
    value may differ call by call), once per class: ``dataclasses.fields`` builds its tuple anew on
    every call, on every state record the worker reads and writes (8% of the worker's logic)."""
    known = _DEFAULTS.get(cls)
    if known is None:
        made: list[tuple[str, Any, Callable[[], Any] | None]] = []
        for f in fields(cls):
            factory = None if f.default_factory is MISSING else f.default_factory
            if factory in _EMPTY:
                made.append((f.name, factory(), None))  # type: ignore[misc]
            else:
                made.append((f.name, f.default, factory))
        known = _DEFAULTS[cls] = tuple(made)
    return known


def _names(cls: type) -> frozenset[str]:
    known = _NAMES.get(cls)
    if known is None:
        known = _NAMES[cls] = frozenset(name for name, _, _ in _defaults(cls))
    return known


def encode(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, without those at their default."""
    out = {}
    for name, default, factory in _defaults(type(obj)):
        value = getattr(obj, name)
        if value != (default if factory is None else factory()):
            out[name] = value
    return out


def decode(cls: type[T], data: list[Any] | dict[str, Any]) -> T:
    """An instance from ``encode``'s dict, or from a version-1 list in field order. Names the class no
    longer has are ignored (a field that was removed)."""
    if isinstance(data, list):
        return cls(*data)
    names = _names(cls)
    return cls(**{k: v for k, v in data.items() if k in names})
