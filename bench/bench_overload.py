"""Overload is met with backpressure, not restarts: ``clawr1 up`` (one worker) offered white-box steps as
fast as ``--clients`` posting threads can send them (batches of ``--batch``, a 429 answered by waiting its
``Retry-After``, as the client does) for ``--seconds``, with ``CLAWR1_MAX_LAG_S`` = ``--max-lag``.

Printed as JSON: offered and accepted steps per second against what reached the pool per second (the
pipeline's capacity under this load), the 429s, the pipeline lag the API sampled (max, per 5 s), the
freshness of the accepted steps (gateway receive -> pool, p50/p99/max), steps accepted but missing from
the pool (must be 0), the roles' restarts (must be 0), and how long after the load stopped a step was
accepted again.

    .venv/bin/python -m bench.bench_overload [--seconds 60] [--max-lag 10] [--clients 4] [--batch 100]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.bench_pipeline import Stack, step
from bench.common import percentile

LAG = re.compile(r"^clawr1_pipeline_lag_seconds ([0-9.e+inf]+)$", re.MULTILINE)


def _post(api: str, run: str, numbers: Any, batch: int, end: float, tally: Counter[str],
          accepted: list[str], lock: threading.Lock) -> None:
    with httpx.Client(base_url=api, timeout=60) as http:
        while time.monotonic() < end:
            with lock:
                first = next(numbers)
            reply = http.post("/v1/steps", json=[step(run, first * batch + i) for i in range(batch)])
            with lock:
                tally[str(reply.status_code)] += 1
                if reply.status_code == 202:
                    accepted.extend(reply.json()["ids"])
            if reply.status_code != 202:
                wait = float(reply.headers.get("Retry-After", "1"))
                time.sleep(min(wait, max(0.0, end - time.monotonic())))


def _lag(api: str) -> float:
    found = LAG.search(httpx.get(f"{api}/metrics", timeout=5).text)
    return float(found.group(1)) if found else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-lag", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    os.environ["CLAWR1_MAX_LAG_S"] = str(args.max_lag)
    workdir = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    stack = Stack(workdir)
    try:
        stack.wait_healthy()
        run = "ov" + uuid.uuid4().hex[:8]
        tally: Counter[str] = Counter()
        accepted: list[str] = []
        lock = threading.Lock()
        numbers = iter(range(10**9))
        started = time.monotonic()
        end = started + args.seconds
        threads = [threading.Thread(target=_post, args=(stack.api, run, numbers, args.batch, end, tally,
                                                        accepted, lock)) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        lags: list[tuple[float, float]] = []
        while time.monotonic() < end:
            lags.append((time.monotonic() - started, _lag(stack.api)))
            time.sleep(1.0)
        for thread in threads:
            thread.join()
        offered = (sum(tally.values())) * args.batch
        stopped = time.monotonic()
        # Back to normal: one step accepted again.
        while httpx.post(f"{stack.api}/v1/steps", json=step(run + "x", 0), timeout=60).status_code != 202:
            time.sleep(0.2)
        back_after = time.monotonic() - stopped
        in_pool_at = stack.wait_count(f"trajectory_id LIKE '{run}-%'", len(accepted), timeout=600)
        rows = stack.sql(
            "SELECT step_id, min(toUnixTimestamp64Milli(ingested_at)) - "
            "min(toUnixTimestamp64Milli(created_at_ms)) AS lag "
            f"FROM steps WHERE trajectory_id LIKE '{run}-%' GROUP BY step_id")
        fresh = [float(r["lag"]) / 1000 for r in rows]
        missing = len(set(accepted) - {str(r["step_id"]) for r in rows})
        state = json.loads((workdir / "data" / "run" / "supervisor.json").read_text())
        per_5s = [round(max(v for t, v in lags if i <= t < i + 5), 1) for i in range(0, int(args.seconds), 5)
                  if any(i <= t < i + 5 for t, _ in lags)]
        print(json.dumps({
            "max_lag_s": args.max_lag, "seconds": args.seconds, "clients": args.clients, "batch": args.batch,
            "offered_steps_per_s": round(offered / args.seconds, 1),
            "accepted_steps_per_s": round(len(accepted) / args.seconds, 1),
            "pool_steps_per_s": round(len(accepted) / (in_pool_at - started), 1),
            "answers": dict(tally), "lag_s_max_per_5s": per_5s,
            "freshness_s": {"p50": round(percentile(fresh, 0.5), 2), "p99": round(percentile(fresh, 0.99), 2),
                            "max": round(max(fresh), 2)},
            "accepted": len(accepted), "missing_from_pool": missing,
            "restarts": {r["role"]: r["restarts"] for r in state["roles"]},
            "accepting_again_after_s": round(back_after, 2),
        }, indent=1))
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
