"""Kafka's disk per step: what each topic of the stack holds per white-box rollout step, by codec.

Load: GRPO rollouts (``bench_streams.rollout_steps``: groups of 8 rollouts of 8 turns, prompts growing
from 1,024 tokens by each turn's 128-token reply and tool output, 2,048 ids per step on average, a reward
on each rollout's last turn) with token ids and logprobs drawn as a model's are (``TokenText``), posted
as the gateway produces a request of 200 steps: one envelope per partition.

- codecs: those envelopes produced with each codec (``zstd:9``: at that level; librdkafka's default is
  3), each to its own topic whose broker keeps what the producer sent; bytes on disk per step and the
  producer's CPU per step (Avro encoding included, the same for all: the difference to ``none`` is the
  codec's; the least of 3 runs).
- pipeline: the same steps through a real stream worker on the stack's topics (``ensure_topics``, the
  stack's configs), then the bytes on disk per step of every topic (raw, internal work, outputs, the
  state changelog), as the worker's producer compressed them (``kafka_io.COMPRESSION``); with another
  codec in ``--pipeline`` (e.g. ``zstd,lz4``) again with the topics set to it: the broker recompresses
  what arrives, and the worker runs the same. A batch the broker so recompresses can outgrow its message
  limit, and the worker's transaction then fails (seen with ``none``, and once in two runs with lz4).
  ``--rewards feedback``: the steps posted without rewards, then a final reward for each step by its id
  on ``clawr1.raw.feedback`` (as ``bench.soak`` does): every step then leaves twice, once rewarded.

Bytes are the broker's segment files (``*.log``; indexes left out), so a private broker is started.

    .venv/bin/python -m bench.kafka_disk [--groups 24] [--codecs none,lz4,zstd,zstd:9] [--pipeline zstd]
        [--rewards inline|feedback]

Results: bench/results/kafka_disk.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from bench.bench_streams import PARTITIONS, TokenText, Worker, produce_steps, rollout_steps
from clawr1.broker.launcher import KafkaBroker
from clawr1.core import kafka_io
from clawr1.core.kafka_io import ensure_topics, make_admin, make_producer
from clawr1.schemas.codec import codec_for
from clawr1.streams import quix_compat
from clawr1.streams.config import StreamTopics
from tests.support.events import feedback
from tests.support.kafka import committed_lag
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
ENVELOPE = 200
REPEATS = 3


def bytes_on_disk(logs: Path, topic: str) -> int:
    """The record batches Kafka holds for ``topic``: its partitions' segment files."""
    return sum(f.stat().st_size for d in logs.glob(f"{topic}-*") if d.name.rsplit("-", 1)[0] == topic
               for f in d.glob("*.log"))


def settled(logs: Path, names: dict[str, str]) -> dict[str, int]:
    """Bytes of each topic (by label) once they stopped growing for 3 s."""
    previous: dict[str, int] = {}
    current = {label: bytes_on_disk(logs, name) for label, name in names.items()}
    while current != previous:
        time.sleep(3)
        previous, current = current, {label: bytes_on_disk(logs, name) for label, name in names.items()}
    return current


def set_compression(bootstrap: str, names: list[str], codec: str) -> None:
    """Topics keep ``codec`` (a producer's name for it): the broker recompresses what arrives otherwise."""
    admin = make_admin(bootstrap)
    value = "uncompressed" if codec == "none" else codec
    entry = [ConfigEntry("compression.type", value, incremental_operation=AlterConfigOpType.SET)]
    futures = admin.incremental_alter_configs(
        [ConfigResource(ResourceType.TOPIC, n, incremental_configs=entry) for n in names])
    for future in futures.values():
        future.result(30)


