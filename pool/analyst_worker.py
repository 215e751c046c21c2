"""One analyst process: guarded read-only SQL over a snapshot of the embedded pool, one query at a time.

Started by ``clawr1.pool.analyst_processes`` (``python -m clawr1.pool.analyst_worker <socket fd> <pool path>
<snapshot path> <database> <limits JSON>``), which then sends the paths of the pool's active parts: the
process links its snapshot of them (``clawr1.pool.snapshot``) and opens it. It runs at the analysts' nice
value (``os_thread_priority``, 19 by default: the lowest CPU priority) and is the first the kernel's OOM
killer picks, so an analyst's query only gets what ingest leaves; a query past its limit is ended by
killing this process (the engine cannot stop inside one function call). It leaves when its parent does.
It answers in the frames ``clawr1.pool.analyst_processes`` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clawr1.pool.analyst_processes import CHUNK, DONE, FAILED, READY
from clawr1.pool.snapshot import link_snapshot
from clawr1.pool.sql import AnalystSql, SqlLimits, WriteRefused, as_sql_error
from clawr1.pool.store import open_client

PARENT_CHECK_S = 1.0
LOWEST_NICE = 19


def main(argv: list[str]) -> int:
    fd, pool, path, database, limits_json = argv
    limits = json.loads(limits_json)
    _lowest_priority(int(limits["os_thread_priority"]))
    _first_for_oom_killer()
    _leave_with_parent(os.getppid())

    conn = Connection(int(fd))
    # The parent names the parts active now; linking them is this process's work, at its priority.
    link_snapshot(Path(pool), Path(path), json.loads(conn.recv_bytes()))
    # The whole process is niced: the engine must not touch its threads' priority (it resets a query's
    # thread to 0 at the query's end, and threads started later would inherit that).
    analyst = AnalystSql(f"chdb://{path}", database, SqlLimits(**{**limits, "os_thread_priority": 0}))
    control = open_client(f"chdb://{path}", database, what="the analyst snapshot")
    control.command("SYSTEM STOP MERGES")  # the snapshot only serves reads: no CPU on tidying its parts
    conn.send_bytes(READY)
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return 0
        _answer(conn, analyst, request)


def _answer(conn: Connection, analyst: AnalystSql, request: dict[str, Any]) -> None:
    try:
        result = analyst.stream(request["sql"], request["format"], request["parameters"], request["max_rows"])
        for chunk in result.chunks():
            conn.send_bytes(CHUNK + chunk)
    except Exception as exc:  # noqa: BLE001 - every failure is the caller's answer, the process goes on
        try:
            error: Exception = as_sql_error(exc)
        except Exception:  # noqa: BLE001 - not one of the engine's: its text is still the answer
            error = exc
        conn.send_bytes(FAILED + json.dumps({"refused": isinstance(error, WriteRefused),
                                             "message": str(error)}).encode())
        return
    conn.send_bytes(DONE)


def _lowest_priority(nice: int) -> None:
    """Nice this process before the engine starts its threads (they inherit it). Under the kernel's
    autogroup scheduling a nice value only ranks a process within its session's group, which is the API's:
    a session of its own, with that group niced, ranks it below every other role's group too. At the
    lowest nice value the process also takes ``SCHED_IDLE`` (only CPU nothing else wants): safe in a
    process of its own, where no thread of ingest's can wait on one of its locks or the GIL."""
    os.nice(nice - os.nice(0))
    if nice >= LOWEST_NICE and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.setsid()
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(nice))


def _first_for_oom_killer() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass  # not Linux, or not allowed: the limits on memory per query still hold


def _leave_with_parent(parent: int) -> None:
    """Exit once the parent is gone, even inside a query (a closed socket is only seen between queries)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="clawr1-analyst-parent", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
