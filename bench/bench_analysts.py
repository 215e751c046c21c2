"""Ingest freshness while analysts run queries the engine cannot interrupt, against the same load without
them, in the same run.

The whole stack (``clawr1 up``: broker, API with sink and the embedded pool, stream worker, proxy) with
API keys: six analysts (``read`` keys, each in a loop) send ``editDistance`` over two ``--chars``-long
strings, one row and one function call, which the engine cannot stop at its limit
(``CLAWR1_SQL_MAX_EXECUTION_TIME``, ``--limit-s``), and send it again as soon as they are answered (a
second later when refused); the stack gives the analysts six sessions, one per key. White-box
steps go in at ``--rate`` steps/s in batches every 0.2 s for ``--seconds``; freshness is each step's
``ingested_at - created_at_ms`` (gateway receive -> sink insert). Phases alternate, with analysts and
without, ``--pairs`` pairs, the order flipped each pair; a phase without analysts starts once the engine
has stopped every analyst query (six analyst keys then get their ``SELECT 1`` at once: a stopped query
holds its place in the pool until the engine is done with it). Prints p50/p99 of each phase and the
ratio of the p99s (all steps of each kind pooled), and the rate the gateway took steps at with analysts
against without (the load waits for each answer, and freshness starts at the gateway's receipt, so a
slower gateway shows there): the figures docs/pool.md states.

    .venv/bin/python -m bench.bench_analysts [--pairs 3] [--seconds 10] [--rate 40] [--chars 20000]
        [--limit-s 2] [--per-row] [--env CLAWR1_SQL_OS_THREAD_PRIORITY=0]

Analysts' queries run in analyst processes over snapshots (the embedded pool's default);
``--env CLAWR1_SQL_ANALYST_SNAPSHOT_S=0`` runs them in the API process instead, at nice 19, and adding
``--env CLAWR1_SQL_OS_THREAD_PRIORITY=0`` at ingest's priority (as before either). Results:
bench/results/bench_analysts.json, the stack's log bench/results/bench_analysts_stack.log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.bench_pipeline import Stack, step
from bench.common import percentile
from clawr1.gateway.client import GatewayClient

RESULTS = Path(__file__).resolve().parent / "results" / "bench_analysts.json"
ANALYSTS = [f"analyst{n}" for n in range(6)]
KEYS = {"writer": "sk-bench-writer-0123456789", "trainer": "sk-bench-trainer-0123456789",
        **{name: f"sk-bench-{name}-0123456789" for name in ANALYSTS}}
KINDS = {"writer": "steps", "trainer": "consume", **{name: "read" for name in ANALYSTS}}
BATCH_PERIOD_S = 0.2


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def sql(self, key: str, query: str, timeout: float = 120) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/sql", json={"query": query}, timeout=timeout,
                          headers={"Authorization": f"Bearer {KEYS[key]}"})

    def rows(self, query: str) -> list[dict[str, Any]]:
        """A trainer's query (a pool of its own: the analysts never take its sessions)."""
        reply = self.sql("trainer", query)
        if reply.status_code != 200:
            raise RuntimeError(f"{query}: {reply.status_code} {reply.text}")
        return [json.loads(line) for line in reply.text.splitlines() if line]

    def idle(self) -> bool:
        """Every analyst session free: each analyst key gets its ``SELECT 1`` at the same time."""
        with ThreadPoolExecutor(len(ANALYSTS)) as pool:
            return all(r.status_code == 200 for r in pool.map(lambda k: self.sql(k, "SELECT 1"), ANALYSTS))

    def wait_idle(self, timeout: float = 300) -> float:
        started = time.monotonic()
        while not self.idle():
            if time.monotonic() - started > timeout:
                raise RuntimeError("the analysts' queries did not stop")
            time.sleep(0.5)
        return time.monotonic() - started


def analyst(api: Api, key: str, query: str, stop: threading.Event, answers: Counter[int]) -> None:
    """Sends ``query`` again as soon as it is answered (a second later when refused), until ``stop``."""
    while not stop.is_set():
        status = api.sql(key, query).status_code
        answers[status] += 1
        if status != 400:
            stop.wait(1.0)


def load(api: Api, rate: float, seconds: float) -> tuple[list[float], float]:
    """White-box steps at ``rate``/s for ``seconds``, one batch after another: each one's freshness (ms) once
    all are in the pool, and the rate the gateway took them at (below ``rate`` when its answers slow)."""
    run = "ba" + uuid.uuid4().hex[:8]
    per_batch = max(1, round(rate * BATCH_PERIOD_S))
    sent = 0
    with GatewayClient(api.url, KEYS["writer"], batch_size=per_batch, timeout_s=60) as client:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if (wait := started + sent / rate - time.monotonic()) > 0:
                time.sleep(wait)
            client.submit_steps([step(run, sent + i) for i in range(per_batch)])
            sent += per_batch
        taken = sent / (time.monotonic() - started)
    where = f"trajectory_id LIKE '{run}-%'"
    deadline = time.monotonic() + 300
    while int(api.rows(f"SELECT count() AS n FROM steps WHERE {where}")[0]["n"]) < sent:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not all {sent} steps of {run} reached the pool")
        time.sleep(0.2)
    return [float(r["lag"]) for r in api.rows(
        "SELECT toUnixTimestamp64Milli(ingested_at) - toUnixTimestamp64Milli(created_at_ms) AS lag "
        f"FROM steps WHERE {where}")], taken


