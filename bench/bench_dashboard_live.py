"""What open dashboard live streams cost a trainer's SQL, against the same API with none open, in one run.

``clawr1 api`` (its own process, keys on, a private Kafka broker, the embedded pool holding
``--steps`` generated steps) serves a trainer (a ``consume`` key) polling ``POST /v1/sql`` with the
SDK's kind of query, first with no live stream open (the baseline), then while ``--streams``
``/v1/dashboard/live`` streams of one ``read`` key are held open. Printed: the trainer's p50/p99 in
each phase, their ratio, and how many streams the API accepted (the rest got 429).

    .venv/bin/python -m bench.bench_dashboard_live [--streams 150] [--queries 60] [--live-caps PER_KEY,ALL]

``--live-caps`` sets ``CLAWR1_DASHBOARD_LIVE_PER_KEY``/``_STREAMS`` (e.g. ``150,200`` to hold every
stream open and see the shared computation alone). Results: bench/results/bench_dashboard_live.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.bench_gateway import wait_healthy
from bench.common import percentile
from clawr1.broker.launcher import KafkaBroker
from tests.support.ports import free_port

KEYS = {"viewer": "sk-bench-viewer-0123456789", "trainer": "sk-bench-trainer-0123456789"}
TRAINER_SQL = ("SELECT step_id, trajectory_id, reward FROM steps WHERE ready = 1 AND policy_version >= 0 "
               "ORDER BY created_at_ms LIMIT 64")
RESULTS = Path(__file__).resolve().parent / "results" / "bench_dashboard_live.json"


def seed(data_dir: str, trajectories: int) -> None:
    """Agent steps (``bench_pool``'s generator) written as the sink writes them, before the API owns the
    pool (chDB: one process per data path; this runs in a process of its own)."""
    from bench.bench_pool import ORIGIN, agent_trajectories
    from clawr1.core.settings import Settings
    from clawr1.pool.store import PoolStore
    from clawr1.sinks.rows import STEP_COLUMNS, step_row

    store = PoolStore(Settings(data_dir=Path(data_dir)).pool_dsn)
    store.migrate()
    rows = [step_row(step, ORIGIN, 1_760_000_000_000) for step in agent_trajectories(trajectories)]
    for start in range(0, len(rows), 2000):
        store.insert("step_versions", rows[start:start + 2000], STEP_COLUMNS)
    store.close()


def trainer_latencies(api: str, queries: int) -> list[float]:
    out = []
    trainer = {"Authorization": f"Bearer {KEYS['trainer']}"}
    with httpx.Client(base_url=api, timeout=120, headers=trainer) as http:
        for _ in range(queries):
            started = time.perf_counter()
            reply = http.post("/v1/sql", json={"query": TRAINER_SQL, "format": "JSONEachRow"})
            out.append((time.perf_counter() - started) * 1000)
            if reply.status_code != 200:
                raise RuntimeError(f"trainer SQL answered {reply.status_code}: {reply.text[:200]}")
    return out


def hold_streams(api: str, count: int, stop: threading.Event, accepted: list[int]) -> None:
    """Open ``count`` live streams on one key and keep reading them until ``stop``."""
    with ExitStack() as streams, httpx.Client(base_url=api, timeout=None,
                                              limits=httpx.Limits(max_connections=None)) as http:
        readers = []
        for _ in range(count):
            request = http.build_request("GET", "/v1/dashboard/live",
                                         headers={"Authorization": f"Bearer {KEYS['viewer']}"})
            reply = http.send(request, stream=True)
            if reply.status_code == 200:
                streams.callback(reply.close)
                readers.append(reply.iter_lines())
            else:
                reply.read()
                reply.close()
        accepted.append(len(readers))
        stop.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=150)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--trajectories", type=int, default=500, help="of 8 steps each")
    parser.add_argument("--live-caps", default="", help="PER_KEY,ALL: CLAWR1_DASHBOARD_LIVE_* for the API")
    parser.add_argument("--label", default="", help="names this run in the results file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp, ExitStack() as stack:
        broker = KafkaBroker(data_dir=Path(tmp) / "kafka", port=free_port(), controller_port=free_port())
        broker.start()
        stack.callback(broker.stop)
        port = free_port()
        kinds = {"trainer": "consume", "viewer": "read"}
        keys = ",".join(f"{name}:{key}:{kinds[name]}" for name, key in KEYS.items())
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWR1_")},
               "CLAWR1_KAFKA_BOOTSTRAP": broker.bootstrap, "CLAWR1_API_KEYS": keys}
        if args.live_caps:
            per_key, total = args.live_caps.split(",")
            env |= {"CLAWR1_DASHBOARD_LIVE_PER_KEY": per_key, "CLAWR1_DASHBOARD_LIVE_STREAMS": total}
        seeding = multiprocessing.get_context("spawn").Process(target=seed,
                                                               args=(f"{tmp}/data", args.trajectories))
        seeding.start()
        seeding.join()
        api_process = subprocess.Popen([sys.executable, "-m", "clawr1.cli", "api", "--data-dir",
                                        f"{tmp}/data", "--api-port", str(port), "--compat-port", "0"],
                                       env=env)
        stack.callback(api_process.wait, 30)
        stack.callback(api_process.terminate)
        api = f"http://127.0.0.1:{port}"
        wait_healthy(api, 120)
        trainer_latencies(api, 5)  # warm the sessions and the guard's cache
        idle = trainer_latencies(api, args.queries)
        stop, accepted = threading.Event(), []
        holder = threading.Thread(target=hold_streams, args=(api, args.streams, stop, accepted), daemon=True)
        holder.start()
        while not accepted:
            time.sleep(0.2)
        time.sleep(3)  # the streams' pulses run
        busy = trainer_latencies(api, args.queries)
        stop.set()
        holder.join(30)
    result: dict[str, Any] = {
        "label": args.label, "streams_requested": args.streams, "streams_open": accepted[0],
        "live_caps": args.live_caps or "default", "steps": args.trajectories * 8,
        "trainer_p50_ms_idle": round(percentile(idle, 0.5), 1),
        "trainer_p99_ms_idle": round(percentile(idle, 0.99), 1),
        "trainer_p50_ms_streams": round(percentile(busy, 0.5), 1),
        "trainer_p99_ms_streams": round(percentile(busy, 0.99), 1),
        "p50_ratio": round(percentile(busy, 0.5) / percentile(idle, 0.5), 2),
    }
    print(json.dumps(result, indent=1))
    RESULTS.parent.mkdir(exist_ok=True)
    runs = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*runs, result], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
