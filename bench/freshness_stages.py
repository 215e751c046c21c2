"""Where a white-box step's posted -> written time goes, stage by stage, at a steady rate.

For each step: the gateway's receive (``created_at_ms``), its raw record's append to ``clawr1.raw.steps``
and the worker's output append to ``clawr1.steps`` (message timestamps), the moment a ``read_committed``
reader in this process saw that output (its transaction committed), and the sink's write
(``ingested_at``). All on this machine's clock. Steps are posted every 0.2 s at ``--rate`` steps/s
for ``--seconds`` on a fresh ``clawr1 up`` (warmed up with 2,000 steps first).

    .venv/bin/python -m bench.freshness_stages [--rate 100] [--seconds 15]

Prints p50 / p90 / p99 / max per stage; the JSON goes to bench/results/freshness_stages.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.bench_pipeline import Stack, step
from bench.common import percentile
from clawr1.gateway.client import GatewayClient
from tests.support.kafka import TopicFollower, read_topic

REPO = Path(__file__).resolve().parent.parent

RESULTS = REPO / "bench" / "results" / "freshness_stages.json"
Key = tuple[str, int]


def _key(record: dict[str, object]) -> Key:
    return str(record["trajectory_id"]), int(record["step_index"])  # type: ignore[call-overload]


class Watcher:
    """Notes, per step of ``run``, the wall time a ``read_committed`` reader first saw it on ``topic``."""

    def __init__(self, bootstrap: str, topic: str, run: str) -> None:
        self.seen: dict[Key, int] = {}
        self._follower = TopicFollower(bootstrap, [topic])
        self._run = run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        while not self._stop.is_set():
            records = self._follower.read(0.01)
            now = int(time.time() * 1000)
            for r in records:
                if str(r.record.get("trajectory_id", "")).startswith(self._run):
                    self.seen.setdefault(_key(r.record), now)

    def __enter__(self) -> Watcher:
        self._thread.start()
        time.sleep(3)  # the reader joins its group and reads what came before
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._follower.close()


def appended_at(bootstrap: str, topic: str, run: str) -> dict[Key, int]:
    """The append timestamp of the first message on ``topic`` carrying each step of ``run``."""
    found: dict[Key, int] = {}
    for r in read_topic(bootstrap, topic, 60):
        if str(r.record.get("trajectory_id", "")).startswith(run):
            found.setdefault(_key(r.record), r.timestamp_ms)
    return found


def post_steadily(api: str, run: str, rate: float, seconds: float) -> int:
    per_post = max(1, round(rate * 0.2))
    sent = 0
    with GatewayClient(api, batch_size=per_post, timeout_s=60) as client:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if (wait := started + sent / rate - time.monotonic()) > 0:
                time.sleep(wait)
            client.submit_steps([step(run, sent + i) for i in range(per_post)])
            sent += per_post
    return sent


def stages(stack: Stack, rate: float, seconds: float) -> dict[str, dict[str, int]]:
    with GatewayClient(stack.api, batch_size=100) as client:
        for k in range(20):
            client.submit_steps([step("warm", k * 100 + i) for i in range(100)])
    stack.wait_count("trajectory_id LIKE 'warm-%'", 2000, 300)
    run = "fs" + uuid.uuid4().hex[:8]
    with Watcher(stack.bootstrap, "clawr1.steps", run) as watcher:
        sent = post_steadily(stack.api, run, rate, seconds)
        stack.wait_count(f"trajectory_id LIKE '{run}-%'", sent, 300)
    rows = stack.sql("SELECT trajectory_id, step_index, toUnixTimestamp64Milli(created_at_ms) AS posted, "
                     "toUnixTimestamp64Milli(ingested_at) AS written "
                     f"FROM steps WHERE trajectory_id LIKE '{run}-%'")
    raw = appended_at(stack.bootstrap, "clawr1.raw.steps", run)
    out = appended_at(stack.bootstrap, "clawr1.steps", run)
    spans: dict[str, list[float]] = {name: [] for name in (
        "gateway -> raw topic", "raw topic -> worker output", "worker output -> committed",
        "committed -> sink wrote", "posted -> sink wrote")}
    for row in rows:
        key, posted, written = _key(row), int(row["posted"]), int(row["written"])
        if key not in raw or key not in out or key not in watcher.seen:
            continue
        spans["gateway -> raw topic"].append(raw[key] - posted)
        spans["raw topic -> worker output"].append(out[key] - raw[key])
        spans["worker output -> committed"].append(watcher.seen[key] - out[key])
        spans["committed -> sink wrote"].append(written - watcher.seen[key])
        spans["posted -> sink wrote"].append(written - posted)
    return {name: {"p50": int(percentile(v, 0.5)), "p90": int(percentile(v, 0.9)),
                   "p99": int(percentile(v, 0.99)), "max": int(max(v)), "steps": len(v)}
            for name, v in spans.items() if v}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="steps per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-fresh-") as tmp:
        stack = Stack(Path(tmp) / "stack")
        try:
            stack.wait_healthy()
            figures = stages(stack, args.rate, args.seconds)
        finally:
            stack.stop()
    for name, spans in figures.items():
        print(f"{name:28s} " + "  ".join(f"{k} {v}" for k, v in spans.items()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"rate": args.rate, "seconds": args.seconds, "stages_ms": figures},
                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
