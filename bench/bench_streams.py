"""Stream worker throughput and end-to-end latency, against Kafka's own consume rate in the same run.

Load: black-box agent conversations (8 turns each, prompts growing from 256 tokens by the previous
reply and a new user turn, engine token ids present, event ids minted as the proxy mints them)
captured by the proxy, plus one final reward
per call from a reward model, i.e. every call becomes a normalized step, joined with its reward,
merged into its trajectory's prefix tree.

- throughput: one worker (a subprocess, as ``clawr1 worker`` runs it) holds its partitions, then all
  events are produced at once and it works through them; events/s = input events / (last step's final
  version - load start), and the worker's CPU per step (comparable on a busy machine, where wall-clock
  rates are not).
- baseline: a confluent-kafka consumer reading the same raw topics from the start (events/s).
- messages: what every topic of the run (raw, internal, outputs, changelogs) holds once the worker
  is done, from the offsets, per step.
- scale-out (``--workers N``): the same black-box load on N workers of one group, once their group
  settled: the group's CPU per step against one worker's (this machine has no free core to show
  wall-clock scaling).
- trajectory length (``--lengths 10,200``): white-box steps (512 + 128 tokens, reward inline) in
  trajectories of each length, one message each: CPU per step should not grow with length.
- envelopes (``--envelopes 100``): the same steps as the gateway produces a posted batch of that many,
  one envelope per partition. Trajectory after trajectory
  (a rollout worker posting finished ones), and for the first length also interleaved by step index
  (agents posting each step as they take it: no two steps of a trajectory close together).
- latency: with the worker warm, calls are produced at a fixed rate; ingest -> first normalized
  version of the step on ``clawr1.steps`` (p50/p99), beside the same calls' raw-topic hop.

    .venv/bin/python -m bench.bench_streams [--bootstrap HOST:PORT] [--calls 2000] [--workers 2]
        [--lengths 10,200] [--envelopes 100] [--rate 50] [--seconds 10] [--profile worker.prof]

Without --bootstrap (or CLAWR1_BENCH_KAFKA_BOOTSTRAP) a private broker is started and stopped.
Each phase prints a JSON line as it ends; all of them: bench/results/bench_streams.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from bench.common import percentile, process_cpu_s, settled_message_counts
from clawr1.broker.launcher import KafkaBroker
from clawr1.core.conversation import conversation_key
from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer
from clawr1.core.routing import partition_of, routable_id
from clawr1.proxy.record import event_id as proxy_event_id
from clawr1.schemas.codec import codec_for, pack_record
from clawr1.streams.config import StreamTopics
from clawr1.streams.worker import READY_LINE
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent

PARTITIONS = 4
TURNS, FIRST_PROMPT, TURN_TOKENS, REPLY_TOKENS = 8, 256, 32, 32
CODEC = codec_for()


def conversation(tag: str, n: int, task: int | None = None) -> list[dict[str, Any]]:
    """One agent run of TURNS calls; each prompt is the previous prompt + reply + a new user turn. Runs
    of one ``task`` (default: their own) start with the same messages and prompt, as a group's rollouts do."""
    task = n if task is None else task
    messages: list[dict[str, Any]] = [{"role": "system", "content": "bench"},
                                      {"role": "user", "content": f"{tag}-{task}"}]
    prompt = [(task * 31 + i) % 32_000 for i in range(FIRST_PROMPT)]
    calls = []
    for turn in range(TURNS):
        reply_ids = [(n * 17 + turn * 7 + i) % 32_000 for i in range(REPLY_TOKENS)]
        reply = f"reply {turn} of {n}"
        # Minted as the proxy mints them: routable to the call's Kafka key (its conversation key).
        event_id = proxy_event_id("bench", f"{tag}-{n}-{turn}", conversation_key(messages))
        calls.append({
            "event_id": event_id, "captured_at_ms": 0, "proxy_instance": "bench", "api": "openai.chat",
            "method": "POST", "url": "http://engine/v1/chat/completions", "upstream": "http://engine",
            "request_headers": {}, "request_body": json.dumps({"model": "m", "messages": messages}),
            "streamed": False, "response_status": 200, "request_started_ms": turn, "finished_ms": turn + 1,
            "model": "m", "prompt_token_ids": prompt, "token_source": "engine",
            "choices": [{"index": 0, "text": reply, "token_ids": reply_ids,
                         "reply_messages_json": json.dumps([{"role": "assistant", "content": reply}])}],
            "conversation_key": conversation_key(messages), "messages_json": json.dumps(messages),
        })
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"t{turn}"}]
        prompt = prompt + reply_ids + [(n + turn + i) % 32_000 for i in range(TURN_TOKENS)]
    return calls


