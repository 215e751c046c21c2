"""Gateway throughput and latency against Kafka's own producer, measured in the same run.

Baseline: confluent-kafka producing the very Avro payloads the gateway would produce (idempotent,
acks=all, same topic layout), as fast as the broker acknowledges them. Gateway: steps accepted (202,
i.e. acknowledged by the broker) per second over HTTP on loopback, one step per request and 100 per
request, with p50/p99 request latency. Everything runs on this machine: the gateway in its own
process (hypercorn), the load generator in this one.

    .venv/bin/python bench/bench_gateway.py [--bootstrap HOST:PORT] [--seconds 8]

Without --bootstrap (or CLAWR1_BENCH_KAFKA_BOOTSTRAP) a private broker is started and stopped.
Results: bench/results/bench_gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import TopicPartition

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import free_port, percentile  # noqa: E402
from clawr1.broker.launcher import KafkaBroker  # noqa: E402
from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer  # noqa: E402
from clawr1.core.settings import Settings  # noqa: E402
from clawr1.core.signals import stop_loop_on_signals  # noqa: E402
from clawr1.gateway.config import GatewayTopics  # noqa: E402
from clawr1.gateway.models import StepIn  # noqa: E402
from clawr1.gateway.records import step_record  # noqa: E402
from clawr1.schemas.codec import codec_for  # noqa: E402

PARTITIONS = 4
PROMPT_TOKENS, RESPONSE_TOKENS = 512, 128


@dataclass
class Phase:
    name: str
    steps: int
    seconds: float
    steps_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    requests: int | None = None
    refused: int | None = None


def make_step(n: int) -> dict[str, Any]:
    """A realistic step: a 512-token prompt, a 128-token response with logprobs."""
    return {
        "trajectory_id": f"bench-{n // 8}", "step_index": n % 8, "prompt_group_id": f"g-{n // 64}",
        "prompt_group_size": 8, "prompt_token_ids": [(n * 7 + i) % 32_000 for i in range(PROMPT_TOKENS)],
        "response_token_ids": [(n * 13 + i) % 32_000 for i in range(RESPONSE_TOKENS)],
        "response_logprobs": [-0.01 * (i % 50) for i in range(RESPONSE_TOKENS)],
        "reward": 1.0, "policy_version": 3, "model": "bench-model", "metadata": {"n": n},
    }


def baseline(bootstrap: str, topic: str, count: int) -> Phase:
    """Kafka's own producer with the same Avro bytes, keys and producer settings as the gateway."""
    codec = codec_for("")
    messages = []
    for n in range(count):
        out = step_record(StepIn.model_validate(make_step(n)), "bench", int(time.time() * 1000))
        messages.append((out.key, codec.encode("whitebox_step", out.record)))
    producer = make_producer(bootstrap)
    acked = 0

    def on_delivery(error: Any, _message: Any) -> None:
        nonlocal acked
        if error is None:
            acked += 1

    started = time.perf_counter()
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(60)
    elapsed = time.perf_counter() - started
    if left or acked != count:
        raise RuntimeError(f"baseline: {count - acked} messages not acknowledged")
    return Phase("kafka_producer_direct", count, elapsed, count / elapsed)


def _serve(bootstrap: str, topics: tuple[str, str, str], port: int) -> None:
    """Gateway process entry point: serve until SIGTERM."""
    from clawr1.gateway.app import create_app
    from clawr1.gateway.server import serve

    async def main() -> None:
        stop = stop_loop_on_signals([signal.SIGTERM])
        settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=PARTITIONS, max_batch_steps=1000)
        await serve(create_app(settings, topics=GatewayTopics(*topics)), "127.0.0.1", port, stop)

    asyncio.run(main())


