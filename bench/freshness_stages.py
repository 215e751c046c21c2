"""Where a white-box step's posted -> written time goes, stage by stage, at a steady rate.

For each step: the gateway's receive (``created_at_ms``), its raw record's append to ``clawr1.raw.steps``
and the worker's output append to ``clawr1.steps`` (message timestamps), the moment a ``read_committed``
reader in this process saw that output (its transaction committed), and the sink's write
(``ingested_at``). All on this machine's clock. Steps are posted every 0.2 s at ``--rate`` steps/s
for ``--seconds`` on a fresh ``clawr1 up`` (warmed up with 2,000 steps first).

    .venv/bin/python bench/freshness_stages.py [--rate 100] [--seconds 15]

Prints p50 / p90 / p99 / max per stage; the JSON goes to bench/results/freshness_stages.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_pipeline import Stack, step  # noqa: E402
from bench.common import percentile  # noqa: E402
from clawr1.core.kafka_io import make_consumer  # noqa: E402
from clawr1.gateway.client import GatewayClient  # noqa: E402
from clawr1.schemas.codec import codec_for  # noqa: E402

RESULTS = REPO / "bench" / "results" / "freshness_stages.json"
Key = tuple[str, int]


def _key(record: dict[str, object]) -> Key:
    return str(record["trajectory_id"]), int(record["step_index"])  # type: ignore[call-overload]


class Watcher:
    """Notes, per step of ``run``, the wall time a ``read_committed`` reader first saw it on ``topic``."""

    def __init__(self, bootstrap: str, topic: str, run: str) -> None:
        self.seen: dict[Key, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(bootstrap, topic, run), daemon=True)

    def _follow(self, bootstrap: str, topic: str, run: str) -> None:
        codec = codec_for("")
        consumer = make_consumer(bootstrap, f"bench-watch-{uuid.uuid4().hex[:8]}",
                                 **{"auto.offset.reset": "latest", "fetch.wait.max.ms": 10})
        consumer.subscribe([topic])
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.05)
                if message is None or message.error():
                    continue
                now = int(time.time() * 1000)
                for record in codec.decode_all(message.value())[1]:
                    if str(record.get("trajectory_id", "")).startswith(run):
                        self.seen.setdefault(_key(record), now)
        finally:
            consumer.close()

    def __enter__(self) -> Watcher:
        self._thread.start()
        time.sleep(3)  # the reader joins its group and takes the latest offsets first
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def appended_at(bootstrap: str, topic: str, run: str) -> dict[Key, int]:
    """The append timestamp of the first message on ``topic`` carrying each step of ``run``."""
    codec = codec_for("")
    consumer = make_consumer(bootstrap, f"bench-read-{uuid.uuid4().hex[:8]}")
    consumer.subscribe([topic])
    found: dict[Key, int] = {}
    quiet_since = time.monotonic()
    try:
        while time.monotonic() - quiet_since < 5:
            for message in consumer.consume(500, 0.5):
                if message.error():
                    continue
                quiet_since = time.monotonic()
                for record in codec.decode_all(message.value())[1]:
                    if str(record.get("trajectory_id", "")).startswith(run):
                        found.setdefault(_key(record), message.timestamp()[1])
    finally:
        consumer.close()
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
