"""End to end as a user measures it: posted (or proxied) -> queryable in the pool, against Kafka's own
round trip of same-size messages on the same broker, in the same run.

- baseline: a confluent-kafka producer sends N (at least 20,000) messages the size of one encoded
  white-box step to a fresh topic and a consumer reads them all back;
  msgs/s = N / (last consumed - first produced).
- white-box: N steps of 512 prompt + 128 response token ids posted to the gateway in batches (``--batch``,
  and each size of ``--batches``), timed from the first POST until ``count()`` of them in ``steps``
  equals N; steps/s and the ratio to the baseline.
- the same with trajectories of ``--long`` steps (default 200): per-step cost against length.
- rollouts (``--rollouts`` steps, default 3,072): GRPO groups of 8 rollouts of 8 turns whose prompts
  grow from 1,024 tokens by each turn's 128-token reply and 128-token tool output (2,048 tokens per step
  on average, reply included; a reward on each rollout's last turn), posted trajectory after trajectory
  in requests of ``--rollout-batch`` (200), as a rollout worker posts finished rollouts: what the prefix
  tree and the state see in training.
- messages: for each run, the messages every topic of the stack gained (offsets, transaction markers
  included), per step, and the CPU each process of the stack (and this client) spent per step, and
  their sum over the stack (``cpu_ms_per_step_stack``: every process but this client and the engine).
  The broker's JIT compiler threads are their own role, ``broker_jit``: they kept compiling through
  16 alternating loads of 4,000 steps and 400 calls (6 minutes; 0.1-0.2 ms per white-box step and
  0.6-0.9 ms per call at the end, against 0.15-0.2 and 1.4-2.1 ms for the rest of the broker), a
  one-time cost of a freshly started JVM that a long-running broker has paid; so the sum is also given
  without them (``cpu_ms_per_step_stack_jit_done``).
- workers (``--workers 2``): the main white-box load, twice, on a second stack with that many workers:
  the workers' CPU per step (the mean of the two) against one worker's (the mean of the main load and
  the same load in the ``--batches`` sizes, when those include ``--batch``). One load per stack read
  anywhere from 1.0x to 1.5x on this 2-core machine; alternating stacks read 1.10x on the means.
- black-box: M chat calls with the official openai SDK through the proxy's reverse port in front of the
  stand-in engine, made by ``--agents`` agents at once (each its own client, one call after another),
  timed from the first call until all M steps are queryable; with the same messages and CPU figures
  per call (the stand-in engine's CPU as ``engine``). One agent alone measures a call's latency, not
  what the stack can take. With ``--turns N`` (e.g. 20) the same again as conversations of N calls, each
  sending the conversation so far (a 2 KB system prompt, then per turn the engine's reply and a 1.5 KB
  tool output): what the proxy's record building, the worker and the pool see from real agents.
- freshness: steps posted one batch at a time at fixed rates (default 25%, 50% and 80% of the measured
  white-box capacity, and a steady 100 steps/s); per step ``ingested_at - created_at_ms`` (gateway
  receive -> sink insert, both on this machine's clock), p50 and p99.

The whole stack is the real one (``clawr1 up``: broker, API with sink, stream worker, proxy) on a
private data dir and free ports, torn down at the end. Before anything is timed, ``--warmup`` steps and
a tenth as many calls go through it uncounted: on a cold stack the broker's first load cost it 2.5x the
CPU per step of the same load run again (its JIT compiling, its new segments), which a running
deployment does not pay.

    .venv/bin/python -m bench.bench_pipeline [--steps 4000] [--calls 800] [--agents 8] [--batch 100]
        [--batches 1,10,100,500] [--seconds 10] [--long 200] [--rollouts 3072] [--rollout-batch 200]
        [--warmup 4000] [--workers 2] [--kafka-nodes 1] [--turns 1]

``--kafka-nodes 3`` runs the stack on a local 3-broker cluster (every topic on 3 brokers, 2 in sync):
the ``broker`` CPU is then the three brokers' together, replication included.

Results: bench/results/bench_pipeline.json (``bench_pipeline_<N>_brokers.json`` on N brokers), and each
stack's log (``bench_pipeline_stack_<one|many>.log``: a role the supervisor restarted says why there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.bench_streams import posted_rollouts
from bench.common import (
    cpu_by_role,
    percentile,
    process_cpu_s,
    settled_message_counts,
)
from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer
from clawr1.gateway.client import GatewayClient
from clawr1.schemas.codec import codec_for
from tests.support.ports import free_port, free_ports

REPO = Path(__file__).resolve().parent.parent

PROMPT_TOKENS, RESPONSE_TOKENS = 512, 128
RESULTS = REPO / "bench" / "results" / "bench_pipeline.json"
# What generates the load rather than carries it: this client and the stand-in LLM engine.
LOAD_ROLES = frozenset({"client", "engine"})


def step(run: str, n: int, length: int = 10) -> dict[str, Any]:
    """One white-box step; trajectories of ``length`` steps so linking and trees see realistic shapes."""
    return {"trajectory_id": f"{run}-t{n // length}", "step_index": n % length,
            "prompt_token_ids": [(n * 31 + i) % 32_000 for i in range(PROMPT_TOKENS)],
            "response_token_ids": [(n * 17 + i) % 32_000 for i in range(RESPONSE_TOKENS)],
            "response_logprobs": [-0.5] * RESPONSE_TOKENS, "agent": "bench"}


class Stack:
    """``clawr1 up`` on a private data dir and free ports, with the stand-in engine as upstream; ``env``:
    settings of the stack's own; its log is kept as ``kept_log`` (default: in bench/results/, by the
    work dir's name); ``repo``: the checkout it runs (another one: an earlier version, side by side)."""

    def __init__(self, workdir: Path, kafka_nodes: int = 1, workers: int = 1,
                 env: Mapping[str, str] | None = None, kept_log: Path | None = None,
                 repo: Path = REPO) -> None:
        self.api_port, self.kafka_port = free_port(), free_ports(kafka_nodes)
        self.reverse_port, self.engine_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.bootstrap = ",".join(f"127.0.0.1:{self.kafka_port + i}" for i in range(kafka_nodes))
        workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = workdir / "data"
        env = {**os.environ, **(env or {}), "CLAWR1_DATA_DIR": str(self.data_dir), "PYTHONPATH": str(repo)}
        env.pop("CLAWR1_KAFKA_BOOTSTRAP", None)
        clawr1 = [sys.executable, "-m", "clawr1.cli"]
        self.engine = subprocess.Popen([*clawr1, "standin-engine", "--port", str(self.engine_port)], cwd=repo,
                                       env=env, stdout=(workdir / "engine.log").open("wb"),
                                       stderr=subprocess.STDOUT)
        self.up = subprocess.Popen(
            [*clawr1, "up", "--api-port", str(self.api_port), "--kafka-port", str(self.kafka_port),
             "--kafka-nodes", str(kafka_nodes),
             "--proxy-port", str(free_port()), "--reverse-port", str(self.reverse_port),
             "--compat-port", str(free_port()),
             "--upstream", f"http://127.0.0.1:{self.engine_port}", "--workers", str(workers)],
            cwd=repo, env=env, stdout=(workdir / "stack.log").open("wb"), stderr=subprocess.STDOUT)
        self.log = workdir / "stack.log"
        self.kept_log = kept_log or RESULTS.with_name(f"bench_pipeline_stack_{workdir.name}.log")

    def wait_healthy(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.up.poll() is not None:
                raise RuntimeError("stack exited:\n" + self.log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(f"{self.api}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError("stack not healthy:\n" + self.log.read_text(errors="replace")[-3000:])

    def sql(self, query: str) -> list[dict[str, Any]]:
        reply = httpx.post(f"{self.api}/v1/sql", json={"query": query}, timeout=60)
        reply.raise_for_status()
        return [json.loads(line) for line in reply.text.splitlines() if line]

    def count(self, where: str) -> int:
        return int(self.sql(f"SELECT count() AS n FROM steps WHERE {where}")[0]["n"])

    def wait_count(self, where: str, expected: int, timeout: float) -> float:
        """Monotonic time at which ``expected`` steps matching ``where`` are queryable."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(where) >= expected:
                return time.monotonic()
            time.sleep(0.1)
        raise RuntimeError(f"only {self.count(where)} of {expected} steps ({where}) reached the pool")

    def stop(self) -> None:
        """Stop the stack; its log (restarts and their reasons) is kept in bench/results/."""
        try:
            self._stop()
        finally:
            self.kept_log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log, self.kept_log)

    def _stop(self) -> None:
        for process in (self.up, self.engine):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in (self.up, self.engine):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def kafka_round_trip(bootstrap: str, n: int, size: int) -> float:
    """msgs/s of produce + consume of ``n`` messages of ``size`` bytes on a fresh topic."""
    topic = f"bench.pipeline.baseline.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic], partitions=4)
    consumer = make_consumer(bootstrap, f"bench-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    consumer.poll(1.0)
    payload = os.urandom(size)
    producer = make_producer(bootstrap)
    started = time.monotonic()
    for i in range(n):
        producer.produce(topic, key=str(i).encode(), value=payload)
        producer.poll(0)
    producer.flush(60)
    seen = 0
    deadline = time.monotonic() + 120
    while seen < n and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(1000, 1.0) if not m.error())
    elapsed = time.monotonic() - started
    consumer.close()
    if seen < n:
        raise RuntimeError(f"baseline consumed {seen} of {n}")
    return n / elapsed


def topic_counts(bootstrap: str) -> dict[str, int]:
    """Messages in each of the stack's topics (raw, internal, outputs, changelogs)."""
    return settled_message_counts(bootstrap, lambda name: None if name.startswith(("__", "bench.")) else name)


@dataclass(frozen=True)
class Costs:
    """The stack's topic offsets and CPU by process at one moment, to charge a run's work with."""

    messages: dict[str, int]
    cpu_s: dict[str, float]

    @classmethod
    def now(cls, stack: Stack) -> Costs:
        cpu = {**cpu_by_role(stack.up.pid), "engine": process_cpu_s(stack.engine.pid),
               "client": time.process_time()}  # this bench's own polling for the count included
        return cls(topic_counts(stack.bootstrap), cpu)

    def per_unit_since(self, start: Costs, units: int, unit: str) -> dict[str, Any]:
        cpu_ms = {role: round(1000 * (self.cpu_s[role] - start.cpu_s.get(role, 0.0)) / units, 3)
                  for role in self.cpu_s}
        per_topic = {name: self.messages[name] - start.messages.get(name, 0) for name in sorted(self.messages)
                     if self.messages[name] != start.messages.get(name, 0)}
        by_cost = dict(sorted(cpu_ms.items(), key=lambda kv: -kv[1]))
        stack = sum(ms for role, ms in cpu_ms.items() if role not in LOAD_ROLES)
        return {f"kafka_messages_per_{unit}": round(sum(per_topic.values()) / units, 2),
                "messages": per_topic, f"cpu_ms_per_{unit}_by_process": by_cost,
                f"cpu_ms_per_{unit}_stack": round(stack, 3),
                # What a broker that has finished compiling its hot paths would cost (see jit_cpu_s).
                f"cpu_ms_per_{unit}_stack_jit_done": round(stack - cpu_ms.get("broker_jit", 0.0), 3)}


def whitebox_throughput(stack: Stack, n: int, batch: int, length: int = 10) -> dict[str, Any]:
    """Steps/s posted -> queryable, and the Kafka messages and CPU each step cost."""
    run = "bw" + uuid.uuid4().hex[:8]
    return {**posted_throughput(stack, run, [step(run, i, length) for i in range(n)], batch),
            "trajectory_length": length}


def rollouts_throughput(stack: Stack, n: int, batch: int) -> dict[str, Any]:
    """The same for GRPO rollouts (``bench_streams.rollout_steps``: groups of 8 rollouts of 8 turns,
    prompts growing from 1,024 tokens by 256 a turn) as a rollout worker posts them."""
    run = "br" + uuid.uuid4().hex[:8]
    steps = posted_rollouts(run, max(1, n // 64))
    tokens = sum(len(s["prompt_token_ids"]) + len(s["response_token_ids"]) for s in steps)
    return {**posted_throughput(stack, run, steps, batch), "tokens_per_step": round(tokens / len(steps))}


def posted_throughput(stack: Stack, run: str, steps: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """``steps`` (trajectories named ``<run>-...``) posted in requests of ``batch``: steps/s posted ->
    queryable, and the Kafka messages and CPU each step cost."""
    n = len(steps)
    before = Costs.now(stack)
    with GatewayClient(stack.api, batch_size=batch, timeout_s=120) as client:
        started = time.monotonic()
        client.submit_steps(steps)
        accepted = time.monotonic()
    done = stack.wait_count(f"trajectory_id LIKE '{run}-%'", n, timeout=600)
    return {"steps": n, "batch": batch, "accept_s": round(accepted - started, 3),
            "queryable_s": round(done - started, 3), "steps_per_s": round(n / (done - started), 1),
            **Costs.now(stack).per_unit_since(before, n, "step")}


SYSTEM_PROMPT = "You are a coding agent. Read files, run commands, fix the failing tests. " * 30
"""A multi-turn agent's system prompt (~2 KB)."""


def tool_output(i: int) -> str:
    """What a turn's command printed (~1.5 KB of code): what an agent sends back as the next turn."""
    return "\n".join(f"    value_{i}_{line} = compute(items[{line}], key='k{line}')  # step {i}"
                     for line in range(24))


def agent_calls(reverse_port: int, name: str, indices: Iterable[int], turns: int, sizes: list[int], *,
                stream: bool = False, think_s: float = 0.0) -> None:
    """One agent (its own openai SDK client, as ``X-Claw-Agent: name``) calling the proxy's reverse port
    once per item of ``indices``, one call after another (``think_s`` apart), in conversations of
    ``turns`` calls that each send the conversation so far (``turns`` 1: a short one-message call); each
    answered call appends its messages' JSON size to ``sizes``. ``stream``: streamed calls."""
    from openai import OpenAI

    with OpenAI(base_url=f"http://127.0.0.1:{reverse_port}/v1", api_key="sk-bench",
                default_headers={"X-Claw-Agent": name}) as client:
        history: list[dict[str, str]] = []
        size = 0  # of the history as JSON, grown by each message added (not dumped again per call)

        def add(*messages: dict[str, str]) -> None:
            nonlocal size
            history.extend(messages)
            size += sum(len(json.dumps(m)) for m in messages)

        for n, i in enumerate(indices):
            if n % turns == 0:
                history, size = [], 0
                add({"role": "system", "content": "bench" if turns == 1 else SYSTEM_PROMPT},
                    {"role": "user", "content": f"{name} task {i}"})
            if stream:
                chunks = client.chat.completions.create(model="standin", messages=history, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(model="standin", messages=history)
                text = reply.choices[0].message.content or ""
            sizes.append(size + 2 * len(history))  # the list's brackets and separators
            add({"role": "assistant", "content": text}, {"role": "user", "content": tool_output(i)})
            if think_s:
                time.sleep(think_s)


def blackbox_throughput(stack: Stack, calls: int, agents: int, turns: int = 1) -> dict[str, Any]:
    """Calls/s proxied -> queryable with ``agents`` agents calling at once, and each call's costs. With
    ``turns`` > 1 each agent holds conversations of that many calls, each sending the conversation so
    far (the engine's replies and a tool output per turn) as agents do."""
    agent = "bb" + uuid.uuid4().hex[:8]
    sizes: list[int] = []

    def one_agent(index: int, name: str = agent) -> None:
        agent_calls(stack.reverse_port, name, range(index, calls, agents), turns, sizes)

    # One call alone first, not counted: the SDK's response models are built lazily, and threads that
    # build them at once can fail ("BaseModel cannot be instantiated directly").
    one_agent(calls - 1, agent + "-first")
    before = Costs.now(stack)
    started = time.monotonic()
    with ThreadPoolExecutor(agents) as pool:
        list(pool.map(one_agent, range(agents)))
    answered = time.monotonic()
    done = stack.wait_count(f"agent = '{agent}'", calls, timeout=600)
    return {"calls": calls, "agents": agents, "turns": turns,
            "mean_messages_kb": round(statistics.fmean(sizes[-calls:]) / 1000, 1),
            "answered_s": round(answered - started, 3),
            "answered_calls_per_s": round(calls / (answered - started), 1),
            "queryable_s": round(done - started, 3), "calls_per_s": round(calls / (done - started), 1),
            **Costs.now(stack).per_unit_since(before, calls, "call")}


def freshness(stack: Stack, rate: float, seconds: float, batch_period: float = 0.2) -> dict[str, Any]:
    """Steps at ``rate``/s for ``seconds``, in small batches every ``batch_period``; ingest -> queryable."""
    run = "bf" + uuid.uuid4().hex[:8]
    per_batch = max(1, round(rate * batch_period))
    sent = 0
    with GatewayClient(stack.api, batch_size=per_batch, timeout_s=60) as client:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            due = started + sent / rate
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            client.submit_steps([step(run, sent + i) for i in range(per_batch)])
            sent += per_batch
    stack.wait_count(f"trajectory_id LIKE '{run}-%'", sent, timeout=600)
    lags = [float(r["lag"]) for r in stack.sql(
        "SELECT toUnixTimestamp64Milli(ingested_at) - toUnixTimestamp64Milli(created_at_ms) AS lag "
        f"FROM steps WHERE trajectory_id LIKE '{run}-%'")]
    achieved = sent / (time.monotonic() - started)
    return {"target_rate": round(rate, 1), "sent": sent, "offered_rate": round(sent / seconds, 1),
            "p50_ms": percentile(lags, 0.5), "p99_ms": percentile(lags, 0.99),
            "mean_ms": round(statistics.fmean(lags), 1), "overall_rate": round(achieved, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--calls", type=int, default=800)
    parser.add_argument("--agents", type=int, default=8, help="black-box agents calling at once")
    parser.add_argument("--turns", type=int, default=1,
                        help="also run the black-box calls as conversations of this many turns (1: skip)")
    parser.add_argument("--warmup", type=int, default=4000,
                        help="white-box steps (and a tenth as many calls) sent first, not timed (0: none)")
    parser.add_argument("--batch", type=int, default=100, help="steps per request of the main white-box run")
    parser.add_argument("--batches", default="1,10,100,500",
                        help="also post white-box steps in requests of these sizes (messages, CPU per step)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--long", type=int, default=200,
                        help="also post steps in trajectories this long (0: skip) and compare")
    parser.add_argument("--rollouts", type=int, default=3072,
                        help="also post this many steps of GRPO rollouts (0: skip)")
    parser.add_argument("--rollout-batch", type=int, default=200, help="steps per request of the rollouts")
    parser.add_argument("--workers", type=int, default=2,
                        help="also run the main white-box load on a stack with this many workers (1: skip)")
    parser.add_argument("--kafka-nodes", type=int, default=1, help="local Kafka brokers (3: replicated)")
    args = parser.parse_args()
    size = len(codec_for().encode("whitebox_step", {
        **step("size", 1), "step_id": "s" * 32, "source_name": "anonymous", "received_at_ms": 0,
        "response_logprobs": [-0.5] * RESPONSE_TOKENS}))
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-pipeline-") as tmp:
        stack = Stack(Path(tmp) / "one", args.kafka_nodes)
        try:
            stack.wait_healthy()
            # Enough messages that the consumer's first fetch wait does not dominate the baseline.
            baseline = kafka_round_trip(stack.bootstrap, max(args.steps, 20_000), size)
            warm_up(stack, args)
            white = whitebox_throughput(stack, args.steps, args.batch)
            by_batch = [whitebox_throughput(stack, min(args.steps, 100 * b), b)
                        for b in (int(x) for x in args.batches.split(",") if x)]
            long = whitebox_throughput(stack, args.steps, args.batch, args.long) if args.long else None
            rollouts = (rollouts_throughput(stack, args.rollouts, args.rollout_batch)
                        if args.rollouts else None)
            black = blackbox_throughput(stack, args.calls, args.agents)
            talks = (blackbox_throughput(stack, args.calls, args.agents, args.turns)
                     if args.turns > 1 else None)
            capacity = white["steps_per_s"]
            rates = sorted({round(capacity * f, 1) for f in (0.25, 0.5, 0.8)} | {100.0})
            fresh = [freshness(stack, rate, args.seconds) for rate in rates]
        finally:
            stack.stop()
        scaled = None
        if args.workers > 1:
            stack = Stack(Path(tmp) / "many", args.kafka_nodes, workers=args.workers)
            try:
                stack.wait_healthy()
                warm_up(stack, args)
                scaled = [whitebox_throughput(stack, args.steps, args.batch) for _ in range(2)]
            finally:
                stack.stop()
    same_load = [white, *(b for b in by_batch if b["batch"] == args.batch and b["steps"] == args.steps)]
    worker_cpu = _mean_worker_cpu(same_load)
    result = {
        "kafka_nodes": args.kafka_nodes,
        "message_bytes": size,
        "kafka_round_trip_msgs_per_s": round(baseline, 1),
        "whitebox": {**white, "ratio_to_kafka": round(white["steps_per_s"] / baseline, 4)},
        "whitebox_by_batch": [{**b, "ratio_to_kafka": round(b["steps_per_s"] / baseline, 4)}
                              for b in by_batch],
        "whitebox_long_trajectories": long and {
            **long, "ratio_to_kafka": round(long["steps_per_s"] / baseline, 4),
            "steps_per_s_vs_10_step_trajectories": round(long["steps_per_s"] / white["steps_per_s"], 3)},
        "whitebox_rollouts": rollouts and {
            **rollouts, "ratio_to_kafka": round(rollouts["steps_per_s"] / baseline, 4)},
        "blackbox": {**black, "ratio_to_kafka": round(black["calls_per_s"] / baseline, 4)},
        "blackbox_conversations": talks,
        "freshness": fresh,
        "workers": scaled and {
            "runs": scaled, "workers": args.workers,
            "worker_cpu_ms_per_step": round(_mean_worker_cpu(scaled), 3),
            "one_worker_cpu_ms_per_step": round(worker_cpu, 3),
            "worker_cpu_per_step_vs_one_worker": round(_mean_worker_cpu(scaled) / worker_cpu, 3)
            if worker_cpu else None},
    }
    nodes = args.kafka_nodes
    out = RESULTS if nodes == 1 else RESULTS.with_stem(f"bench_pipeline_{nodes}_brokers")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _mean_worker_cpu(runs: list[dict[str, Any]]) -> float:
    """The workers' CPU per step over ``runs`` of the same load (one load alone is too noisy here)."""
    return sum(r["cpu_ms_per_step_by_process"].get("worker", 0.0) for r in runs) / len(runs)


def warm_up(stack: Stack, args: argparse.Namespace) -> None:
    """The broker's first load costs it far more than the same load again (JIT, new segments)."""
    if args.warmup:
        whitebox_throughput(stack, args.warmup, args.batch)
        blackbox_throughput(stack, max(args.agents, args.warmup // 10), args.agents)


if __name__ == "__main__":
    raise SystemExit(main())
