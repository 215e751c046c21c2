"""Analysts' engine threads in a CPU cgroup of their own while they run an analyst's query (Linux, chDB).

Why a cgroup: the embedded engine runs in the API process, and ``clawr1 up`` starts every role in a
session of its own, so the kernel schedules the API process as one group (autogroup) against the
broker, the stream worker and everything else on the machine. Nice 19 or ``SCHED_IDLE`` only weigh an
analyst's thread against ingest's threads inside that group: the group as a whole stays busy, and each
time the gateway or the sink wakes it waits for its group's turn behind every other busy group. A thread
in a cgroup with ``cpu.idle = 1`` (or a small ``cpu.shares``) is scheduled outside the API's group.

The engine marks the threads of an analyst's query itself: it sets their nice value to the analysts'
``os_thread_priority`` when they take up the query and back to 0 when they leave it. A sweeper moves
every engine thread it finds at that nice value into the analysts' cgroup, and every thread it moved
back to the API's own cgroup once it is at another nice value again, or once no analyst's query is left.
Python's own threads stay (they take the nice value while they wait on a query's stream): one of them
holds the GIL at times, and preempted there, below everything, it would stall the gateway and the sink.
``/proc/self/task`` is read only while analysts' queries are in the engine.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple, Protocol

# How often the sweeper looks; also the longest a thread that left an analyst's query stays in the cgroup.
SWEEP_PERIOD_S = 0.05
TASKS = Path("/proc/self/task")


class Task(NamedTuple):
    """One thread of this process: its id and nice value (``/proc/self/task/<id>/stat``)."""

    tid: int
    nice: int


class AnalystCgroupError(ValueError):
    """The analysts' cgroup cannot be used (the message says why)."""


def moves(tasks: Iterable[Task], analyst_nice: int, moved: Collection[int],
          python: Collection[int]) -> tuple[list[int], list[int]]:
    """``(to move in, to move back)``: engine threads at ``analyst_nice`` not yet ``moved``; ``moved`` ones
    back at another nice value (the engine reset it when the query left the thread). ``python``: this
    process's Python threads, never moved."""
    into, back = [], []
    for task in tasks:
        if task.nice == analyst_nice and task.tid not in moved and task.tid not in python:
            into.append(task.tid)
        elif task.nice != analyst_nice and task.tid in moved:
            back.append(task.tid)
    return into, back


def parse_stat(tid: int, stat: str) -> Task:
    """A thread's ``stat`` line (``man 5 proc``: nice is field 19; the command name, field 2, is in
    parentheses and may hold spaces and parentheses)."""
    return Task(tid, int(stat[stat.rindex(")") + 2:].split()[16]))


def read_tasks(tasks: Path = TASKS) -> Iterator[Task]:
    """This process's threads; one that ends while being read is skipped."""
    for entry in os.scandir(tasks):
        with contextlib.suppress(OSError, ValueError, IndexError):
            yield parse_stat(int(entry.name), Path(entry.path, "stat").read_text())


def home_cgroup(cgroup: Path, pid: int | None = None, proc: Path = Path("/proc")) -> Path:
    """The cgroup that holds process ``pid`` (this one) in the hierarchy ``cgroup`` belongs to: where a
    moved thread goes back to."""
    pid = os.getpid() if pid is None else pid
    root = cgroup
    while not os.path.ismount(root) and root != root.parent:
        root = root.parent
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        candidate = root / line.split(":", 2)[2].lstrip("/")
        with contextlib.suppress(OSError):
            if str(pid) in (candidate / "cgroup.procs").read_text().split():
                return candidate
    raise AnalystCgroupError(f"no cgroup of the hierarchy at {root} holds this process")


class Mover(Protocol):
    def move(self, tid: int, into: bool) -> bool: ...


class AnalystCgroup:
    """Moves threads into a cgroup directory and back to the process's own cgroup of that hierarchy
    (cgroup v1: ``tasks``; v2: ``cgroup.threads``, both in one threaded subtree)."""

    def __init__(self, path: Path) -> None:
        if not path.is_dir():
            raise AnalystCgroupError(f"the analysts' cgroup {path} is not a directory")
        self.path = path
        self.home = home_cgroup(path)
        self.threads_file = "tasks" if (path / "tasks").exists() else "cgroup.threads"
        if not os.access(path / self.threads_file, os.W_OK):
            raise AnalystCgroupError(f"{path / self.threads_file} is not writable by this process")

    def move(self, tid: int, into: bool) -> bool:
        """Whether ``tid`` moved (a thread that ended meanwhile did not)."""
        try:
            ((self.path if into else self.home) / self.threads_file).write_text(str(tid))
        except OSError:
            return False
        return True


class IdleSweeper:
    """``wake()`` when an analyst's query starts: the sweeper runs until ``busy()`` is false, then moves
    back every thread it moved and stops (the next ``wake`` starts it again)."""

    def __init__(self, cgroup: Mover, analyst_nice: int, busy: Callable[[], bool],
                 period_s: float = SWEEP_PERIOD_S, tasks: Callable[[], Iterable[Task]] = read_tasks) -> None:
        self.cgroup = cgroup
        self.tasks = tasks
        self.analyst_nice = analyst_nice
        self.busy = busy
        self.period_s = period_s
        self.moved: set[int] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def wake(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clawr1-sql-idle", daemon=True)
                self._thread.start()

    def sweep(self) -> None:
        tasks = list(self.tasks())
        python = {thread.native_id for thread in threading.enumerate() if thread.native_id is not None}
        into, back = moves(tasks, self.analyst_nice, self.moved, python)
        self.moved &= {task.tid for task in tasks}  # ended threads
        self.moved |= {tid for tid in into if self.cgroup.move(tid, into=True)}
        for tid in back:
            self.cgroup.move(tid, into=False)
        self.moved -= set(back)

    def restore(self) -> None:
        """Every moved thread back (no analyst's query is left in the engine)."""
        for tid in self.moved:
            self.cgroup.move(tid, into=False)
        self.moved.clear()

    def _run(self) -> None:
        pause = threading.Event()
        while True:
            self.sweep()
            with self._lock:
                if not self.busy():
                    self.restore()
                    self._thread = None
                    return
            pause.wait(self.period_s)
