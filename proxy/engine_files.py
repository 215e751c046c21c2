"""The engine table's files, shared by the proxy's processes (``CLAWR1_PROXY_PROCESSES``) through the data
dir: what an operator set (``control.json``: drains, policy versions, a revision) and each process's
counts (``process-<i>.json``: the control revision it has taken, its engines' rows).

The control file outlives the proxy, so a restarted proxy keeps the versions its engines were resumed at
(and an engine drained stays drained until resumed); process files are of one run and removed at start.
Every write replaces a file whole (write then rename): a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL = "control.json"
DIRECTORY = "proxy-engines"  # under the data dir


@dataclass(frozen=True)
class EngineFiles:
    directory: Path
    process: int = 0
    processes: int = 1

    def clear_processes(self) -> None:
        """Forget an earlier run's process files (before this run's processes start)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("process-*.json"):
            stale.unlink(missing_ok=True)

    def _write(self, name: str, content: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".{name}.{os.getpid()}"
        temporary.write_text(json.dumps(content))
        temporary.replace(self.directory / name)

    def _read(self, name: str) -> dict[str, Any] | None:
        return _read_object(self.directory / name)

    def write_control(self, engines: dict[str, dict[str, Any]]) -> int:
        """Record what an operator set; returns its revision (later than any before it)."""
        revision = time.time_ns()
        self._write(CONTROL, {"revision": revision, "engines": engines})
        return revision

    def read_control(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """The latest control revision and its engines (0 and none when nothing was set)."""
        content = self._read(CONTROL) or {}
        revision, engines = content.get("revision"), content.get("engines")
        if not isinstance(revision, int) or not isinstance(engines, dict):
            return 0, {}
        return revision, engines

    def write_status(self, revision: int, rows: list[dict[str, Any]]) -> None:
        self._write(f"process-{self.process}.json", {"revision": revision, "engines": rows})

    def others(self) -> dict[int, tuple[int, dict[str, dict[str, Any]]]]:
        """Each other process's control revision taken and its rows by engine (absent: none written)."""
        found = {}
        for process in range(self.processes):
            if process == self.process:
                continue
            content = self._read(f"process-{process}.json")
            if content is None or not isinstance(content.get("engines"), list):
                continue
            rows = {row["engine"]: row for row in content["engines"]
                    if isinstance(row, dict) and "engine" in row}
            found[process] = (int(content.get("revision") or 0), rows)
        return found


def combined(own: list[dict[str, Any]], others: dict[int, tuple[int, dict[str, dict[str, Any]]]]
             ) -> list[dict[str, Any]]:
    """The engines as all processes see them: counts added up, ``out`` where any process has it out."""
    rows = []
    for row in own:
        theirs = [rows_of[row["engine"]] for _, rows_of in others.values() if row["engine"] in rows_of]
        merged = dict(row)
        for field in ("in_flight", "served", "failures", "rollouts"):
            merged[field] = row[field] + sum(int(other.get(field) or 0) for other in theirs)
        if row["state"] == "serving" and any(other.get("state") == "out" for other in theirs):
            merged["state"] = "out"
        rows.append(merged)
    return rows


def remaining(url: str, own_in_flight: int, revision: int, processes: int,
              others: dict[int, tuple[int, dict[str, dict[str, Any]]]]) -> tuple[int, int]:
    """Calls still in flight on ``url`` across the processes that have taken control ``revision``, and
    how many processes have not taken it yet."""
    in_flight, waiting = own_in_flight, processes - 1
    for taken, rows in others.values():
        if taken >= revision:
            waiting -= 1
            in_flight += int(rows.get(url, {}).get("in_flight") or 0)
    return in_flight, waiting


def snapshot(directory: Path) -> list[dict[str, Any]]:
    """The engines as every proxy process last wrote them (``GET /v1/engines``'s rows), for a reader
    outside the proxy (the dashboard): none when no proxy wrote any."""
    found: list[tuple[int, dict[str, dict[str, Any]]]] = []
    for path in sorted(directory.glob("process-*.json")):
        content = _read_object(path)
        if content is not None and isinstance(content.get("engines"), list):
            rows = {row["engine"]: row for row in content["engines"]
                    if isinstance(row, dict) and "engine" in row}
            found.append((int(content.get("revision") or 0), rows))
    if not found:
        return []
    (_, own), *others = found
    return combined(list(own.values()), dict(enumerate(others)))


def _read_object(path: Path) -> dict[str, Any] | None:
    """A file's JSON object; None when it is missing, unreadable or not an object."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None
