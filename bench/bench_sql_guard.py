"""Benchmark of the analyst SQL guard: its cost per query, and that a slow query no longer starves writes.

One embedded pool (migrated, empty consumer tables plus generated rows). In the same run:

* ``guard``: for each query, the median time of ``AnalystSql.run`` (guard + run on a pooled read-only
  session) against the same query run the same way (streamed) unguarded on an identical read-only
  session, and the guard alone (``AnalystSql.check``).
* ``starvation``: the latency of SDK-style inserts (``PoolStore.insert_raw`` into ``consumer_commits``,
  what ``POST /v1/pool/insert`` does) while a slow analyst query runs (a) on the analyst's own session,
  as the API does now, and (b) through the same store, as the API did before.

Run: ``.venv/bin/python -m bench.bench_sql_guard [--repeats N]``; the table is printed and the figures
are written to ``bench/results/bench_sql_guard.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from clawr1.pool.sql import CHUNK_BYTES, AnalystSql, SqlLimits, open_session
from clawr1.pool.store import PoolError, PoolStore

QUERIES = {
    "point": "SELECT 1",
    "scan_1m": "SELECT count(), sum(number) FROM numbers(1000000)",
    "group_by": "SELECT number % 10 AS k, count() AS n, avg(number) AS m FROM numbers(200000) GROUP BY k "
                "ORDER BY k",
    "cte_join": "WITH a AS (SELECT number AS x FROM numbers(1000)) SELECT count() FROM a "
                "JOIN (SELECT number AS x FROM numbers(1000)) AS b USING (x)",
    "pool_view": "SELECT group_name, count() FROM consumer_commits GROUP BY group_name",
    "describe": "DESCRIBE TABLE steps",
}
SLOW = "SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 99"


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm: the catalogue, pooled sessions, caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def run_bare(client: Client, query: str) -> bytes:
    """The query as the analyst path runs it (streamed when a SELECT), minus the guard."""
    if not query.startswith(("SELECT", "WITH")):
        return client.raw_query(query, fmt="JSONEachRow")
    source = client.raw_stream(query, fmt="JSONEachRow")
    try:
        return b"".join(iter(lambda: source.read(CHUNK_BYTES), b""))
    finally:
        source.close()


def guard_cost(dsn: str, database: str, repeats: int) -> dict[str, dict[str, float]]:
    analyst = AnalystSql(dsn, database)
    bare = open_session(dsn, database, SqlLimits())
    try:
        figures = {}
        for name, query in QUERIES.items():
            guarded = median_ms(lambda q=query: analyst.run(q), repeats)
            unguarded = median_ms(lambda q=query: run_bare(bare, q), repeats)
            check = median_ms(lambda q=query: analyst.check(q), repeats)
            figures[name] = {"guarded_ms": guarded, "unguarded_ms": unguarded, "guard_only_ms": check,
                             "ratio": guarded / unguarded}
        return figures
    finally:
        bare.close()
        analyst.close()


def insert_latencies(store: PoolStore, slow: Callable[[], Any], inserts: int) -> dict[str, float]:
    """Insert latencies (ms) while ``slow`` runs in another thread."""
    started = threading.Event()

    def run_slow() -> None:
        started.set()
        with contextlib.suppress(PoolError, ValueError):  # it ends by its time limit
            slow()

    thread = threading.Thread(target=run_slow)
    thread.start()
    started.wait()
    time.sleep(0.3)  # the slow query is running
    latencies = []
    for i in range(inserts):
        row = json.dumps({"group_name": "bench", "epoch": 0, "step_id": f"s{i}"}).encode()
        begun = time.perf_counter()
        store.insert_raw("consumer_commits", row, "JSONEachRow")
        latencies.append((time.perf_counter() - begun) * 1000)
    thread.join()
    return {"median_ms": statistics.median(latencies), "max_ms": max(latencies)}


def starvation(dsn: str, store: PoolStore, slow_s: float, inserts: int) -> dict[str, dict[str, float]]:
    analyst = AnalystSql(dsn, store.database, SqlLimits(max_execution_time=slow_s, max_rows_to_read=10**12))
    try:
        own = insert_latencies(store, lambda: analyst.run(SLOW), inserts)
    finally:
        analyst.close()
    shared = insert_latencies(store, lambda: store.raw_query(SLOW, "JSONEachRow", settings={
        "max_execution_time": slow_s}), inserts)
    return {"own_session": own, "shared_store": shared}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--slow-seconds", type=float, default=3.0)
    parser.add_argument("--inserts", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-sql-") as tmp:
        dsn = f"chdb://{Path(tmp).resolve() / 'pool'}"
        with PoolStore(dsn) as store:
            store.migrate()
            cost = guard_cost(dsn, store.database, args.repeats)
            starve = starvation(dsn, store, args.slow_seconds, args.inserts)
    print(f"{'query':<10} {'guarded ms':>11} {'unguarded ms':>13} {'guard only ms':>14} {'ratio':>6}")
    for name, f in cost.items():
        print(f"{name:<10} {f['guarded_ms']:>11.2f} {f['unguarded_ms']:>13.2f} {f['guard_only_ms']:>14.2f} "
              f"{f['ratio']:>6.2f}")
    print(f"\nSDK insert latency while a {args.slow_seconds:g} s analyst query runs:")
    for name, f in starve.items():
        print(f"  {name:<13} median {f['median_ms']:8.1f} ms, max {f['max_ms']:8.1f} ms")
    out = Path(__file__).resolve().parent / "results" / "bench_sql_guard.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "repeats": args.repeats, "guard": cost,
                               "starvation": starve}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
