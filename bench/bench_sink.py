"""The pool sink alone: CPU per step from ``clawr1.steps`` envelopes into the embedded pool, by the
columnar path (Arrow blocks, ``sinks/columns.py``) against the row path (row tuples, ``sinks/rows.py``)
in the same run.

Steps shaped as the white-box bench's (512 prompt + 128 response token ids with logprobs, 10-step
trajectories) are written once to a private broker as envelopes of ``--envelope`` records (100, as the
gateway's requests; the worker's envelopes hold one checkpoint's outputs for one partition, often a
few), with prefix-node envelopes of the same count beside them; then, alternating, a sink of each kind
reads them all into a fresh pool database (its own consumer group) and the CPU its thread spent is
divided by the steps (chDB's own threads, which insert and merge, are counted apart as the process's
remainder). ``--profile`` adds a cProfile (CPU time) of the sink thread of each kind's last round.

    .venv/bin/python -m bench.bench_sink [--steps 4000] [--rounds 3] [--envelope 100] [--profile DIR]

Results: bench/results/bench_sink.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from clawr1.broker.launcher import KafkaBroker
from clawr1.core.kafka_io import ensure_topics, make_producer
from clawr1.pool.store import PoolStore
from clawr1.schemas.codec import AvroCodec, pack_record
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.pool_sink import PoolSink
from tests.support.ports import free_port
from tests.support.records import record, step

REPO = Path(__file__).resolve().parent.parent

PARTITIONS = 4


def steps(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [step(f"s{i:07d}", 1, trajectory_id=f"t{i // 10:06d}", step_index=i % 10,
                 prompt_token_ids=rng.integers(0, 151_936, 512).tolist(),
                 response_token_ids=rng.integers(0, 151_936, 128).tolist(),
                 response_logprobs=(-rng.random(128)).tolist(), terminal=i % 10 == 9)
            for i in range(count)]


def nodes(count: int) -> list[dict[str, Any]]:
    return [record("prefix_node", scope_id=f"t{i // 10:06d}", scope_kind="trajectory", node_id=f"n{i}",
                   token_ids=list(range(64)), step_ids=[f"s{i:07d}"], version=1, total_tokens=640,
                   tree_tokens=64, forks=1, updated_at_ms=1_760_000_000_000) for i in range(count)]


def write_envelopes(bootstrap: str, config: SinkConfig, count: int, size: int) -> None:
    codec = AvroCodec()
    producer = make_producer(bootstrap)
    for topic, schema, records in ((config.steps_topic, "step", steps(count)),
                                   (config.prefix_nodes_topic, "prefix_node", nodes(count))):
        for n, at in enumerate(range(0, count, size)):
            value = codec.encode_batch(schema, [pack_record(schema, r) for r in records[at:at + size]])
            producer.produce(topic, value=value, key=f"k{n}".encode(), partition=n % PARTITIONS)
            producer.poll(0)
    assert producer.flush(60) == 0, "envelopes left unacknowledged"


def drain(bootstrap: str, pool_dir: Path, config: SinkConfig, count: int, columnar: bool,
          profile: cProfile.Profile | None) -> dict[str, float]:
    """One sink reads every envelope into a fresh pool database; its thread's and the process's CPU."""
    store = PoolStore(f"chdb://{pool_dir}", database=f"bench_{config.group_id.replace('-', '_')}")
    store.migrate()
    sink = PoolSink(bootstrap, store, config, AvroCodec(), PARTITIONS)
    if not columnar:
        sink.plans = {}  # every record by the row path: the baseline
    stop = threading.Event()
    spent: dict[str, float] = {}

    def run() -> None:
        started = time.thread_time()
        if profile is not None:
            profile.enable()
        sink.run(stop)
        if profile is not None:
            profile.disable()
        spent["thread"] = time.thread_time() - started

    process_before, wall_before = time.process_time(), time.monotonic()
    thread = threading.Thread(target=run, name="sink")
    thread.start()
    while sink.stats.rows.get("step_versions", 0) < count or sink.stats.rows.get(
            "prefix_node_versions", 0) < count:
        time.sleep(0.05)
    wall = time.monotonic() - wall_before
    stop.set()
    thread.join()
    process = time.process_time() - process_before
    assert store.query("SELECT count() AS n FROM steps")[0]["n"] == count
    store.close()
    return {"sink_thread_us_per_step": round(1e6 * spent["thread"] / count, 1),
            "chdb_threads_us_per_step": round(1e6 * (process - spent["thread"]) / count, 1),
            "wall_s": round(wall, 2), "flushes": sink.stats.flushes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--envelope", type=int, default=100, help="records per envelope")
    parser.add_argument("--profile", type=Path, help="write <DIR>/sink_<kind>.prof of the last round")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"rows": [], "columns": []}
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as scratch:
        broker = KafkaBroker(Path(scratch), port=free_port(), controller_port=free_port(), heap="768m")
        broker.start()
        try:
            base = SinkConfig(steps_topic="bench.steps", prefix_nodes_topic="bench.prefix_nodes",
                              dlq_topic="bench.dlq", feedback_topic="bench.feedback")
            ensure_topics(broker.bootstrap, [base.steps_topic, base.prefix_nodes_topic, base.dlq_topic,
                                             base.feedback_topic], PARTITIONS)
            write_envelopes(broker.bootstrap, base, args.steps, args.envelope)
            for n in range(args.rounds):
                for kind in ("rows", "columns"):
                    last = n == args.rounds - 1 and args.profile is not None
                    profile = cProfile.Profile(time.thread_time) if last else None
                    config = SinkConfig(**{**base.__dict__, "group_id": f"bench-{kind}-{n}"})
                    result = drain(broker.bootstrap, Path(scratch) / "pool", config, args.steps,
                                   kind == "columns", profile)
                    runs[kind].append(result)
                    print(f"round {n + 1} {kind}: {result}", flush=True)
                    if profile is not None:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        profile.dump_stats(str(args.profile / f"sink_{kind}.prof"))
        finally:
            broker.stop()
    ratios = [c["sink_thread_us_per_step"] / r["sink_thread_us_per_step"]
              for r, c in zip(runs["rows"], runs["columns"], strict=True)]
    summary = {kind: {key: statistics.median(run[key] for run in kind_runs) for key in kind_runs[0]}
               for kind, kind_runs in runs.items()}
    result = {"steps": args.steps, "envelope": args.envelope, "rounds": runs, "median": summary,
              "sink_thread_ratio_columns_to_rows": {"median": round(statistics.median(ratios), 3),
                                                    "range": [round(min(ratios), 3), round(max(ratios), 3)]}}
    print(json.dumps(result["median"]), json.dumps(result["sink_thread_ratio_columns_to_rows"]))
    out = REPO / "bench" / "results" / "bench_sink.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
