"""Keyed analysts' SQL on the embedded pool runs in processes of its own, over snapshots: at the lowest
priority, stopped at its limit by killing its process (even inside one function call), never seeing the
pool older than the snapshot age, and gone once idle; trainers stay on the live pool in this process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clawr1.pool.admission import ANALYSTS, KILLED, TRAINERS, Caller, SqlError, WriteRefused
from clawr1.pool.analyst_processes import AnalystProcessError, AnalystProcesses
from clawr1.pool.sql import AnalystSql, SqlLimits
from clawr1.pool.store import PoolStore, embedded_path
from tests.support.waiting import wait_until

LIMIT_S = 2.0
MAX_AGE_S = 1.5
ALICE = Caller("alice", ANALYSTS, limited=True)
TRAINER = Caller("trainer", TRAINERS, limited=True)
UNINTERRUPTIBLE = "SELECT editDistance(repeat('a', 60000), repeat('b', 60000)) AS d"
COUNT = "SELECT count() AS n FROM notes"


@pytest.fixture
def analyst(pool_store: PoolStore) -> Iterator[AnalystSql]:
    if not pool_store.embedded:
        pytest.fail(f"analyst processes serve the embedded pool; the test pool is {pool_store.dsn}")
    pool_store.command("CREATE TABLE notes (n UInt64) ENGINE = MergeTree ORDER BY n")
    pool_store.command("INSERT INTO notes SELECT number FROM numbers(10)")
    limits = SqlLimits(max_execution_time=LIMIT_S)

    def active_parts() -> list[str]:
        rows = pool_store.query("SELECT path FROM system.parts WHERE active AND database = currentDatabase()")
        return [str(row["path"]) for row in rows]

    processes = AnalystProcesses(embedded_path(pool_store.dsn), pool_store.database, active_parts, limits,
                                 MAX_AGE_S)
    sql = AnalystSql(pool_store.dsn, pool_store.database, limits, processes=processes)
    yield sql
    sql.close()


def run(analyst: AnalystSql, caller: Caller, query: str) -> bytes:
    return analyst.stream(query, admission=analyst.admit(caller)).read_all()


def nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_an_analyst_reads_a_snapshot_in_a_process_at_the_lowest_priority(analyst: AnalystSql,
                                                                         pool_store: PoolStore) -> None:
    processes = analyst.processes
    assert processes is not None
    assert run(analyst, ALICE, COUNT) == b'{"n":10}\n'
    (pid,) = processes.pids()
    assert nice(pid) == 19
    pool_store.command("INSERT INTO notes SELECT number FROM numbers(5)")
    assert run(analyst, TRAINER, COUNT) == b'{"n":15}\n'  # a trainer reads the live pool, here
    assert run(analyst, ALICE, COUNT) == b'{"n":10}\n'  # the same snapshot, younger than its age
    assert processes.pids() == [pid]
    wait_until(lambda: processes.pids() == [] and not list(processes.snapshots()), 10 * MAX_AGE_S,
               interval=0.1, message="the idle analyst process retiring with its snapshot's age")
    assert run(analyst, ALICE, COUNT) == b'{"n":15}\n'  # a fresh process on a fresh snapshot


def test_refusals_and_errors_come_back_and_the_process_stays(analyst: AnalystSql) -> None:
    processes = analyst.processes
    assert processes is not None
    with pytest.raises(WriteRefused, match="INSERT"):
        run(analyst, ALICE, "INSERT INTO notes VALUES (1)")
    pids = processes.pids()
    with pytest.raises(SqlError, match="UNKNOWN_IDENTIFIER"):
        run(analyst, ALICE, "SELECT nope FROM notes")
    assert processes.pids() == pids and len(pids) == 1
    stream = analyst.stream("SELECT arrayJoin(range(200000)) AS n", fmt="CSV",
                            admission=analyst.admit(ALICE))
    assert len(stream.read_all().splitlines()) == 200000  # many chunks through the socket


def test_an_uninterruptible_query_is_stopped_at_its_limit_with_its_process(analyst: AnalystSql) -> None:
    """`editDistance` over two 60k strings runs for minutes inside one call: the engine cannot stop it."""
    processes = analyst.processes
    assert processes is not None
    started = time.monotonic()
    with pytest.raises(SqlError, match="time limit"):
        run(analyst, ALICE, UNINTERRUPTIBLE)
    took = time.monotonic() - started
    assert took < LIMIT_S + 1.0 + 3.0, f"answered after {took:.1f} s, the limit is {LIMIT_S} s"
    assert processes.pids() == []  # killed: nothing of it runs on
    assert analyst.ledger.running(ANALYSTS, state=KILLED) == 0  # so her share is hers again at once
    assert run(analyst, ALICE, COUNT) == b'{"n":10}\n'


def test_a_process_that_dies_under_a_query_is_a_server_error(analyst: AnalystSql) -> None:
    """The OOM killer (first to pick an analyst process) or a crash: the caller hears that, not a limit."""
    processes = analyst.processes
    assert processes is not None
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(run, analyst, ALICE, UNINTERRUPTIBLE)
        (pid,) = wait_until(lambda: processes.pids() or None, 30, interval=0.05,
                            message="the query's analyst process")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(AnalystProcessError, match="ended"):
            answer.result(timeout=30)
    assert analyst.ledger.running(ANALYSTS) == 0
    assert run(analyst, ALICE, COUNT) == b'{"n":10}\n'
