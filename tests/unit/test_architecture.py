"""The house's arrows run one way: app (clawr1.cli, stack, status, supervisor) -> roles -> clawr1.core.

Read from the source with ``ast`` (every import, also those inside functions), so an upward import or a
circle fails here before a reviewer has to find it in a graph.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The installed packages, as pyproject.toml lists them: a new one is checked without editing this test.
PACKAGES = [name.rstrip("*") for name in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]]
CORE = "clawr1.core"
APP = "clawr1 (app)"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _imports() -> dict[str, set[str]]:
    """Every project module and the project modules it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = _module_name(path)
            graph[module]  # noqa: B018 - a module that imports nothing is still a node
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                else:
                    continue
                graph[module].update(n for n in names if n.split(".")[0] in PACKAGES)
    modules = set(graph)
    # ``from pkg import name`` names a module only when pkg.name is one; otherwise it is pkg's attribute.
    return {m: {n for n in deps if n in modules} - {m} for m, deps in graph.items()}


def _layer(module: str) -> str:
    if module == CORE or module.startswith(CORE + "."):
        return CORE
    if module.split(".")[0] == "clawr1":
        return APP
    return module.split(".")[0]


def test_no_module_imports_in_a_circle() -> None:
    graph = _imports()
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"modules import each other in a circle: {exc.args[1]}") from None


def test_no_package_imports_in_a_circle() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, deps in _imports().items():
        packages[_layer(module)].update(_layer(d) for d in deps if _layer(d) != _layer(module))
    try:
        tuple(TopologicalSorter(packages).static_order())
    except CycleError as exc:
        raise AssertionError(f"packages import each other in a circle: {exc.args[1]}") from None


def test_the_core_imports_only_the_core() -> None:
    upward = {(m, d) for m, deps in _imports().items() if _layer(m) == CORE
              for d in deps if _layer(d) != CORE}
    assert not upward, f"clawr1.core must not import roles or the app layer: {sorted(upward)}"


def test_only_the_app_layer_imports_the_app_layer() -> None:
    upward = {(m, d) for m, deps in _imports().items() if _layer(m) != APP for d in deps if _layer(d) == APP}
    assert not upward, f"roles must not import clawr1.cli/stack/status/supervisor/readiness: {sorted(upward)}"
