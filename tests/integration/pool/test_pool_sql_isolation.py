"""Finding 10 of issue 51 on `clawr1 up` with keys: an analyst's query the engine cannot interrupt (one
``editDistance`` call over two 60k strings) is answered at its limit, its key may query again at once, its
engine thread runs at the lowest priority, and white-box steps keep reaching the pool while it runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.live_stack import LiveStack, clawr1_up
from tests.support.steps import make_step
from tests.support.waiting import wait_until

KEYS = {"writer": "sk-iso-writer-0123456789", "trainer": "sk-iso-trainer-0123456789",
        "alice": "sk-iso-alice-0123456789"}
KINDS = {"writer": "steps", "trainer": "consume", "alice": "read"}
LIMIT_S = 2.0
# One row, one function call: 3.6e9 cells of edit distance, seconds to minutes past any check.
UNINTERRUPTIBLE = "SELECT editDistance(repeat('a', 60000), repeat('b', 60000)) AS d"
LOWEST = 19  # CLAWR1_SQL_OS_THREAD_PRIORITY's default


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    env = {"CLAWR1_API_KEYS": ",".join(f"{name}:{key}:{KINDS[name]}" for name, key in KEYS.items()),
           "CLAWR1_SQL_MAX_EXECUTION_TIME": str(LIMIT_S)}
    with clawr1_up(Path(tmp_path_factory.mktemp("isolation")) / "data", env=env, reverse=False) as live:
        yield live


def sql(api: str, key: str, query: str) -> tuple[int, str]:
    reply = httpx.post(f"{api}/v1/sql", json={"query": query}, timeout=120,
                       headers={"Authorization": f"Bearer {KEYS[key]}"})
    return reply.status_code, reply.text


def api_process(up_pid: int) -> int:
    """The pid of the stack's API process (``clawr1.cli api``), a child of ``clawr1 up``."""
    for child in Path(f"/proc/{up_pid}/task/{up_pid}/children").read_text().split():
        if b"\0clawr1.cli\0api\0" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError("no API process under clawr1 up")


def niced_threads(pid: int) -> int:
    """Threads of ``pid`` at the analysts' priority: the engine runs an analyst's query on them (it gives
    a thread back its priority when the query ends)."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        count += int(fields[16]) == LOWEST  # the 19th field of stat: nice
    return count


def test_an_uninterruptible_query_stops_at_its_limit_and_ingest_flows(stack: LiveStack) -> None:
    """`editDistance` over two 60k strings held CPU and its key's slots well past the limit, in the process
    that also runs the gateway and the sink."""
    api, pid = stack.url("api"), api_process(stack.up.pid)
    started = time.monotonic()
    status, text = sql(api, "alice", UNINTERRUPTIBLE)
    took = time.monotonic() - started
    assert status == 400 and "time limit" in text, text
    assert took < LIMIT_S + 1.0 + 3.0, f"answered after {took:.1f} s, the limit is {LIMIT_S} s"
    assert niced_threads(pid) == 1  # the engine is still in the call, at the lowest priority
    # Her whole share (2 of the 4 analyst sessions) is hers again meanwhile: two more such queries run at
    # once and are stopped at their limit too; past that, her share of runaway queries is in use.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: sql(api, "alice", UNINTERRUPTIBLE), range(2)))
    assert all(status == 400 and "time limit" in text for status, text in answers), answers
    status, text = sql(api, "alice", "SELECT 1")
    assert status == 429 and "queries of the key 'alice' ran past their limit" in text, text

    run = f"iso-{time.time_ns()}"
    steps = [{**make_step(n), "trajectory_id": f"{run}-{n // 8}"} for n in range(40)]
    reply = httpx.post(f"{api}/v1/steps", json=steps, timeout=60,
                       headers={"Authorization": f"Bearer {KEYS['writer']}"})
    assert reply.status_code == 202, reply.text

    def landed() -> bool:
        query = f"SELECT count() AS n FROM steps WHERE trajectory_id LIKE '{run}-%'"
        status, text = sql(api, "trainer", query)
        return status == 200 and '"n":40' in text

    wait_until(landed, 60, interval=0.2, message="the steps reaching the pool")
    assert niced_threads(pid) >= 1, "the engine finished the calls before the steps landed"
    wait_until(lambda: niced_threads(pid) == 0, 600, interval=1.0, message="the engine finishing the calls")
    assert sql(api, "alice", "SELECT 1")[0] == 200
