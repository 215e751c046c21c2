"""Readiness of the local stack's processes, shared through files under ``<data_dir>/run``.

Each part writes ``<part>.ready`` with its pid once it serves; the API's /healthz reads them, so
the health answer reflects processes it does not own without any extra RPC.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _run_dir(data_dir: Path) -> Path:
    return data_dir / "run"


def mark_ready(data_dir: Path, part: str) -> None:
    """The part serves (again): its marker holds this pid, and a problem reported before is gone."""
    folder = _run_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{part}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(folder / f"{part}.ready")
    (folder / f"{part}.problem").unlink(missing_ok=True)


def report_problem(data_dir: Path, part: str, reason: str) -> None:
    """Why the part is not healthy though its process lives (the supervisor found it stuck); /healthz
    says so until the part marks itself ready again."""
    folder = _run_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{part}.problem.tmp"
    tmp.write_text(reason)
    tmp.replace(folder / f"{part}.problem")
    withdraw(data_dir, part)


def problem(data_dir: Path, part: str) -> str | None:
    try:
        return (_run_dir(data_dir) / f"{part}.problem").read_text() or None
    except FileNotFoundError:
        return None


def clear(data_dir: Path) -> None:
    for path in [*_run_dir(data_dir).glob("*.ready"), *_run_dir(data_dir).glob("*.problem")]:
        path.unlink(missing_ok=True)


def withdraw(data_dir: Path, part: str) -> None:
    """The part's process died: /healthz names it until its next start marks it ready again."""
    (_run_dir(data_dir) / f"{part}.ready").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ready_for_s(data_dir: Path, part: str) -> float | None:
    """How long ago the part (its live process) marked itself ready; None while it is not."""
    path = _run_dir(data_dir) / f"{part}.ready"
    try:
        pid, marked = int(path.read_text().strip()), path.stat().st_mtime
    except (FileNotFoundError, ValueError):
        return None
    return max(0.0, time.time() - marked) if _alive(pid) else None


def is_ready(data_dir: Path, part: str) -> bool:
    path = _run_dir(data_dir) / f"{part}.ready"
    try:
        pid = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    return _alive(pid)