def phase(api: Api, with_analysts: bool, args: argparse.Namespace) -> dict[str, Any]:
    query = f"SELECT editDistance(repeat('a', {args.chars}), repeat('b', {args.chars})) AS d"
    if args.per_row:
        query = (f"SELECT editDistance(repeat('a', {args.chars} + number), repeat('b', {args.chars})) AS d "
                 "FROM numbers(1)")
    stop, answers = threading.Event(), Counter[int]()
    analysts = [threading.Thread(target=analyst, args=(api, key, query, stop, answers), daemon=True)
                for key in (ANALYSTS if with_analysts else [])]
    for thread in analysts:
        thread.start()
    if analysts:
        time.sleep(args.limit_s)  # every analyst's first query is running
    lags, taken = load(api, args.rate, args.seconds)
    stop.set()
    for thread in analysts:
        thread.join()
    drained_s = api.wait_idle() if analysts else 0.0
    result = {"analysts": len(analysts), "steps": len(lags), "steps_per_s": round(taken, 1),
              "p50_ms": percentile(lags, 0.5), "p99_ms": percentile(lags, 0.99), "answers": dict(answers),
              "drained_s": round(drained_s, 1)}
    print(json.dumps(result), flush=True)
    return {**result, "lags": lags}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--limit-s", type=float, default=2.0)
    parser.add_argument("--per-row", action="store_true",
                        help="the call on a row of numbers(1), computed in the engine's pipeline threads, "
                             "instead of on constants, which the engine folds on the caller's thread")
    parser.add_argument("--env", action="append", default=[], help="CLAWR1_<NAME>=VALUE for the stack")
    args = parser.parse_args()
    env = {"CLAWR1_API_KEYS": ",".join(f"{name}:{key}:{KINDS[name]}" for name, key in KEYS.items()),
           "CLAWR1_SQL_MAX_CONCURRENT": str(len(ANALYSTS)), "CLAWR1_SQL_KEY_SHARE": "0.16",
           "CLAWR1_SQL_MAX_EXECUTION_TIME": str(args.limit_s),
           **dict(item.split("=", 1) for item in args.env)}
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-analysts-") as tmp:
        stack = Stack(Path(tmp) / "analysts", env=env, kept_log=RESULTS.with_name("bench_analysts_stack.log"))
        try:
            stack.wait_healthy()
            api = Api(stack.api)
            load(api, args.rate, 10.0)  # warm-up, not counted: a fresh stack's first loads run slower
            phases = [phase(api, with_analysts == (pair % 2 == 1), args)
                      for pair in range(args.pairs) for with_analysts in (False, True)]
        finally:
            stack.stop()
    pooled = {kind: [lag for p in phases if bool(p["analysts"]) == kind for lag in p["lags"]]
              for kind in (False, True)}
    summary = {name: {"p50_ms": percentile(lags, 0.5), "p99_ms": percentile(lags, 0.99)}
               for name, lags in (("without", pooled[False]), ("with", pooled[True]))}
    ratio = summary["with"]["p99_ms"] / max(1.0, summary["without"]["p99_ms"])
    rates = {kind: statistics.fmean(p["steps_per_s"] for p in phases if bool(p["analysts"]) == kind)
             for kind in (False, True)}
    pair_ratios = [round(max(p["p99_ms"] for p in pair if p["analysts"])
                         / max(1.0, max(p["p99_ms"] for p in pair if not p["analysts"])), 2)
                   for pair in zip(phases[0::2], phases[1::2], strict=True)]
    print(f"freshness without analysts: p50 {summary['without']['p50_ms']:.0f} ms, "
          f"p99 {summary['without']['p99_ms']:.0f} ms")
    print(f"freshness with 6 analysts:  p50 {summary['with']['p50_ms']:.0f} ms, "
          f"p99 {summary['with']['p99_ms']:.0f} ms")
    print(f"p99 ratio with/without: {ratio:.2f} (each pair's: {pair_ratios})")
    print(f"steps/s the gateway took (of {args.rate:g} offered): {rates[True]:.1f} with analysts, "
          f"{rates[False]:.1f} without ({rates[True] / rates[False]:.2f}x)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "summary": summary, "p99_ratio": round(ratio, 2),
                                   "steps_per_s_ratio": round(rates[True] / rates[False], 2),
                                   "phases": [{k: v for k, v in p.items() if k != "lags"} for p in phases]},
                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
