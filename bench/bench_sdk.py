"""Benchmark of the consumer SDK: steps/s and tokens/s a trainer loop receives, against a plain SELECT.

One embedded pool is seeded with synthetic ready steps (default 20,000 steps of 256 prompt + 128
response tokens with logprobs). Then, in the same run and on the same rows:

* ``plain_direct``: what a trainer does without the SDK: one ``SELECT`` of those rows and columns through
  clickhouse-connect (Arrow), then the same training arrays the SDK loop makes (``to_numpy()``: padded
  ids, masks, logprobs) for each slice of B rows; no offsets, no curation, one query for everything;
* ``plain_api``: the same through the pool API's ``POST /v1/sql`` (Arrow stream);
* ``select_direct`` / ``select_api``: the ``SELECT`` alone (the floor of reading those bytes at all, in
  Arrow, not yet training arrays);
* ``sdk_direct`` / ``sdk_api``: a trainer loop over ``PoolConsumer``: ``poll(max_steps=B)``,
  ``to_numpy()`` and ``commit()`` until the group is drained, then ``close()`` (which writes the last
  commits);
* ``plain_fetch_api`` / ``sdk_fetch_api`` (after the above, on groups added to the same pool):
  ``fetch_batch`` of ``--fetch-groups`` whole prompt groups (default 128 groups x 16 trajectories x 4 steps
  of 2,048 tokens: 8,192 steps), the time a trainer waits in the call, against one ``SELECT`` of the same
  rows over the same API as Arrow (``--fetch-groups 0`` leaves this out).

The headline ratio is ``sdk / plain`` (same transport, same rows, same columns, same arrays out): what
offsets, curation and batching cost a trainer. ``sdk / select`` is also printed. (Until the read-ahead
change the baseline was the ``SELECT`` alone: the SDK loop was charged for padding its batches into
arrays while the baseline stopped at an Arrow table, about a third of the baseline's time.)

``--history H`` first writes H older ready steps and starts every reader after them (the consumer seeks
to the time the measured steps began, the plain SELECT filters on ``ingested_at``): a long-running pool
whose trainers read only what is new.

The API is served by hypercorn in this
process, as ``clawr1 up`` serves the embedded pool to other processes.

Run: ``.venv/bin/python -m bench.bench_sdk [--steps N] [--batch B]``; the table is printed and the
figures are written to ``bench/results/bench_sdk.json``. The script also runs on an older SDK (a checkout
put first on ``PYTHONPATH``), for before/after figures on one machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
from fastapi import FastAPI

from clawr1.consumer_sdk import PoolConsumer, StepBatch
from clawr1.pool.api import pool_router
from clawr1.pool.sql import AnalystSql, SqlLimits
from clawr1.pool.store import PoolStore
from tests.support.asgi import serve_asgi

RESULTS = Path(__file__).resolve().parent / "results" / "bench_sdk.json"
VOCAB = 151_936
SELECT = ("SELECT * EXCEPT (prompt_messages, response_text, tool_calls_json) FROM steps WHERE ready = 1 "
          "AND ingested_at >= fromUnixTimestamp64Milli({floor:Int64}, 'UTC')")
SEED_COLUMNS = [
    "step_id", "version", "trajectory_id", "step_index", "prompt_id", "response_id", "source_kind",
    "token_provenance", "prompt_token_ids", "response_token_ids", "response_logprobs", "reward",
    "reward_status", "ready", "created_at_ms", "updated_at_ms",
]


def seed(store: PoolStore, steps: int, prompt_len: int, response_len: int, seed: int = 0,
         first: int = 0) -> None:
    """Ready steps ``first`` .. ``first + steps - 1`` written straight into the pool's step table, in
    inserts of 2,000 rows."""
    rng = np.random.default_rng(seed)
    for start in range(first, first + steps, 2000):
        rows = [
            [f"s{i:08d}", 1, f"t{i // 8}", i % 8, f"p{i // 8}", f"r{i}", "whitebox_agent", "engine",
             rng.integers(0, VOCAB, prompt_len).tolist(), rng.integers(0, VOCAB, response_len).tolist(),
             (-rng.random(response_len)).tolist(), float(rng.random()), "final", 1,
             1_760_000_000_000, 1_760_000_000_000]
            for i in range(start, min(start + 2000, first + steps))
        ]
        store.insert("step_versions", rows, SEED_COLUMNS)


def tokens_of(table: pa.Table) -> int:
    lengths = [np.asarray(table.column(c).combine_chunks().value_lengths()) for c in
               ("prompt_token_ids", "response_token_ids")]
    return int(sum(x.sum() for x in lengths))


def timed(fn: Callable[[], tuple[int, int]], repeats: int) -> dict[str, float]:
    """Best of ``repeats`` runs of ``fn`` (which returns steps and tokens delivered), with the CPU seconds
    the process spent in that run (steadier than wall time on a machine shared with other work)."""
    best: dict[str, float] = {}
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        steps, tokens = fn()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if not best or seconds < best["seconds"]:
            best = {"seconds": seconds, "cpu_seconds": cpu, "steps": steps, "tokens": tokens,
                    "steps_per_s": steps / seconds, "tokens_per_s": tokens / seconds}
    return best


def select_direct(dsn: str, floor_ms: int) -> pa.Table:
    with PoolStore(dsn) as store:
        table: pa.Table = store.query_arrow(SELECT, parameters={"floor": floor_ms})
    return table


def select_api(url: str, floor_ms: int) -> pa.Table:
    with httpx.Client(base_url=url, timeout=120) as client:
        body = {"query": SELECT, "format": "ArrowStream", "parameters": {"floor": floor_ms}}
        response = client.post("/v1/sql", json=body)
        response.raise_for_status()
    return pa.ipc.open_stream(response.content).read_all()


def read_only(table: pa.Table) -> tuple[int, int]:
    return table.num_rows, tokens_of(table)


def padded(table: pa.Table, batch_steps: int) -> tuple[int, int]:
    """The training arrays the SDK loop makes, for each slice of ``batch_steps`` rows."""
    steps = tokens = 0
    for start in range(0, table.num_rows, batch_steps):
        arrays = StepBatch(table.slice(start, batch_steps)).to_numpy()
        steps += len(arrays.step_ids)
        tokens += int(arrays.attention_mask.sum())
    return steps, tokens


def trainer_loop(source: str, group: str, batch_steps: int, floor_ms: int,
                 read_ahead: int | None = None, sync: bool = False) -> tuple[int, int]:
    """What a trainer does per batch: poll, pad to arrays, commit; then close (which writes the last
    commits). Returns steps and tokens received."""
    steps = tokens = 0
    options = {} if read_ahead is None else {"read_ahead": read_ahead}
    with PoolConsumer(source, group, **options) as consumer:
        if floor_ms:
            consumer.seek(floor_ms)
        while batch := consumer.poll(max_steps=batch_steps):
            arrays = batch.to_numpy()
            steps += len(batch)
            tokens += int(arrays.attention_mask.sum())
            if sync:
                consumer.commit(sync=True)
            else:
                consumer.commit()  # (so the same bench also runs on the SDK before background commits)
    return steps, tokens


def _lists(rows: int, width: int, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32)),
                                    pa.array(values))


def seed_groups(store: PoolStore, args: argparse.Namespace) -> list[list[str]]:
    """``--fetch-batches`` sets of ``--fetch-groups`` ready GRPO groups (``--fetch-rollouts`` trajectories
    of ``--fetch-turns`` steps each, ``--fetch-tokens`` tokens a step, a quarter of them response with
    logprobs), written straight into the pool's step table as Arrow; returns each set's group ids, the
    first set created first (what ``fetch_batch`` serves first)."""
    rng = np.random.default_rng(2)
    per_group = args.fetch_rollouts * args.fetch_turns
    response = args.fetch_tokens // 4
    prompt = args.fetch_tokens - response
    sets: list[list[str]] = []
    for b in range(args.fetch_batches):
        sets.append([f"b{b}-g{g:05d}" for g in range(args.fetch_groups)])
        for g0 in range(0, args.fetch_groups, max(1, 1024 // per_group)):
            group_ids = range(g0, min(g0 + max(1, 1024 // per_group), args.fetch_groups))
            n = len(group_ids) * per_group
            i = np.arange(n)
            group = np.repeat(np.asarray(group_ids), per_group)
            trajectory = group * args.fetch_rollouts + (i % per_group) // args.fetch_turns
            turn = i % args.fetch_turns
            at_ms = np.full(n, 1_760_000_000_000 + b * 1_000_000, np.int64)
            created = pa.array(at_ms).cast(pa.timestamp("ms", "UTC"))
            table = pa.table({
                "step_id": pa.array([f"b{b}-s{t}-{k}" for t, k in zip(trajectory, turn, strict=True)]),
                "version": pa.array(np.ones(n, np.int64)),
                "trajectory_id": pa.array([f"b{b}-t{t}" for t in trajectory]),
                "step_index": pa.array(turn.astype(np.int32)),
                "prompt_group_id": pa.array([f"b{b}-g{g:05d}" for g in group]),
                "prompt_group_size": pa.array(np.full(n, args.fetch_rollouts, np.int32)),
                "prompt_id": pa.array([f"p{b}-{g}" for g in group]),
                "response_id": pa.array([f"r{b}-{t}-{k}" for t, k in zip(trajectory, turn, strict=True)]),
                "source_kind": pa.array(["whitebox_agent"] * n), "token_provenance": pa.array(["engine"] * n),
                "prompt_token_ids": _lists(n, prompt, rng.integers(0, VOCAB, n * prompt, np.uint32)),
                "response_token_ids": _lists(n, response, rng.integers(0, VOCAB, n * response, np.uint32)),
                "response_logprobs": _lists(n, response, -rng.random(n * response)),
                "reward": pa.array(rng.random(n)), "reward_status": pa.array(["final"] * n),
                "terminal": pa.array((turn == args.fetch_turns - 1).astype(np.uint8)),
                "ready": pa.array(np.ones(n, np.uint8)), "created_at_ms": created, "updated_at_ms": created,
            })
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            store.insert_raw("step_versions", sink.getvalue().to_pybytes(), "ArrowStream", table.column_names)
    return sets


FETCHED = ("SELECT * EXCEPT (prompt_messages, response_text, tool_calls_json) FROM steps "
           "WHERE trajectory_id IN {trajectories:Array(String)} ORDER BY trajectory_id, step_index")
"""The plain read of a batch: its trajectories by primary key, as a trainer that knows them would read."""


def fetch_section(args: argparse.Namespace, url: str, groups: list[list[str]]) -> dict[str, Any]:
    """``fetch_batch`` of the first set of groups over the API (the time the trainer waits in the call)
    against one ``SELECT`` of the same rows over the same API as Arrow, by primary key; best of
    ``--repeats`` each. Their ratios are times (SDK over plain; 2 or less is the goal), not rates."""
    steps = args.fetch_groups * args.fetch_rollouts * args.fetch_turns
    trajectories = [f"b0-t{t}" for t in range(args.fetch_groups * args.fetch_rollouts)]
    plain: dict[str, float] = {}
    sdk: dict[str, float] = {}
    for run in range(args.repeats):
        started, cpu = time.perf_counter(), time.process_time()
        with httpx.Client(base_url=url, timeout=600) as client:
            body = {"query": FETCHED, "format": "ArrowStream", "parameters": {"trajectories": trajectories}}
            response = client.post("/v1/sql", json=body)
            response.raise_for_status()
        table = pa.ipc.open_stream(response.content).read_all()
        figures = {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
                   "steps": table.num_rows, "tokens": tokens_of(table)}
        if not plain or figures["seconds"] < plain["seconds"]:
            plain = figures
        with PoolConsumer(url, f"fetch-{run}") as consumer:
            started, cpu = time.perf_counter(), time.process_time()
            batch = consumer.fetch_batch(args.fetch_groups, n_rollouts=args.fetch_rollouts)
            figures = {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
                       "steps": len(batch), "tokens": tokens_of(batch.to_arrow())}
            if sorted({str(s.prompt_group_id) for s in batch}) != groups[0]:
                raise RuntimeError("fetch_batch did not serve the first groups")
            consumer.commit()
        if not sdk or figures["seconds"] < sdk["seconds"]:
            sdk = figures
    for name, figures in (("plain", plain), ("sdk", sdk)):
        if figures["steps"] != steps:
            raise RuntimeError(f"fetch {name} read {figures['steps']} of {steps} steps")
        figures.update(steps_per_s=figures["steps"] / figures["seconds"],
                       tokens_per_s=figures["tokens"] / figures["seconds"])
    return {"plain_fetch_api": plain, "sdk_fetch_api": sdk}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-sdk-") as tmp:
        dsn = f"chdb://{Path(tmp).resolve() / 'pool'}"
        store = PoolStore(dsn)
        api_store = PoolStore(dsn)
        try:
            store.migrate()
            started = time.perf_counter()
            floor_ms = 0
            if args.history:
                seed(store, args.history, args.prompt_tokens, args.response_tokens, seed=1, first=args.steps)
                time.sleep(0.01)
                floor_ms = int(time.time() * 1000)
            seed(store, args.steps, args.prompt_tokens, args.response_tokens)
            seed_s = time.perf_counter() - started
            app = FastAPI()
            limits = SqlLimits(max_execution_time=600,
                               max_result_rows=max(100_000, args.steps + args.history + 1),
                               max_result_bytes=8 * 1024**3)
            app.include_router(pool_router(api_store, AnalystSql(dsn, api_store.database, limits)))
            with serve_asgi(app) as server:
                url = server.url
                groups = iter(range(1_000_000))  # a fresh consumer group per run: each run drains all

                def loop(source: str) -> Callable[[], tuple[int, int]]:
                    return lambda: trainer_loop(source, f"bench-{next(groups)}", args.batch, floor_ms,
                                                args.read_ahead, args.sync_commits)

                results = {
                    "select_direct": timed(lambda: read_only(select_direct(dsn, floor_ms)), args.repeats),
                    "select_api": timed(lambda: read_only(select_api(url, floor_ms)), args.repeats),
                    "plain_direct": timed(lambda: padded(select_direct(dsn, floor_ms), args.batch),
                                          args.repeats),
                    "plain_api": timed(lambda: padded(select_api(url, floor_ms), args.batch), args.repeats),
                    "sdk_direct": timed(loop(dsn), args.repeats),
                    "sdk_api": timed(loop(url), args.repeats),
                }
                fetch = fetch_section(args, url, seed_groups(store, args)) if args.fetch_groups else {}
        finally:
            api_store.close()
            store.close()
    for name, figures in results.items():
        if figures["steps"] != args.steps:
            raise RuntimeError(f"{name} delivered {figures['steps']} of {args.steps} steps")
    rate = {name: figures["steps_per_s"] for name, figures in results.items()}
    cpu = {name: figures["cpu_seconds"] for name, figures in results.items()}
    ratios = {
        "sdk_direct_vs_plain_direct": rate["sdk_direct"] / rate["plain_direct"],
        "sdk_api_vs_plain_api": rate["sdk_api"] / rate["plain_api"],
        "sdk_direct_vs_select_direct": rate["sdk_direct"] / rate["select_direct"],
        "sdk_api_vs_select_api": rate["sdk_api"] / rate["select_api"],
        "sdk_api_vs_sdk_direct": rate["sdk_api"] / rate["sdk_direct"],
        "cpu_sdk_direct_vs_plain_direct": cpu["plain_direct"] / cpu["sdk_direct"],
        "cpu_sdk_api_vs_plain_api": cpu["plain_api"] / cpu["sdk_api"],
    }
    if fetch:
        # A time, not a rate: how long the trainer waits in fetch_batch per plain read of the same rows.
        sdk_fetch, plain_fetch = fetch["sdk_fetch_api"], fetch["plain_fetch_api"]
        ratios["fetch_time_sdk_api_over_plain_api"] = sdk_fetch["seconds"] / plain_fetch["seconds"]
        ratios["fetch_cpu_sdk_api_over_plain_api"] = sdk_fetch["cpu_seconds"] / plain_fetch["cpu_seconds"]
    return {
        "config": {"steps": args.steps, "history": args.history, "batch": args.batch,
                   "read_ahead": args.read_ahead, "sync_commits": args.sync_commits,
                   "prompt_tokens": args.prompt_tokens,
                   "response_tokens": args.response_tokens, "repeats": args.repeats, "seed_seconds": seed_s,
                   "fetch": {"batches": args.fetch_batches, "groups": args.fetch_groups,
                             "rollouts": args.fetch_rollouts, "turns": args.fetch_turns,
                             "tokens": args.fetch_tokens}},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "results": {**results, **fetch},
        "ratios": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="consumer SDK throughput against a plain SELECT")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=512, help="max_steps per poll")
    parser.add_argument("--read-ahead", type=int, default=None,
                        help="PoolConsumer(read_ahead=...); default: the SDK's default; 1: no read-ahead")
    parser.add_argument("--sync-commits", action="store_true",
                        help="commit(sync=True): every commit is written before the loop goes on")
    parser.add_argument("--history", type=int, default=0, help="older ready steps that every reader skips")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per figure")
    parser.add_argument("--fetch-groups", type=int, default=128,
                        help="fetch_batch section: prompt groups per batch (0: no fetch section)")
    parser.add_argument("--fetch-rollouts", type=int, default=16, help="trajectories per group")
    parser.add_argument("--fetch-turns", type=int, default=4, help="steps per trajectory")
    parser.add_argument("--fetch-tokens", type=int, default=2048, help="tokens per step (a quarter response)")
    parser.add_argument("--fetch-batches", type=int, default=2, help="batches of groups in the pool")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report = run(args)
    print(f"{'path':<16}{'seconds':>10}{'cpu s':>8}{'steps/s':>12}{'Mtokens/s':>12}")
    for name, f in report["results"].items():
        print(f"{name:<16}{f['seconds']:>10.3f}{f['cpu_seconds']:>8.2f}{f['steps_per_s']:>12.0f}"
              f"{f['tokens_per_s'] / 1e6:>12.2f}")
    for name, value in report["ratios"].items():
        print(f"{name:<34}{value:>8.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, sort_keys=True))
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
