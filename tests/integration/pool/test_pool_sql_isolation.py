"""Finding 10 of issue 51 on `clawr1 up` with keys: an analyst's query the engine cannot interrupt (one
``editDistance`` call over two long strings) is answered at its limit, its key may query again at once,
and white-box steps keep reaching the pool while the engine is still in that call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live_stack import clawr1_up
from tests.support.steps import make_step
from tests.support.waiting import wait_until

KEYS = {"writer": "sk-iso-writer-0123456789", "trainer": "sk-iso-trainer-0123456789",
        "alice": "sk-iso-alice-0123456789"}
KINDS = {"writer": "steps", "trainer": "consume", "alice": "read"}
LIMIT_S = 2.0
# One row, one function call: 1.6e9 cells of edit distance, seconds to minutes of one core past any check.
UNINTERRUPTIBLE = "SELECT editDistance(repeat('a', 40000), repeat('b', 40000)) AS d"
POOL_BUSY = "the 1 SQL sessions of the analysts are in use"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stack with one analyst session, so a query the engine still runs keeps the analysts' pool."""
    env = {"CLAWR1_API_KEYS": ",".join(f"{name}:{key}:{KINDS[name]}" for name, key in KEYS.items()),
           "CLAWR1_SQL_MAX_CONCURRENT": "1", "CLAWR1_SQL_MAX_EXECUTION_TIME": str(LIMIT_S)}
    with clawr1_up(Path(tmp_path_factory.mktemp("isolation")) / "data", env=env, reverse=False) as live:
        yield live.url("api")


def sql(api: str, key: str, query: str) -> tuple[int, str]:
    reply = httpx.post(f"{api}/v1/sql", json={"query": query}, timeout=120,
                       headers={"Authorization": f"Bearer {KEYS[key]}"})
    return reply.status_code, reply.text


def test_an_uninterruptible_query_stops_at_its_limit_and_ingest_flows(api: str) -> None:
    """`editDistance` over two 60k strings held CPU and its key's slots well past the limit, in the process
    that also runs the gateway and the sink."""
    started = time.monotonic()
    status, text = sql(api, "alice", UNINTERRUPTIBLE)
    took = time.monotonic() - started
    assert status == 400 and "time limit" in text, text
    assert took < LIMIT_S + 1.0 + 3.0, f"answered after {took:.1f} s, the limit is {LIMIT_S} s"
    # Alice's share is hers again; the engine, still in the call, keeps the pool's one session taken.
    status, text = sql(api, "alice", "SELECT 1")
    assert status == 429 and POOL_BUSY in text and "share" not in text, text

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
    status, text = sql(api, "alice", "SELECT 1")
    assert status == 429 and POOL_BUSY in text, "the engine finished the call before the steps landed"
    # Once the engine is out of the call, its session is free again.
    wait_until(lambda: sql(api, "alice", "SELECT 1")[0] == 200, 600, interval=1.0,
               message="the engine finishing the call and its session coming back")