async def load(url: str, bodies: list[bytes], per_request: int, concurrency: int, seconds: float,
               name: str) -> Phase:
    latencies: list[float] = []
    refused = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker(offset: int) -> None:
            nonlocal refused
            n = offset
            while time.perf_counter() < deadline:
                body = bodies[n % len(bodies)]
                n += concurrency
                sent = time.perf_counter()
                reply = await client.post("/v1/steps", content=body, headers=headers)
                if reply.status_code == 202:
                    latencies.append(time.perf_counter() - sent)
                else:
                    refused += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    steps = len(latencies) * per_request
    return Phase(name, steps, elapsed, steps / elapsed, 1000 * statistics.median(latencies),
                 1000 * percentile(latencies, 0.99), len(latencies), refused)


def topic_size(bootstrap: str, topic: str) -> int:
    consumer = make_consumer(bootstrap, f"bench-{uuid.uuid4().hex[:8]}")
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(PARTITIONS))
    finally:
        consumer.close()


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"gateway at {url} not healthy after {timeout}s")


def run(bootstrap: str, seconds: float, baseline_steps: int) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    topics = GatewayTopics(f"bench.steps.{suffix}", f"bench.feedback.{suffix}", f"bench.events.{suffix}")
    direct_topic = f"bench.direct.{suffix}"
    ensure_topics(bootstrap, [*topics.names(), direct_topic], PARTITIONS)
    direct = baseline(bootstrap, direct_topic, baseline_steps)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(bootstrap, (topics.steps, topics.feedback, topics.events), port), daemon=True)
    server.start()
    try:
        wait_healthy(url)
        singles = [json.dumps(make_step(n)).encode() for n in range(2000)]
        batches = [json.dumps([make_step(b * 100 + i) for i in range(100)]).encode() for b in range(20)]
        one = asyncio.run(load(url, singles, 1, 16, seconds, "gateway_batch_1"))
        hundred = asyncio.run(load(url, batches, 100, 4, seconds, "gateway_batch_100"))
    finally:
        server.terminate()
        server.join(30)
    on_topic = topic_size(bootstrap, topics.steps)
    accepted = one.steps + hundred.steps
    if on_topic < accepted:
        raise RuntimeError(f"{accepted} steps were answered 202 but only {on_topic} are on the topic")
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "step_shape": {"prompt_tokens": PROMPT_TOKENS, "response_tokens": RESPONSE_TOKENS,
                       "avro_bytes": len(codec_for("").encode("whitebox_step", step_record(
                           StepIn.model_validate(make_step(0)), "bench", 0).record))},
        "baseline": asdict(direct),
        "gateway": [asdict(one), asdict(hundred)],
        "ratios_vs_direct_producer": {
            "batch_1": round(one.steps_per_s / direct.steps_per_s, 4),
            "batch_100": round(hundred.steps_per_s / direct.steps_per_s, 4),
        },
        "accepted_steps_on_topic": {"accepted": accepted, "on_topic": on_topic},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="gateway steps/s and latency vs. the direct Kafka producer")
    parser.add_argument("--bootstrap", default=os.environ.get("CLAWR1_BENCH_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each gateway phase")
    parser.add_argument("--baseline-steps", type=int, default=20_000)
    args = parser.parse_args()

    broker = None
    bootstrap = args.bootstrap
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as scratch:
        if not bootstrap:
            broker = KafkaBroker(Path(scratch), port=free_port(), controller_port=free_port(), heap="768m")
            broker.start()
            bootstrap = broker.bootstrap
        try:
            result = run(bootstrap, args.seconds, args.baseline_steps)
        finally:
            if broker is not None:
                broker.stop()
    out = REPO / "bench" / "results" / "bench_gateway.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    direct = result["baseline"]
    print(f"direct producer: {direct['steps_per_s']:.0f} steps/s")
    for phase in result["gateway"]:
        print(f"{phase['name']}: {phase['steps_per_s']:.0f} steps/s "
              f"(x{phase['steps_per_s'] / direct['steps_per_s']:.3f} of direct), "
              f"p50 {phase['p50_ms']:.1f} ms, p99 {phase['p99_ms']:.1f} ms, refused {phase['refused']}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
