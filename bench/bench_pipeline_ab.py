"""Two checkouts (or two settings) side by side, on a machine other jobs load: each one's ``clawr1 up`` on its
own ports, all up at once, white-box loads alternated between them; per load, steps/s posted ->
queryable, Kafka messages and CPU per step by process (``bench_pipeline.py``'s measures), and per stack
its idle floor (its CPU while another stack worked) and its *busy* CPU per step (the stack's, the
broker's JIT threads and the floor at the load's own rate taken off). Under load a stack's CPU per step
doubles (the floor over a longer run, smaller checkpoints): only figures from one run compare. ``--fresh``:
then freshness (posted -> queryable, p50 and p99) at those steps/s, stacks alternated, ``--pairs`` times.

    .venv/bin/python -m bench.bench_pipeline_ab NAME=CHECKOUT NAME=CHECKOUT [...] [--steps 3000]
        [--pairs 4] [--warmup 2000] [--batch 100] [--length 10]
        [--env NAME:CLAWR1_STREAMS_COMMIT_INTERVAL_MS=250 ...] [--fresh 100,400 --fresh-seconds 8]

A checkout is a directory with this repository's code (``git worktree add`` or ``git archive | tar -x``,
with ``.cache`` linked for the broker's jars); its roles run on this venv with ``PYTHONPATH`` set to it.
The same checkout twice with ``--env`` compares settings. Each stack's log is kept in the work dir, which
is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import bench_pipeline
from bench.common import cpu_by_role

NOT_STACK = frozenset({"client", "engine"})


def start(name: str, checkout: Path, workdir: Path, env: dict[str, str]) -> bench_pipeline.Stack:
    """A healthy stack of ``checkout`` (tried again on a port another job took meanwhile)."""
    for attempt in range(4):
        stack = bench_pipeline.Stack(workdir / f"{name}{attempt}", env=env,
                                     kept_log=workdir / f"{name}{attempt}.log", repo=checkout)
        try:
            stack.wait_healthy()
            return stack
        except RuntimeError as exc:
            print(f"{name}: not healthy, again ({str(exc)[-200:]})", flush=True)
            stack.stop()
    raise SystemExit(f"{name}: no healthy stack in 4 tries")


def summary(name: str, runs: list[dict[str, Any]], floors: list[dict[str, float]]) -> dict[str, Any]:
    roles = floors[0] if floors else {}
    floor = {role: statistics.median(f.get(role, 0.0) for f in floors) for role in roles}
    floor_cores = sum(cores for role, cores in floor.items() if role not in NOT_STACK | {"broker_jit"})
    busy = [r["cpu_ms_per_step_stack_jit_done"] - 1000 * floor_cores / r["steps_per_s"] for r in runs]
    stack = statistics.median(r["cpu_ms_per_step_stack_jit_done"] for r in runs)
    return {"name": name, "steps_per_s": statistics.median(r["steps_per_s"] for r in runs),
            "cpu_ms_per_step_stack_jit_done": stack,
            "busy_ms_per_step": [round(b, 3) for b in busy], "busy_median": round(statistics.median(busy), 3),
            "idle_floor_cores": {role: round(c, 4) for role, c in floor.items() if c >= 0.0005},
            "messages_last_load": runs[-1]["messages"]}


def fresh(stacks: dict[str, bench_pipeline.Stack], rates: list[float],
          args: argparse.Namespace) -> dict[str, dict[float, dict[str, list[float]]]]:
    """Posted -> queryable p50 and p99 per stack and rate (``bench_pipeline.freshness``), alternated."""
    names = list(stacks)
    out: dict[str, dict[float, dict[str, list[float]]]] = {
        name: {rate: {"p50_ms": [], "p99_ms": []} for rate in rates} for name in names}
    for pair in range(args.pairs):
        for rate in rates:
            for name in names if pair % 2 == 0 else names[::-1]:
                run = bench_pipeline.freshness(stacks[name], rate, args.fresh_seconds)
                print(f"{pair} {name} at {rate:g} steps/s: freshness p50 {run['p50_ms']} ms, p99 "
                      f"{run['p99_ms']} ms ({run['offered_rate']} offered)", flush=True)
                for key in ("p50_ms", "p99_ms"):
                    out[name][rate][key].append(run[key])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", help="NAME=DIRECTORY, two or more")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--length", type=int, default=10, help="steps per trajectory")
    parser.add_argument("--env", action="append", default=[], help="NAME:VARIABLE=VALUE: one stack's setting")
    parser.add_argument("--fresh", default="", help="steps/s, comma-separated: freshness at each rate after "
                                                    "the loads, stacks alternated, --pairs times")
    parser.add_argument("--fresh-seconds", type=float, default=8.0)
    args = parser.parse_args()
    checkouts = dict(c.split("=", 1) for c in args.checkouts)
    envs: dict[str, dict[str, str]] = {name: {} for name in checkouts}
    for item in args.env:
        name, setting = item.split(":", 1)
        key, value = setting.split("=", 1)
        envs[name][key] = value
    workdir = Path(tempfile.mkdtemp(prefix="clawr1-bench-ab-"))
    print(f"work dir {workdir}", flush=True)
    stacks: dict[str, bench_pipeline.Stack] = {}
    try:
        for name, checkout in checkouts.items():
            stacks[name] = start(name, Path(checkout).resolve(), workdir, envs[name])
        for stack in stacks.values():
            bench_pipeline.whitebox_throughput(stack, args.warmup, args.batch, args.length)
        names = list(stacks)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        floors: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for pair in range(args.pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                idle = {o: (time.monotonic(), cpu_by_role(stacks[o].up.pid)) for o in names if o != name}
                run = bench_pipeline.whitebox_throughput(stacks[name], args.steps, args.batch, args.length)
                for other, (since, before) in idle.items():
                    after, seconds = cpu_by_role(stacks[other].up.pid), time.monotonic() - since
                    floors[other].append({role: (after[role] - before.get(role, 0.0)) / seconds
                                          for role in after})
                runs[name].append(run)
                by_process = " ".join(f"{role}={ms:.3f}"
                                      for role, ms in run["cpu_ms_per_step_by_process"].items() if ms >= 0.01)
                print(f"{pair} {name}: {run['steps_per_s']} steps/s, stack {run['cpu_ms_per_step_stack']} ms "
                      f"({run['cpu_ms_per_step_stack_jit_done']} without the JIT), "
                      f"{run['kafka_messages_per_step']} messages a step; {by_process}", flush=True)
        for name in names:
            print(summary(name, runs[name], floors[name]), flush=True)
        if args.fresh:
            print(json.dumps(fresh(stacks, [float(r) for r in args.fresh.split(",")], args)), flush=True)
    finally:
        for stack in stacks.values():
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
