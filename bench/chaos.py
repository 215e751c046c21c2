"""Chaos bench: ``clawr1 up`` under sustained mixed load while its roles are killed one at a time.

Load (all on 127.0.0.1, bounded in count and time): an agent calling the stand-in engine through the
proxy's reverse port with the official openai SDK (streamed and plain, one fresh conversation per
call, so each answered call must become exactly one step), and a white-box agent posting step
batches through ``GatewayClient`` with a reward (feedback) for the first step of each batch.

Faults: SIGKILL of the worker, the proxy, the API and the broker; the full run adds a clean broker
restart, a paused broker (SIGSTOP/SIGCONT: Kafka slow, not gone), a full spool disk (a small tmpfs
mounted on the proxy's spool, root only), garbage produced to the raw topics (dead letters) and a
frozen worker (SIGSTOP for ``--freeze`` seconds: /healthz must name it once its group stops making
progress or it drops out of its group, and the supervisor must restart it; with ``--workers 2`` its
partitions are processed meanwhile by the other worker).

With ``--kafka-nodes 3`` the stack runs a local 3-broker cluster and the faults are the cluster's: one
broker SIGKILLed (the supervisor starts it again after its backoff), then a rolling restart (SIGTERM
to each broker in turn, the next once the last is back in sync). A probe posts one step at a time
without retries meanwhile, so the figures say how long the gateway refused (503) after each fault.

Figures: load held, faults with time to healthy, steps acknowledged vs in the pool, exact duplicates
and losses (both must be 0), dead letters, rewards joined, and how long the pool took to hold every
acknowledged step after the load stopped (at most ``--drain``). Run it::

    .venv/bin/python -m bench.chaos                   # full run -> bench/results/chaos.json
    .venv/bin/python -m bench.chaos --quick           # the SIGKILL subset that make test runs
    .venv/bin/python -m bench.chaos --kafka-nodes 3   # a broker lost, then a rolling restart
    .venv/bin/python -m bench.chaos --quick --runs 5 --whitebox-clients 2 --first-fault 20 --drain 120
                                                      # the stream-layer schedule: 5 runs in a row must pass
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from tests.support.chaos import (  # the harness the tests drive too
    FULL_EXTRAS,
    QUICK_FAULTS,
    Stack,
    cluster_plan,
    cluster_stack,
    fill_spool,
    freeze_worker,
    run_faults,
    spool_tmpfs,
)

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plan:
    quick: bool
    settle_s: float
    drain_s: float
    first_fault_s: float | None = None
    whitebox_clients: int = 1
    workers: int = 1
    freeze_s: float = 0.0  # > 0: also freeze a worker this long
    stall_s: float = 30.0
    kafka_nodes: int = 1  # > 1: break a local Kafka cluster instead


def run(plan: Plan, work_dir: Path) -> dict[str, object]:
    data_dir = work_dir / "data"
    clustered = plan.kafka_nodes > 1
    with spool_tmpfs(data_dir, wanted=not plan.quick and not clustered) as tmpfs:
        stack = (cluster_stack(data_dir, work_dir / "stack.log", plan.kafka_nodes) if clustered
                 else Stack(data_dir, work_dir / "stack.log", env={"CLAWR1_STALL_S": str(plan.stall_s)},
                            workers=plan.workers))
        try:
            startup = stack.start()
            faults = QUICK_FAULTS if plan.quick else QUICK_FAULTS + FULL_EXTRAS
            if tmpfs:
                faults = [*faults, ("spool full", fill_spool)]
            if plan.freeze_s > 0:
                faults = [*faults, ("freeze worker", partial(freeze_worker, seconds=plan.freeze_s))]
            result = run_faults(stack, cluster_plan(stack) if clustered else faults, plan.settle_s,
                                plan.drain_s, plan.first_fault_s, plan.whitebox_clients, probe=clustered)
        finally:
            exit_code = stack.stop()
    mode = f"{plan.kafka_nodes} brokers" if clustered else "quick" if plan.quick else "full"
    return {"mode": mode, "plan": asdict(plan), "startup_s": round(startup, 1), **result,
            "clean_stop_exit_code": exit_code, "spool_tmpfs": tmpfs}


def table(result: dict[str, object]) -> str:
    pool = result["pool"]
    load = result["load"]
    assert isinstance(pool, dict) and isinstance(load, dict) and isinstance(result["faults"], list)
    rows = [("load held (s)", result["load_s"]),
            ("proxy calls answered (streamed)",
             f"{load['proxy_calls_answered']} ({load['streamed_answered']})"),
            ("proxy calls refused during faults", load["proxy_calls_failed"]),
            ("gateway batches acked / failed", f"{load['batches_acked']} / {load['batches_failed']}")]
    rows += [(f"fault: {f['name']} -> healthy (s)", f["healthy_after_s"]) for f in result["faults"]]
    rows += [(f"fault: {f['name']} -> {figure}", value) for f in result["faults"]
             for figure, value in f["figures"].items()]
    rows += [("steps acked / in pool", f"{pool['steps_acked']} / {pool['steps_in_pool']}"),
             ("calls answered / captured", f"{pool['calls_answered']} / {pool['calls_captured']}"),
             ("exact duplicates (steps + calls)", pool["steps_duplicated"] + pool["calls_duplicated"]),
             ("lost (steps + calls)", pool["steps_lost"] + pool["calls_lost"]),
             ("rewards sent / joined", f"{pool['rewards_sent']} / {pool['rewards_joined']}"),
             ("all in the pool after the load stopped (s)", result["drained_s"]),
             ("dead letters", pool["dead_letters"]),
             ("clawr1 up stayed up / clean stop code", f"{result['stack_stayed_up']} / "
                                                        f"{result['clean_stop_exit_code']}")]
    return "\n".join(f"| {name} | {value} |" for name, value in [("figure", "value"), ("---", "---"), *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only SIGKILL each role once")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds of load between faults")
    parser.add_argument("--first-fault", type=float, default=None,
                        help="seconds of load before the first fault (default: --settle)")
    parser.add_argument("--drain", type=float, default=180.0,
                        help="seconds allowed, after the load stopped, for the pool to hold everything")
    parser.add_argument("--whitebox-clients", type=int, default=1, help="white-box clients posting at once")
    parser.add_argument("--workers", type=int, default=1, help="stream workers of the stack")
    parser.add_argument("--freeze", type=float, default=0.0,
                        help="also SIGSTOP a worker this many seconds")
    parser.add_argument("--stall", type=float, default=30.0, help="CLAWR1_STALL_S of the stack")
    parser.add_argument("--kafka-nodes", type=int, default=1,
                        help="break a local Kafka cluster instead (a broker killed, a rolling restart)")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs in a row, each on a fresh stack; all must pass")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "chaos.json")
    args = parser.parse_args(argv)
    plan = Plan(args.quick, args.settle, args.drain, args.first_fault, args.whitebox_clients, args.workers,
                args.freeze, args.stall, args.kafka_nodes)
    results = []
    for n in range(args.runs):
        work_dir = Path(tempfile.mkdtemp(prefix="clawr1-chaos-"))
        result = run(plan, work_dir)
        results.append(result)
        print(f"[chaos] run {n + 1}/{args.runs}:\n{table(result)}", flush=True)
        if not passed(result, plan.drain_s):
            print(f"[chaos] FAILED; the stack's log and data stay in {work_dir}", file=sys.stderr)
            break
        shutil.rmtree(work_dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results[0] if len(results) == 1 else results, indent=2) + "\n")
    return 0 if len(results) == args.runs and all(passed(r, plan.drain_s) for r in results) else 1


def passed(result: dict[str, object], drain_s: float) -> bool:
    """The bar: clawr1 up survived, nothing acknowledged was lost or doubled and all of it was in the pool
    within ``drain_s`` of the load stopping, and Ctrl-C stopped it cleanly."""
    pool = result["pool"]
    assert isinstance(pool, dict)
    drained = float(str(result["drained_s"])) <= drain_s
    return bool(result["stack_stayed_up"]) and result["clean_stop_exit_code"] == 0 and drained and not (
        pool["steps_lost"] or pool["calls_lost"] or pool["steps_duplicated"] or pool["calls_duplicated"])


if __name__ == "__main__":
    sys.exit(main())
