"""The house's arrows run one way: app (clawr1.cli, stack, status, supervisor) -> roles -> clawr1.core.

Read from the source with ``ast`` (every import, also those inside functions), so an upward import or a
circle fails here before a reviewer has to find it in a graph.

Everything installs under one top-level name: each role folder (proxy/, pool/, ...) stays at the top of the
repository and is the package ``clawr1.<folder>`` through a link in clawr1/. Its bare name is never imported
(one file under two module names would be two module objects).
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOP = "clawr1"
# The installed packages, as pyproject.toml lists them: one top-level name.
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
INCLUDE = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
# The role packages: the folders linked from clawr1/, so a new one is checked without editing this test.
ROLES = sorted(p.name for p in (ROOT / TOP).iterdir() if p.is_symlink())
CORE = "clawr1.core"
APP = "clawr1 (app)"
# Folders that are not Python of the repository (environments, caches, builds).
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}


def _python_files(folder: Path) -> Iterator[Path]:
    """Every .py file under folder, links not followed (each file once, under its real path)."""
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and not d.endswith(".egg-info") and not (Path(root) / d).is_symlink())
        yield from (Path(root) / f for f in sorted(files) if f.endswith(".py"))


def _module_name(path: Path) -> str:
    """The installed name: clawr1/x.py is clawr1.x, pool/store.py is clawr1.pool.store."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == TOP else (TOP, *parts))


def _imported_names(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@cache
def _imports() -> dict[str, set[str]]:
    """Every project module and the project modules it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for folder in (TOP, *ROLES):
        for path in _python_files(ROOT / folder):
            module = _module_name(path)
            graph[module]  # noqa: B018 - a module that imports nothing is still a node
            graph[module].update(n for n in _imported_names(ast.parse(path.read_text(), str(path)))
                                 if n.split(".")[0] == TOP)
    modules = set(graph)
    # ``from pkg import name`` names a module only when pkg.name is one; otherwise it is pkg's attribute.
    return {m: {n for n in deps if n in modules} - {m} for m, deps in graph.items()}


def _layer(module: str) -> str:
    if module == CORE or module.startswith(CORE + "."):
        return CORE
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROLES:
        return f"{TOP}.{parts[1]}"
    return APP


def test_one_top_level_name_and_every_role_folder_linked() -> None:
    assert [f"{TOP}*"] == INCLUDE, "the wheel installs one top-level name, clawr1"
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {TOP, "tests"}
    assert set(ROLES) == folders, "every package folder is linked from clawr1/ (and only those)"
    for role in ROLES:
        assert os.readlink(ROOT / TOP / role) == f"../{role}", f"clawr1/{role} must be a link to ../{role}"


def test_every_module_is_in_the_graph() -> None:
    graph = _imports()
    assert {"clawr1.cli", "clawr1.core.settings", "clawr1.pool.store", "clawr1.proxy.runner"} <= set(graph)
    assert all(m.split(".")[0] == TOP for m in graph)


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


def test_no_python_file_imports_a_bare_role_name() -> None:
    """Packages, tests, bench, examples: ``clawr1.pool``, never ``pool`` (a second module object)."""
    bare = []
    for path in _python_files(ROOT):
        names = _imported_names(ast.parse(path.read_text(), str(path)))
        bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ROLES]
    assert not bare, f"import these as clawr1.<package>: {bare}"


def test_no_doc_code_imports_a_bare_role_name() -> None:
    statement = re.compile(rf"^\s*(?:>>>\s*)?(?:from|import)\s+({'|'.join(ROLES)})\b", re.M)
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    bare = [f"{path.relative_to(ROOT)}: {m[0].strip()}"
            for path in docs for m in statement.finditer(path.read_text())]
    assert not bare, f"the docs import these as clawr1.<package>: {bare}"


def test_no_test_imports_the_benchmarks() -> None:
    """bench/ may use tests/support/, never the other way round: a test must not depend on a benchmark."""
    found = [f"{path.relative_to(ROOT)}: {n}" for path in _python_files(ROOT / "tests")
             for n in _imported_names(ast.parse(path.read_text(), str(path))) if n.split(".")[0] == "bench"]
    assert not found, f"move what these need into tests/support/ (or the product): {found}"
