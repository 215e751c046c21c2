"""Each role's extra brings every third-party module its folders import when they load.

A role installed alone (``pip install 'claw-r1[gateway]'``, a container per role) fails at its first
import if its extra forgot a distribution that the development venv (all extras) happens to have: the
gateway's fast path imported orjson while only the proxy's extra named it. Imports inside functions
are optional features (torch for FlexAttention masks, transformers for chat templates) and say so when
absent; this checks the imports at a module's top level.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.support.distributions import requirement_closure

REPO = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The folders each role's extra runs: the API serves the pool and runs the sink in-process.
ROLE_FOLDERS = {
    "gateway": ("gateway", "pool", "sinks", "dashboard"),
    "streams": ("streams", "prefix_tree"),
    "sink": ("sinks",),
    "proxy": ("proxy",),
}


def top_level_imports(folder: str) -> dict[str, str]:
    """Third-party module -> a file of ``folder`` that imports it when it loads."""
    found: dict[str, str] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("clawr1", "__future__"):
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


@cache
def distributions_of() -> dict[str, list[str]]:
    return metadata.packages_distributions()


@pytest.mark.parametrize("extra", sorted(ROLE_FOLDERS))
def test_role_extra_installs_what_its_folders_import(extra: str) -> None:
    installs = set(requirement_closure([*PROJECT["dependencies"], *PROJECT["optional-dependencies"][extra]]))
    missing = {
        module: where
        for folder in ROLE_FOLDERS[extra]
        for module, where in top_level_imports(folder).items()
        if not {canonicalize_name(d) for d in distributions_of().get(module, [module])} & installs
    }
    assert not missing, f"pyproject.toml's [{extra}] extra does not install what these import: {missing}"


def test_the_check_sees_a_missing_distribution() -> None:
    """The gateway's folders without orjson in reach: the check names the module and the file."""
    installs = set(requirement_closure(list(PROJECT["dependencies"])))
    imports = top_level_imports("gateway")
    assert imports["orjson"] == "gateway/fastpath.py"
    assert not {canonicalize_name(d) for d in distributions_of()["orjson"]} & installs
