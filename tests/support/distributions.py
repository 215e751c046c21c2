"""What a list of requirements installs, read from this environment's installed metadata."""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement_closure(requires: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """Canonical name -> installed distribution, for ``requires`` and everything they require in turn
    (with the extras each asks for), as installed here; each must be installed, in a version its
    requirement accepts."""
    found: dict[str, importlib.metadata.Distribution] = {}
    expanded: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are pending already
    pending = [need for need in map(Requirement, requires) if _applies(need, "")]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name not in found:
            dist = importlib.metadata.distribution(requirement.name)
            assert requirement.specifier.contains(dist.version, prereleases=True), (requirement, dist.version)
            found[name] = dist
        for extra in ["", *sorted(requirement.extras)]:
            if (name, extra) in expanded:
                continue
            expanded.add((name, extra))
            for text in found[name].requires or []:
                need = Requirement(text)
                if _applies(need, extra):
                    pending.append(need)
    return found


def _applies(requirement: Requirement, extra: str) -> bool:
    """Whether ``requirement`` is installed here when the extra ``extra`` ("" for none) is asked for
    (its marker also names the platform and Python version)."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": extra})
