"""Analysts' SQL in processes apart from ingest, over snapshots of the embedded pool.

In the API process an analyst's query shares the interpreter, the engine and the kernel's view of one
process with the gateway and the sink: a low thread priority only ranks it among the API's own threads, and
a query inside one long function call cannot be stopped. Here each running analyst query has a process of
its own (``clawr1.pool.analyst_worker``) at the lowest priority, over a hard-link snapshot of the pool's
parts (``clawr1.pool.snapshot``), and a query past its limit is stopped by killing that process.

A process serves one query at a time and is reused while its snapshot is younger than ``max_age_s``; an
older one is retired and the next query starts a fresh process on a fresh snapshot (about 0.7 s on a small
pool). So analysts see the pool as it was at most ``max_age_s`` (plus their query's run) ago.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clawr1.core import registry
from clawr1.core.settings import Settings
from clawr1.pool.admission import Admission, SqlError, WriteRefused
from clawr1.pool.snapshot import remove_snapshot
from clawr1.pool.store import PoolStore, embedded_path
from clawr1.pool.watchdog import WATCHDOG

log = logging.getLogger(__name__)

# The frames a worker sends (``Connection.send_bytes``): ``READY`` once its snapshot is open; per query
# ``CHUNK`` + bytes, then ``DONE``, or ``FAILED`` + a JSON ``{"refused": bool, "message": str}`` at any point.
READY, CHUNK, DONE, FAILED = b"R", b"C", b"D", b"F"
START_TIMEOUT_S = 120.0
ENDED = "the analyst process ended ({why}) before the query's answer was complete"


class AnalystProcessError(SqlError):
    """The analyst process could not start, or ended in the middle of a query."""


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen[bytes]
    conn: Connection
    snapshot: Path
    taken_at: float
    tag: str | None = None
    killed: bool = field(default=False)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()
        remove_snapshot(self.snapshot)


class PipeSource:
    """The worker's answer as the binary file ``SqlStream`` reads: chunks until ``DONE``; ``FAILED``, or the
    process's end, raises."""

    def __init__(self, worker: _Worker, finished: Callable[[_Worker, bool], None]) -> None:
        self._worker = worker
        self._finished = finished
        self._open = True
        self._clean = False

    def send(self, request: dict[str, Any]) -> None:
        try:
            self._worker.conn.send_bytes(json.dumps(request).encode())
        except OSError as exc:
            raise self._ended() from exc

    def read(self, _size: int = -1) -> bytes:
        if not self._open or self._clean:
            return b""
        try:
            frame = self._worker.conn.recv_bytes()
        except (EOFError, OSError) as exc:
            raise self._ended() from exc
        kind, body = frame[:1], frame[1:]
        if kind == CHUNK:
            return body
        if kind == DONE:
            self._clean = True
            return b""
        if kind != FAILED:
            raise AnalystProcessError(f"the analyst process answered an unknown frame {kind!r}")
        failure = json.loads(body)
        self._clean = True
        raise (WriteRefused if failure["refused"] else SqlError)(failure["message"])

    def close(self) -> None:
        if self._open:
            self._open = False
            self._finished(self._worker, not self._clean)

    def _ended(self) -> SqlError:
        self._worker.process.wait()
        why = "killed at its limit" if self._worker.killed else f"exit {self._worker.process.returncode}"
        return (AnalystKilled if self._worker.killed else AnalystProcessError)(ENDED.format(why=why))


class AnalystKilled(SqlError):
    """The worker was killed at the query's limit (or when its caller left): the admission says why."""