def codecs(bootstrap: str, logs: Path, steps: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    found = {}
    for codec in names:
        topic = f"disk.{codec.replace(':', '-')}.{uuid.uuid4().hex[:6]}"
        ensure_topics(bootstrap, [topic], PARTITIONS)  # not the stack's: the broker keeps what it gets
        name, _, level = codec.partition(":")
        overrides: dict[str, Any] = {"compression.type": name}
        if level:
            overrides["compression.level"] = int(level)
        cpus = []
        for _ in range(REPEATS):
            started = time.process_time()
            produce_steps(bootstrap, topic, steps, ENVELOPE, **overrides)
            cpus.append(time.process_time() - started)
        cpu = min(cpus)  # the least disturbed by other work on the machine
        size = settled(logs, {codec: topic})[codec] / REPEATS
        found[codec] = {"bytes_per_step": round(size / len(steps)),
                        "producer_cpu_us_per_step": round(1e6 * cpu / len(steps), 1)}
        print(json.dumps({"codec": codec, **found[codec]}), flush=True)
    return found


def produce_rewards(bootstrap: str, topic: str, steps: list[dict[str, Any]]) -> None:
    """A final reward for each step, by its id, as a reward model posts them after the steps."""
    producer = make_producer(bootstrap)
    encoder = codec_for()
    for step in steps:
        record = feedback(f"reward-{step['step_id']}", "step", step["step_id"], reward=1.0)
        producer.produce(topic, key=step["step_id"].encode(), value=encoder.encode("feedback", record))
        producer.poll(0)
    assert producer.flush(60) == 0


def caught_up(bootstrap: str, worker: Worker, group: str, topic: str) -> None:
    deadline = time.monotonic() + 600
    while committed_lag(bootstrap, group, [topic]):
        if worker.process.poll() is not None or time.monotonic() > deadline:
            log = worker.log.read_text(errors="replace")
            raise RuntimeError(f"the worker stopped or stalled:\n{log[-3000:]}")
        time.sleep(0.5)


def pipeline(bootstrap: str, logs: Path, steps: list[dict[str, Any]], codec: str,
             rewards: str = "inline") -> dict[str, Any]:
    suffix = "." + uuid.uuid4().hex[:8]
    topics = StreamTopics().with_suffix(suffix)
    changelog = quix_compat.changelog_topic("bench" + suffix, topics.work)
    ensure_topics(bootstrap, topics.all_names(), PARTITIONS)
    ensure_topics(bootstrap, [changelog], PARTITIONS)
    labels = {name.removesuffix(suffix): name for name in topics.all_names()} | {"changelog": changelog}
    with tempfile.TemporaryDirectory() as workdir:
        worker = Worker(bootstrap, suffix, Path(workdir))
        try:
            worker.wait_ready()  # its start sets the stack's configs: another codec is set after it
            if codec != kafka_io.COMPRESSION:
                set_compression(bootstrap, list(labels.values()), codec)
            if rewards == "feedback":
                steps = [{**step, "reward": None} for step in steps]
            produce_steps(bootstrap, topics.raw_steps, steps, ENVELOPE)
            caught_up(bootstrap, worker, "bench" + suffix, topics.raw_steps)
            if rewards == "feedback":
                produce_rewards(bootstrap, topics.raw_feedback, steps)
                caught_up(bootstrap, worker, "bench" + suffix, topics.raw_feedback)
            sizes = settled(logs, labels)
        finally:
            worker.stop()
    per_step = {label: round(size / len(steps)) for label, size in sizes.items() if size}
    result = {"codec": codec, "rewards": rewards, "steps": len(steps), "bytes_per_step": per_step,
              "total_bytes_per_step": sum(per_step.values())}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=24, help="prompt groups of 64 steps")
    parser.add_argument("--codecs", default="none,lz4,zstd,zstd:9")
    parser.add_argument("--pipeline", default=kafka_io.COMPRESSION)
    parser.add_argument("--rewards", choices=("inline", "feedback"), default="inline",
                        help="rewards on the rollouts' last steps, or one per step posted after them")
    args = parser.parse_args()
    steps = rollout_steps("disk", args.groups, text=TokenText())
    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-")), free_port(), free_port(), "768m")
    broker.start()
    try:
        logs = broker.data_dir / "logs"
        result = {"steps": len(steps),
                  "ids_per_step": round(sum(len(s["prompt_token_ids"]) + len(s["response_token_ids"])
                                            for s in steps) / len(steps)),
                  "codecs": codecs(broker.bootstrap, logs, steps, args.codecs.split(",")),
                  "pipeline": [pipeline(broker.bootstrap, logs, steps, c, args.rewards)
                               for c in args.pipeline.split(",")]}
    finally:
        broker.stop()
    out = REPO / "bench" / "results" / "kafka_disk.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
