"""The worker's stream logic alone, in this process: CPU and state writes per step, without Kafka.

A ``Processor`` over dict stores (``tests/unit/streams``' harness: a checkpoint flushes, the worker's
own messages are delivered to their partitions) takes ``bench_streams.py``'s black-box load (8-turn
conversations with engine token ids, event ids minted as the proxy mints them, a reward per call), the
conversations interleaved turn by turn as agents running at once send them, ``--group`` of them
rollouts of one task (same first messages), a checkpoint every ``--checkpoint`` events; or its white-box
load (``--load whitebox``: steps of 512 + 128 tokens in trajectories of ``--length`` 10, a checkpoint per
100); or GRPO rollouts (``--load rollouts``:
``bench_streams.rollout_steps``, groups of 8 rollouts of 8 turns whose prompts grow from 1,024 tokens
by 256 a turn, a checkpoint per 200 steps, as a rollout worker posts them). What it explains: where the
worker's CPU per step goes (``--profile``), and what a change does to it, run against two checkouts
alternately (this file imports the checkout it lies in)::

    .venv/bin/python -m bench.bench_processor [--load blackbox|whitebox|rollouts] [--steps 1600]
        [--length 10] [--group 1] [--repeat 3] [--checkpoint 40] [--profile]

Prints one JSON line: CPU ms per step of each repeat (process time), state writes per step (changelog
records the worker would produce) and internal hops per step.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from typing import Any

from bench.bench_streams import CODEC, conversation, reward_for, rollout_steps, whitebox_steps
from clawr1.schemas.codec import pack_record
from tests.support.stream_harness import CountingStore, Harness


def _decoded(schema: str, record: dict[str, Any]) -> dict[str, Any]:
    """As the worker sees a record: from an envelope (as the gateway and the proxy send them), every field
    present, its token ids int32 arrays (lists on checkouts before the worker read them so)."""
    message = CODEC.encode_batch(schema, [pack_record(schema, record)])
    try:
        return CODEC.decode_records(message, expect=schema, int_arrays=True)[0]
    except TypeError:  # an older checkout's codec
        return CODEC.decode_records(message, expect=schema)[0]


def blackbox_events(steps: int, group: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """Conversations of 8 calls; ``group`` of them at a time are rollouts of one task (same first
    messages, their own replies), as a GRPO group's agents send them."""
    calls = [c for n in range(max(1, steps // 8)) for c in conversation("bp", n, n // group)]
    calls.sort(key=lambda c: (c["request_started_ms"], c["event_id"]))  # turn by turn across agents
    events: list[tuple[str, dict[str, Any]]] = []
    for call in calls:
        events.append(("llm", _decoded("raw_llm_call", call)))
        events.append(("feedback", _decoded("feedback", reward_for(call["event_id"]))))
    return events


def whitebox_events(steps: int, length: int = 10) -> list[tuple[str, dict[str, Any]]]:
    return [("whitebox", _decoded("whitebox_step", r)) for r in whitebox_steps("wp", steps, length)]


def rollout_events(steps: int) -> list[tuple[str, dict[str, Any]]]:
    return [("whitebox", _decoded("whitebox_step", r)) for r in rollout_steps("rp", max(1, steps // 64))]


def run_once(events: list[tuple[str, dict[str, Any]]], checkpoint: int) -> tuple[float, int, int]:
    """CPU seconds, state writes and hops for the events through a fresh harness."""
    harness = Harness()
    started = time.process_time()
    for n, (kind, record) in enumerate(events, 1):
        if kind == "llm":
            harness.llm(record, record["conversation_key"])
        elif kind == "feedback":
            harness.feedback(record)
        else:
            harness.whitebox(record)
        if n % checkpoint == 0:
            harness.checkpoint()
            # The worker keeps no outputs past a checkpoint (harnesses before e6bd229 keep no nodes).
            for kept in (harness.steps, getattr(harness, "nodes", {})):
                kept.clear()
    harness.checkpoint()
    return time.process_time() - started, CountingStore.writes, harness.hops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=("blackbox", "whitebox", "rollouts"), default="blackbox")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--length", type=int, default=10, help="white-box steps per trajectory")
    parser.add_argument("--group", type=int, default=1,
                        help="black-box conversations per task: rollouts that share their first messages")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--checkpoint", type=int, default=0,
                        help="events per checkpoint (default 40 black-box events, 100 white-box steps)")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of one run")
    args = parser.parse_args()
    loads = {"whitebox": lambda: whitebox_events(args.steps, args.length),
             "blackbox": lambda: blackbox_events(args.steps, args.group),
             "rollouts": lambda: rollout_events(args.steps)}
    events = loads[args.load]()
    steps = sum(kind != "feedback" for kind, _ in events)
    checkpoint = args.checkpoint or {"blackbox": 40, "whitebox": 100, "rollouts": 200}[args.load]
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(run_once, events, checkpoint)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    runs = [run_once(events, checkpoint) for _ in range(args.repeat)]
    print(json.dumps({"load": args.load, "steps": steps, "checkpoint_events": checkpoint,
                      "cpu_ms_per_step": [round(cpu / steps * 1000, 3) for cpu, _, _ in runs],
                      "state_writes_per_step": round(runs[-1][1] / steps, 2),
                      "hops_per_step": round(runs[-1][2] / steps, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