class AnalystProcesses:
    """Processes for analysts' queries, each over its own snapshot of the embedded pool at ``pool_path``."""

    def __init__(self, pool_path: Path, database: str, active_parts: Callable[[], list[str]],
                 limits: Any, max_age_s: float) -> None:
        """``active_parts()``: the paths of the pool's active parts now (``system.parts``), from the
        process that owns the pool; ``limits``: the ``SqlLimits`` each query runs under."""
        self.pool_path = pool_path
        self.database = database
        self.max_age_s = max_age_s
        self._active_parts = active_parts
        self._limits = json.dumps(asdict(limits))
        self._root = pool_path.parent / f".{pool_path.name}-analysts"
        self._idle: list[_Worker] = []
        self._running: dict[str, _Worker] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        remove_snapshot(self._root)  # a crashed API's leftovers

    def stream(self, sql: str, fmt: str, parameters: Mapping[str, Any], max_rows: int | None,
               admission: Admission, limit_s: float, tag: str) -> tuple[bytes, PipeSource]:
        """Start the query on a worker; its first chunk and the rest. Raises ``SqlError`` for a failure up
        to the first chunk (the worker stays for the next query unless it ended)."""
        worker = self._take()
        with self._lock:
            worker.tag = tag
            self._running[tag] = worker
        source = PipeSource(worker, self._finished)
        try:
            admission.started(tag, limit_s)
            source.send({"sql": sql, "format": fmt, "parameters": dict(parameters), "max_rows": max_rows})
            first = source.read()
        except BaseException:
            source.close()
            raise
        return first, source

    def pids(self) -> list[int]:
        """The analyst processes alive now, idle or running a query."""
        with self._lock:
            workers = self._idle + list(self._running.values())
        return sorted(w.process.pid for w in workers if w.process.poll() is None)

    def snapshots(self) -> Iterator[Path]:
        """The snapshot folders on disk now (each live process holds one)."""
        return self._root.iterdir() if self._root.is_dir() else iter(())

    def kill(self, tag: str) -> bool:
        """Kill the worker running the query tagged ``tag`` and wait for its end (a SIGKILL cannot be
        refused: milliseconds); False when no worker runs it."""
        with self._lock:
            worker = self._running.get(tag)
            if worker is None:
                return False
            worker.killed = True
        worker.process.kill()
        worker.process.wait()
        return True

    def close(self) -> None:
        with self._lock:
            workers = self._idle + list(self._running.values())
            self._idle, self._running = [], {}
        for worker in workers:
            worker.stop()
        remove_snapshot(self._root)

    def _take(self) -> _Worker:
        """An idle worker with a young enough snapshot, or a new one; older idle ones are retired."""
        now = time.monotonic()
        with self._lock:
            stale = [w for w in self._idle if now - w.taken_at >= self.max_age_s]
            fresh = [w for w in self._idle if now - w.taken_at < self.max_age_s]
            self._idle = fresh[:-1]
            found = fresh[-1] if fresh else None
        for worker in stale:
            worker.stop()
        return found or self._start()

    def _start(self) -> _Worker:
        """A new worker over the parts active now (the worker links them itself, at its own priority)."""
        snapshot = self._root / f"{os.getpid()}-{next(self._numbers)}"
        taken_at = time.monotonic()
        parts = self._active_parts()
        self._root.mkdir(exist_ok=True)
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "clawr1.pool.analyst_worker", str(theirs.fileno()),
                 str(self.pool_path), str(snapshot), self.database, self._limits],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise AnalystProcessError(f"cannot start an analyst process: {exc}") from exc
        finally:
            theirs.close()
        worker = _Worker(process, Connection(ours.detach()), snapshot, taken_at)
        if not _started(worker, parts):
            worker.stop()
            raise AnalystProcessError(f"the analyst process did not start (exit {process.returncode}); "
                                      "the API's log has its error")
        return worker

    def _finished(self, worker: _Worker, broken: bool) -> None:
        """The query on ``worker`` ended: a worker in the middle of an answer is stopped, a clean one waits
        for the next query until its snapshot is too old."""
        with self._lock:
            if worker.tag is not None:
                self._running.pop(worker.tag, None)
            worker.tag = None
            keep = not broken and not worker.killed and worker.process.poll() is None
            left_s = self.max_age_s - (time.monotonic() - worker.taken_at)
            if keep and left_s > 0:
                self._idle.append(worker)
                WATCHDOG.watch(_Retirement(self, worker), left_s)
                return
        worker.stop()

    def retire(self, worker: _Worker) -> None:
        """Stop ``worker`` if it still waits idle (its snapshot is too old now): it holds memory, and links
        to parts the pool has merged away."""
        with self._lock:
            if worker not in self._idle:
                return
            self._idle.remove(worker)
        worker.stop()


@dataclass(frozen=True)
class _Retirement:
    processes: AnalystProcesses
    worker: _Worker

    def overdue(self) -> None:
        self.processes.retire(self.worker)


def _started(worker: _Worker, parts: list[str]) -> bool:
    """Send the parts to link; True once the worker has its snapshot open."""
    try:
        worker.conn.send_bytes(json.dumps(parts).encode())
        return worker.conn.poll(START_TIMEOUT_S) and worker.conn.recv_bytes() == READY
    except (EOFError, OSError):
        return False



def analyst_processes(settings: Settings, store: PoolStore, limits: Any) -> AnalystProcesses | None:
    """The API's analyst processes: on the embedded pool, unless turned off or analysts have a DSN of their
    own (a server's read-only user, whose profile bounds them there)."""
    max_age_s = settings.role_setting(registry.SQL_ANALYST_SNAPSHOT_S)
    if not store.embedded or settings.sql_dsn or max_age_s <= 0:
        return None

    def active_parts() -> list[str]:
        rows = store.query("SELECT path FROM system.parts WHERE active AND database = currentDatabase()")
        return [str(row["path"]) for row in rows]

    return AnalystProcesses(embedded_path(store.dsn), store.database, active_parts, limits, max_age_s)
