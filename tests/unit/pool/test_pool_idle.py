"""The analysts' cgroup: engine threads at the analysts' nice value move in, and back once the engine has
reset their nice value or no analyst's query is left; Python's threads stay."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from clawr1.pool.idle import (
    AnalystCgroup,
    AnalystCgroupError,
    IdleSweeper,
    Task,
    home_cgroup,
    moves,
    parse_stat,
)
from tests.support.waiting import wait_until


def test_moves_takes_in_engine_threads_at_the_analysts_nice_and_gives_back_those_the_engine_reset() -> None:
    tasks = [Task(1, 19), Task(2, 0), Task(3, 0), Task(4, 19), Task(5, 19), Task(6, -20)]
    assert moves(tasks, 19, moved={3, 4}, python={5}) == ([1], [3])


def test_parse_stat_reads_the_nice_value_past_a_name_with_spaces_and_parentheses() -> None:
    fields = ["S"] + ["0"] * 15 + ["19"] + ["0"] * 30
    assert parse_stat(42, "42 (Query (Pipe) x) " + " ".join(fields)) == Task(42, 19)


def test_home_is_the_cgroup_of_the_same_hierarchy_that_holds_the_process(tmp_path: Path) -> None:
    root = tmp_path
    while not os.path.ismount(root):  # where home_cgroup walks up to: the hierarchy's mount point
        root = root.parent
    home, analysts = tmp_path / "stack", tmp_path / "analysts"
    for group, procs in ((home, "5\n7\n"), (analysts, "")):
        group.mkdir()
        (group / "cgroup.procs").write_text(procs)
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(f"4:memory:/elsewhere\n1:cpu:/{home.relative_to(root)}\n")
    assert home_cgroup(analysts, pid=7, proc=proc) == home
    (home / "cgroup.procs").write_text("5\n")
    with pytest.raises(AnalystCgroupError, match="holds this process"):
        home_cgroup(analysts, pid=7, proc=proc)


def test_a_missing_cgroup_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(AnalystCgroupError, match="not a directory"):
        AnalystCgroup(tmp_path / "nope")


class Recorder:
    """Which threads are in the analysts' cgroup (the real move is a write to its ``tasks`` file)."""

    def __init__(self) -> None:
        self.inside: set[int] = set()

    def move(self, tid: int, into: bool) -> bool:
        (self.inside.add if into else self.inside.discard)(tid)
        return True


def test_the_sweeper_moves_engine_threads_in_and_back_and_all_back_once_no_query_is_left() -> None:
    nices = {101: 19, 102: 0, threading.get_native_id(): 19}  # the last: a Python thread, which stays
    busy = threading.Event()
    busy.set()
    cgroup = Recorder()
    sweeper = IdleSweeper(cgroup, 19, busy.is_set, period_s=0.01,
                          tasks=lambda: [Task(tid, nice) for tid, nice in list(nices.items())])
    sweeper.sweep()
    assert cgroup.inside == {101}
    nices[101], nices[102] = 0, 19  # the query left 101 (the engine reset it) and took up 102
    sweeper.sweep()
    assert cgroup.inside == {102}
    del nices[102]  # the thread ended (the kernel takes it out of its cgroup)
    cgroup.inside.discard(102)
    sweeper.sweep()
    assert sweeper.moved == set()
    nices[103] = 19
    sweeper.wake()
    wait_until(lambda: cgroup.inside == {103}, timeout=5)
    busy.clear()  # no analyst's query left: everything back, and the sweeper stops
    wait_until(lambda: cgroup.inside == set() and not sweeper.running, timeout=5)
