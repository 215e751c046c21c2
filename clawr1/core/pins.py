"""Checks that the names a compat module reaches for still exist in the installed library.

A library's private names change without notice. Each compat module (``clawr1.proxy.mitm_compat``,
``clawr1.streams.quix_compat``) lists the names it relies on; its unit test runs these checks, so an
upgrade that renames one fails there, naming it, instead of breaking or hanging in production.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

# (module, dotted attribute path): ``("pkg.mod", "Class.method")``, ``("pkg.mod", "function")``.
Pin = tuple[str, str]
_GONE = object()


def _resolve(module_name: str, path: str) -> Any:
    """The pinned object, or ``_GONE`` when the module or any name on the path is gone.

    A class attribute declared only by annotation (``servers: Servers``) counts as present; it
    resolves to the class that declares it."""
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError:
        return _GONE
    *owners, last = path.split(".")
    for name in owners:
        target = getattr(target, name, _GONE)
        if target is _GONE:
            return _GONE
    if hasattr(target, last):
        return getattr(target, last)
    annotated = any(last in getattr(klass, "__annotations__", {}) for klass in getattr(target, "__mro__", ()))
    return target if annotated else _GONE


def missing_names(pinned: Iterable[Pin]) -> list[str]:
    """The pinned names the installed library lacks, as ``module:path``."""
    return [f"{module}:{path}" for module, path in pinned if _resolve(module, path) is _GONE]


def changed_signatures(pinned: Mapping[Pin, tuple[str, ...]]) -> list[str]:
    """Pinned callables whose leading parameters are no longer the ones named (a hook overridden or
    replaced must keep the library's signature), as ``module:path(expected) is now (found)``."""
    changed = []
    for (module, path), expected in pinned.items():
        target = _resolve(module, path)
        try:
            found = tuple(inspect.signature(target).parameters) if target is not _GONE else ()
        except (TypeError, ValueError):
            found = ()
        if found[:len(expected)] != expected:
            changed.append(f"{module}:{path}({', '.join(expected)}) is now ({', '.join(found) or 'gone'})")
    return changed
