"""docs/settings.md is what the registry generates; every CLAWR1_* name the repository uses is declared."""

from __future__ import annotations

import re
from pathlib import Path

from clawr1.core.registry import REGISTRY, markdown_table

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "settings.md"
NAME = re.compile(r"\bCLAWR1_[A-Z0-9_]*[A-Z0-9]\b")
SCANNED = {".py", ".md", ".yml", ".yaml", ".toml", ".js", ".sql", ".xml", ".sh", ".cfg", ".ini"}
SKIPPED_DIRS = {".git", ".venv", ".hypothesis", ".cache", "node_modules", ".pytest_cache", "build", "dist"}
# Names that are not variables: a label in a test, and the misspellings tests use on purpose.
NOT_VARIABLES = {"CLAWR1_TEST_METRICS_PORT", "CLAWR1_SINK_BACTH_ROWS", "CLAWR1_PROXY_PROT", "CLAWR1_ZZZ",
                 "CLAWR1_ZZZZ"}


def test_the_committed_table_is_what_the_registry_generates() -> None:
    assert DOC.read_text() == markdown_table(), (
        "docs/settings.md is stale: run `.venv/bin/clawr1 config --markdown > docs/settings.md`"
    )


def _files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        if parts & SKIPPED_DIRS or any(p.endswith(".egg-info") for p in parts) or not path.is_file():
            continue
        if path.suffix in SCANNED or path.name in {"Makefile", "Dockerfile"} or path.name.startswith(".env"):
            found.append(path)
    return found


def test_every_clawr1_name_in_the_repository_is_declared() -> None:
    """A variable read, set or documented anywhere (code, tests, benches, compose, docs) is registered,
    or every process would refuse it at start."""
    unknown: dict[str, set[str]] = {}
    for path in _files():
        for name in NAME.findall(path.read_text(errors="replace")):
            if name.endswith("_") or name in REGISTRY or name in NOT_VARIABLES:
                continue
            unknown.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert not unknown, f"declare these in clawr1/core/registry.py: {unknown}"
