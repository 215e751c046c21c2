"""Where the tests and benchmarks keep things: unit tests in the folder of their role, helpers in
tests/support/ (never in a test module another file imports), benchmarks run as ``python -m bench.<name>``
with no path set-up of their own, and no test sleeps a fixed time before an assert (it polls a condition
with tests/support/waiting.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TESTS, BENCH, UNIT = ROOT / "tests", ROOT / "bench", ROOT / "tests" / "unit"


def _modules(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _parsed(folder: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(folder.rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def test_unit_tests_sit_in_the_folder_of_their_role() -> None:
    flat = sorted(p.name for p in UNIT.glob("test_*.py"))
    assert not flat, f"move these into tests/unit/<role>/: {flat}"


def test_unit_tests_and_benchmarks_take_helpers_from_tests_support_only() -> None:
    """A builder in an integration folder or a harness in a test module is found by nobody looking for it."""
    found = [f"{path}: {name}" for folder in (UNIT, BENCH) for path, tree in _parsed(folder)
             for name in _modules(tree)
             if name.split(".")[0] == "tests" and not name.startswith("tests.support")]
    assert not found, f"move what these need into tests/support/: {found}"


def test_benchmarks_set_up_no_import_path() -> None:
    """``python -m bench.<name>`` from the repository root finds clawr1, bench and tests as they are."""
    found = [str(path) for path, tree in _parsed(BENCH) for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert not found, f"these change sys.path: {found}"


def _is_sleep(statement: ast.stmt) -> bool:
    call = statement.value if isinstance(statement, ast.Expr) else None
    call = call.value if isinstance(call, ast.Await) else call
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "sleep"
            and isinstance(call.func.value, ast.Name) and call.func.value.id in {"time", "asyncio"})


def test_no_test_sleeps_before_an_assert() -> None:
    """A fixed sleep before an assert is too short on a loaded machine and too long on an idle one: poll
    the condition (``wait_until``), or that it holds (``holds_for``), or outlast a limit (``outlast``)."""
    found = []
    for path, tree in _parsed(TESTS):
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list):
                found += [f"{path}:{first.lineno}" for first, then in zip(body, body[1:], strict=False)
                          if _is_sleep(first) and isinstance(then, ast.Assert)]
    assert not found, f"a fixed sleep right before an assert: {found}"