def reward_for(step_id: str) -> dict[str, Any]:
    return {"feedback_id": "fb-" + step_id, "target_kind": "step", "target_id": step_id, "reward": 1.0,
            "final": True, "source": "reward_model", "received_at_ms": 1}


class Worker:
    """``python -m clawr1.streams.worker`` with its own topics and app id."""

    def __init__(self, bootstrap: str, suffix: str, workdir: Path, profile: str = "") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "worker.log"
        env = {**os.environ, "CLAWR1_KAFKA_BOOTSTRAP": bootstrap, "CLAWR1_DATA_DIR": str(workdir),
               "CLAWR1_TOPIC_SUFFIX": suffix, "CLAWR1_STREAMS_APP_ID": "bench" + suffix,
               "CLAWR1_TOPIC_PARTITIONS": str(PARTITIONS)}
        with self.log.open("wb") as log:
            profiler = ["-m", "cProfile", "-o", profile] if profile else []
            self.process = subprocess.Popen([sys.executable, *profiler, "-m", "clawr1.streams.worker"],
                                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while READY_LINE not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("worker did not start:\n" + self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.05)
        return time.monotonic()

    def cpu_seconds(self) -> float:
        return process_cpu_s(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def produce(bootstrap: str, topics: StreamTopics, calls: list[dict[str, Any]]) -> None:
    producer = make_producer(bootstrap)
    for call in calls:
        producer.produce(topics.raw_llm, key=call["conversation_key"].encode(),
                         value=CODEC.encode("raw_llm_call", call))
        producer.produce(topics.raw_feedback, key=call["event_id"].encode(),
                         value=CODEC.encode("feedback", reward_for(call["event_id"])))
        producer.poll(0)
    assert producer.flush(60) == 0


def wait_for_final_steps(bootstrap: str, topics: StreamTopics, expected: int, timeout: float) -> float:
    """Time when every step reached version 2 (its call + its reward)."""
    consumer = make_consumer(bootstrap, "bench-steps-" + uuid.uuid4().hex[:8])
    consumer.subscribe([topics.steps])
    final: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(final) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(final)}/{expected} steps final after {timeout}s")
            for message in consumer.consume(1000, timeout=0.2):
                _, records = CODEC.decode_all(message.value())
                final.update(r["step_id"] for r in records if r["version"] >= 2)
        return time.monotonic()
    finally:
        consumer.close()


def kafka_consume_rate(bootstrap: str, names: list[str], expected: int) -> float:
    """confluent-kafka reading the raw topics from the beginning (partitions assigned, no group join)."""
    consumer = make_consumer(bootstrap, "bench-baseline-" + uuid.uuid4().hex[:8])
    metadata = consumer.list_topics(timeout=10).topics
    consumer.assign([TopicPartition(name, p, OFFSET_BEGINNING)
                     for name in names for p in metadata[name].partitions])
    seen, started = 0, time.monotonic()
    try:
        while seen < expected:
            seen += sum(1 for m in consumer.consume(10_000, timeout=0.05) if m.error() is None)
        return expected / (time.monotonic() - started)
    finally:
        consumer.close()


def latency(bootstrap: str, topics: StreamTopics, rate: float, seconds: float) -> dict[str, Any]:
    calls = [c for n in range(int(rate * seconds / TURNS) + 1) for c in conversation("lat", n)]
    calls = calls[: int(rate * seconds)]
    sent: dict[str, float] = {}
    raw_at: dict[str, float] = {}
    step_at: dict[str, float] = {}
    consumer = make_consumer(bootstrap, "bench-latency-" + uuid.uuid4().hex[:8], **{"fetch.wait.max.ms": 5})
    consumer.subscribe([topics.raw_llm, topics.steps])
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for message in consumer.consume(500, timeout=0.05):
                now = time.monotonic()
                name, records = CODEC.decode_all(message.value())
                target = raw_at if name == "raw_llm_call" else step_at
                field = "event_id" if name == "raw_llm_call" else "step_id"
                for record in records:
                    target.setdefault(record[field], now)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(3)  # let the reader join its group before anything is sent
    producer = make_producer(bootstrap, **{"linger.ms": 0})
    start = time.monotonic()
    for i, call in enumerate(calls):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        sent[call["event_id"]] = time.monotonic()
        producer.produce(topics.raw_llm, key=call["conversation_key"].encode(),
                         value=CODEC.encode("raw_llm_call", call))
        producer.poll(0)
    producer.flush(30)
    deadline = time.monotonic() + 30
    while not sent.keys() <= step_at.keys() and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join()
    consumer.close()
    e2e = [(step_at[k] - sent[k]) * 1000 for k in sent if k in step_at]
    hop = [(raw_at[k] - sent[k]) * 1000 for k in sent if k in raw_at]
    return {"calls": len(calls), "rate_per_s": rate, "delivered": len(e2e),
            "e2e_p50_ms": statistics.median(e2e), "e2e_p99_ms": percentile(e2e, 0.99),
            "kafka_hop_p50_ms": statistics.median(hop), "kafka_hop_p99_ms": percentile(hop, 0.99)}


def wait_assigned(bootstrap: str, group: str, members: int, inputs: list[str], partitions: int,
                  timeout: float = 120) -> None:
    """Until ``group`` has ``members`` members sharing every partition of ``inputs`` (a rebalance
    settled); Quix's changelog partitions, which its members also hold, are not counted."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    wanted = len(inputs) * partitions
    seen = ""
    while time.monotonic() < deadline:
        described = admin.describe_consumer_groups([group])[group].result(10)
        assigned = sum(tp.topic in inputs for m in described.members for tp in m.assignment.topic_partitions)
        if len(described.members) == members and assigned == wanted:
            return
        seen = f"{len(described.members)} members, {assigned} of {wanted} input partitions"
        time.sleep(0.2)
    raise RuntimeError(f"group {group} did not settle on {members} members within {timeout}s ({seen})")


def whitebox_steps(tag: str, n: int, length: int) -> list[dict[str, Any]]:
    """``n`` white-box steps (512 + 128 tokens, a final reward each) in trajectories of ``length`` steps,
    with step ids as the gateway mints them (routable to their trajectory)."""
    return [{"step_id": routable_id(f"{tag}-t{i // length}", f"{tag}-{i}".encode()),
             "trajectory_id": f"{tag}-t{i // length}", "step_index": i % length,
             "prompt_token_ids": [(i * 31 + k) % 32_000 for k in range(512)],
             "response_token_ids": [(i * 17 + k) % 32_000 for k in range(128)],
             "response_logprobs": [-0.5] * 128, "reward": 1.0, "received_at_ms": 1, "agent": "bench"}
            for i in range(n)]


class TokenText:
    """Token ids as a model's text has them: Zipf-distributed over a 152k vocabulary (exponent 1.1), the
    frequent tokens with the small ids (as BPE vocabularies roughly order them); logprobs of sampled
    tokens, float32 values (as engines send them) mostly near 0."""

    def __init__(self, seed: int = 11, vocabulary: int = 152_000) -> None:
        self._random = random.Random(seed)
        self._ranks = range(vocabulary)
        self._weights = list(itertools.accumulate(1 / (k + 1) ** 1.1 for k in self._ranks))

    def ids(self, n: int) -> list[int]:
        return self._random.choices(self._ranks, cum_weights=self._weights, k=n)

    def logprobs(self, n: int) -> list[float]:
        return [struct.unpack("f", struct.pack("f", -self._random.expovariate(3.0)))[0] for _ in range(n)]


def rollout_steps(tag: str, groups: int, rollouts: int = 8, turns: int = 8, task: int = 1024,
                  response: int = 128, tool: int = 128, first: int = 0, *,
                  text: TokenText | None = None) -> list[dict[str, Any]]:
    """GRPO rollouts as a rollout worker posts them: ``groups`` prompt groups of ``rollouts`` each, every
    rollout ``turns`` steps whose prompt is the group's task (``task`` tokens) followed by each earlier
    turn's response and tool output (prompts grow turn by turn), a reward on the last turn; trajectory
    after trajectory, as rollouts finish. Groups are numbered from ``first`` (their tokens differ). Token
    ids are arithmetic runs (cheap, distinct between turns), or with ``text`` drawn as a model's are, with
    varied logprobs (what compression sees)."""
    steps = []
    for g in range(first, first + groups):
        group = f"{tag}-g{g}"
        context = text.ids(task) if text else [(g * 7919 + k) % 32_000 for k in range(task)]
        for r in range(rollouts):
            prompt = list(context)
            for t in range(turns):
                seed = (g * rollouts + r) * turns + t
                reply = text.ids(response) if text else [(seed * 17 + k) % 32_000 for k in range(response)]
                last = t == turns - 1
                trajectory = f"{group}-r{r}"
                steps.append({"step_id": routable_id(trajectory, f"{trajectory}-{t}".encode()),
                              "trajectory_id": trajectory, "step_index": t, "prompt_group_id": group,
                              "prompt_group_size": rollouts, "prompt_token_ids": list(prompt),
                              "response_token_ids": reply,
                              "response_logprobs": text.logprobs(response) if text else [-0.5] * response,
                              "reward": 1.0 if last else None, "terminal": last, "received_at_ms": 1,
                              "agent": "bench"})
                output = text.ids(tool) if text else [(seed * 13 + k) % 32_000 for k in range(tool)]
                prompt += reply + output
    return steps


def posted_rollouts(tag: str, groups: int, first: int = 0) -> list[dict[str, Any]]:
    """``rollout_steps`` as a client posts them to the gateway: without the ids and times it mints."""
    return [{k: v for k, v in s.items() if k not in ("step_id", "received_at_ms")}
            for s in rollout_steps(tag, groups, first=first)]


def messages_written(bootstrap: str, suffix: str, app_id: str) -> dict[str, int]:
    """Messages in every topic of this run (raw, internal, output, the worker's state changelog), by
    their short names; offsets count transaction markers too, as Kafka stores them."""
    def label(name: str) -> str | None:
        if name.endswith(suffix):
            return name.replace(suffix, "")
        if name.startswith("changelog__") and app_id in name:
            return "changelog"
        return None

    return settled_message_counts(bootstrap, label)


def produce_steps(bootstrap: str, topic: str, records: list[dict[str, Any]], envelope: int,
                  **producer_overrides: Any) -> int:
    """White-box steps one message each, or (``envelope`` > 1) as the gateway posts a batch of that many:
    one envelope per partition per batch. Returns the messages produced."""
    producer = make_producer(bootstrap, **producer_overrides)
    produced = 0
    for start in range(0, len(records), max(1, envelope)):
        batch = records[start:start + max(1, envelope)]
        if envelope <= 1:
            for record in batch:
                producer.produce(topic, key=record["trajectory_id"].encode(),
                                 value=CODEC.encode("whitebox_step", record))
                produced += 1
        else:
            by_partition: dict[int, list[dict[str, Any]]] = {}
            for record in batch:
                by_partition.setdefault(partition_of(record["trajectory_id"], PARTITIONS), []).append(
                    pack_record("whitebox_step", record))
            for partition, packed in by_partition.items():
                producer.produce(topic, value=CODEC.encode_batch("whitebox_step", packed),
                                 partition=partition)
                produced += 1
        producer.poll(0)
    assert producer.flush(60) == 0
    return produced


def throughput(bootstrap: str, load: str, n: int, length: int, workers: int,
               profile: str = "", envelope: int = 1) -> dict[str, Any]:
    """A fresh worker group (``workers`` processes) works through ``load`` produced beforehand.

    ``blackbox``: proxy-captured conversations of ``TURNS`` calls plus a reward per call;
    ``whitebox``: white-box steps (reward inline) in trajectories of ``length`` steps, trajectory after
    trajectory (as a rollout worker posts finished trajectories); ``whitebox_interleaved``: the same
    steps by step index across all trajectories (as agents post each step when they take it).
    """
    suffix = "." + uuid.uuid4().hex[:8]
    topics = StreamTopics().with_suffix(suffix)
    ensure_topics(bootstrap, topics.all_names(), PARTITIONS)
    with tempfile.TemporaryDirectory() as workdir:
        # The group first (every worker holding its partitions), then the load: CPU and time are the
        # load's alone, for one worker or several alike.
        group = [Worker(bootstrap, suffix, Path(workdir) / str(i), profile if i == 0 else "")
                 for i in range(workers)]
        try:
            for worker in group:
                worker.wait_ready()
            wait_assigned(bootstrap, "bench" + suffix, workers, topics.inputs(), PARTITIONS)
            cpu_at_ready = sum(worker.cpu_seconds() for worker in group)
            ready = time.monotonic()
            if load == "blackbox":
                calls = [c for i in range(max(1, n // TURNS)) for c in conversation("tp", i)]
                produce(bootstrap, topics, calls)
                steps, events, names = len(calls), 2 * len(calls), [topics.raw_llm, topics.raw_feedback]
            else:
                records = whitebox_steps("wb", n, length)
                if load == "whitebox_interleaved":
                    records.sort(key=lambda r: (r["step_index"], r["trajectory_id"]))
                events = produce_steps(bootstrap, topics.raw_steps, records, envelope)
                steps, names = n, [topics.raw_steps]
            done = wait_for_final_steps(bootstrap, topics, steps, timeout=900)
            cpu = sum(worker.cpu_seconds() for worker in group) - cpu_at_ready
            written = messages_written(bootstrap, suffix, "bench" + suffix)
        finally:
            for worker in group:
                worker.stop()
    baseline = kafka_consume_rate(bootstrap, names, events)
    rate = events / (done - ready)  # produce included: the bench's producer takes well under a second
    return {"load": load, "envelope": envelope, "steps": steps, "events": events,
            "trajectory_length": length if load != "blackbox" else TURNS, "workers": workers,
            "partitions": PARTITIONS,
            "worker_events_per_s": round(rate, 1), "steps_per_s": round(steps / (done - ready), 1),
            "worker_cpu_s": round(cpu, 2), "worker_cpu_ms_per_step": round(1000 * cpu / steps, 3),
            "kafka_consume_events_per_s": round(baseline, 1), "worker_vs_kafka": round(rate / baseline, 4),
            "kafka_messages_per_step": round(sum(written.values()) / steps, 2), "messages": written,
            "machine_load_1min": round(os.getloadavg()[0], 2)}


def latency_run(bootstrap: str, rate: float, seconds: float) -> dict[str, Any]:
    suffix = "." + uuid.uuid4().hex[:8]
    topics = StreamTopics().with_suffix(suffix)
    ensure_topics(bootstrap, topics.all_names(), PARTITIONS)
    with tempfile.TemporaryDirectory() as workdir:
        worker = Worker(bootstrap, suffix, Path(workdir))
        try:
            worker.wait_ready()
            lat = latency(bootstrap, topics, rate, seconds)
        finally:
            worker.stop()
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in lat.items()} | {
        "e2e_vs_kafka_hop_p50": round(lat["e2e_p50_ms"] / lat["kafka_hop_p50_ms"], 2)}


def run(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def phase(name: str, value: Any) -> None:  # each phase is printed as it ends: a run may be cut short
        result[name] = value
        print(json.dumps({name: value}), flush=True)

    phase("blackbox", throughput(bootstrap, "blackbox", args.calls, TURNS, 1, args.profile))
    if args.workers > 1:
        scaled = throughput(bootstrap, "blackbox", args.calls, TURNS, args.workers)
        one = result["blackbox"]
        rate = scaled["worker_events_per_s"] / one["worker_events_per_s"]
        cpu = scaled["worker_cpu_ms_per_step"] / one["worker_cpu_ms_per_step"]
        phase("scale_out", {**scaled, "vs_one_worker": round(rate, 3),
                            "cpu_per_step_vs_one_worker": round(cpu, 3)})
    lengths = [int(x) for x in args.lengths.split(",") if x]
    by_length = []
    for length in lengths:
        profile = f"{args.profile}.whitebox{length}" if args.profile else ""
        by_length.append(throughput(bootstrap, "whitebox", args.whitebox, length, 1, profile))
        phase("whitebox_by_trajectory_length", by_length)
    if lengths:
        phase("whitebox_interleaved",
              throughput(bootstrap, "whitebox_interleaved", args.whitebox, lengths[0], 1))
        for size in [int(x) for x in args.envelopes.split(",") if x]:
            phase(f"whitebox_envelopes_of_{size}",
                  throughput(bootstrap, "whitebox", args.whitebox, lengths[0], 1, envelope=size))
    if len(by_length) > 1:
        phase("whitebox_cpu_per_step_longest_vs_shortest", round(
            by_length[-1]["worker_cpu_ms_per_step"] / by_length[0]["worker_cpu_ms_per_step"], 3))
    if args.seconds > 0:
        phase("latency", latency_run(bootstrap, args.rate, args.seconds))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("CLAWR1_BENCH_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0, help="calls/s in the latency phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency phase")
    parser.add_argument("--profile", default="",
                        help="run the first worker of each throughput phase under cProfile, stats to this "
                        "file (white-box phases add .whitebox<length>)")
    parser.add_argument("--workers", type=int, default=2, help="also run the black-box load on this many")
    parser.add_argument("--whitebox", type=int, default=2000, help="white-box steps per trajectory length")
    parser.add_argument("--lengths", default="10,200", help="white-box trajectory lengths to compare")
    parser.add_argument("--envelopes", default="100",
                        help="also post white-box steps (first length) as the gateway does, in envelopes "
                        "of these batch sizes")
    args = parser.parse_args()
    broker = None
    bootstrap = args.bootstrap
    if not bootstrap:
        broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-")), free_port(), free_port(), "768m")
        broker.start()
        bootstrap = broker.bootstrap
    try:
        result = run(bootstrap, args)
    finally:
        if broker is not None:
            broker.stop()
    out = REPO / "bench" / "results" / "bench_streams.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
