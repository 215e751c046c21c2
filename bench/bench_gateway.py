"""Gateway throughput and latency against Kafka's own producer, measured in the same run.

Baseline: confluent-kafka producing one Avro step per message (same producer settings as the
gateway's: idempotent, acks=all, zstd, linger 5 ms; same keys, same topic layout), as fast as the
broker acknowledges them. Gateway: steps accepted (202, i.e. acknowledged by the broker) per second
over HTTP on loopback, 1, 10, 100 and 500 steps per request, with p50/p99 request latency and the
gateway process's CPU per step, sent by plain httpx keep-alive connections with an Idempotency-Key
per request, as ``GatewayClient`` sends them. Everything runs on this machine: the gateway in its
own process (hypercorn), the load generator in this one.

Stages: the same requests' work, step by step in this process with the gateway's own functions and
its producer (the app's lifespan), CPU per step of each: JSON parse (orjson, as the fast path's
``pack_body`` parses; and pydantic-core's ``parse_json``, the model path's, on the same bodies),
validation (the steps fast path: checks, ids, digests, packed records), encoding (envelopes per
partition, Avro), produce (until Kafka acknowledged). What the gateway process spent beyond their sum
is HTTP and the framework (hypercorn, FastAPI, the event loop, threads); its event-loop thread is
also measured alone.

On a small shared machine the direct producer's rate moves by 2x between runs, so one baseline and
one gateway phase prove nothing. After a warm-up, ``--rounds`` rounds each run the baseline and then
every gateway phase back to back; every round gives its own ratios, and the result is the median
ratio with its range over the rounds.

    .venv/bin/python -m bench.bench_gateway [--bootstrap HOST:PORT] [--rounds 5] [--seconds 4]
        [--profile DIR]   # cProfile of the gateway process, written to DIR/gateway.prof

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.common import percentile, process_cpu_s, records_on_topic
from clawr1.broker.launcher import KafkaBroker
from clawr1.core.kafka_io import ensure_topics, make_producer
from clawr1.core.settings import Settings
from clawr1.core.signals import stop_loop_on_signals
from clawr1.gateway.config import GatewayTopics
from clawr1.gateway.models import StepIn
from clawr1.gateway.records import step_record
from clawr1.schemas.codec import codec_for
from tests.support.ports import free_port
from tests.support.steps import PROMPT_TOKENS, RESPONSE_TOKENS, make_step

REPO = Path(__file__).resolve().parent.parent

PARTITIONS = 4
# name, steps per request, concurrent requests
PHASES = (("batch_1", 1, 16), ("batch_10", 10, 8), ("batch_100", 100, 4), ("batch_500", 500, 2))
STAGES = ("parse", "validate", "encode", "produce")
STAGE_STEPS = 2000  # steps of each batch size whose stages are timed, every round


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
    # CPU seconds per step: of the gateway process (all its threads, librdkafka's included) for a
    # gateway phase, of this process (the producer and its threads) for the baseline; a load-proof
    # comparison where the machine is shared (the wall-clock rate is only the CPU share we got).
    cpu_us_per_step: float | None = None
    client_cpu_us_per_step: float | None = None
    # Of the gateway's event-loop thread alone (HTTP, the framework, produce calls); the rest of its CPU
    # is its worker threads (bodies over 64 KiB are parsed and encoded there) and librdkafka's.
    loop_cpu_us_per_step: float | None = None


def request_bodies(per_request: int, steps: int = 2000) -> list[bytes]:
    """Bodies of ``per_request`` steps (one object when 1), ``steps`` different steps in all."""
    if per_request == 1:
        return [json.dumps(make_step(n)).encode() for n in range(steps)]
    return [json.dumps([make_step(b * per_request + i) for i in range(per_request)]).encode()
            for b in range(max(1, steps // per_request))]


def gateway_producer_settings(delivery_timeout_s: float = 30.0) -> dict[str, Any]:
    """The settings KafkaPublisher adds to make_producer's, so the baseline produces the same way."""
    return {"message.timeout.ms": int(delivery_timeout_s * 1000), "queue.buffering.max.messages": 100_000}


def encoded_steps(count: int) -> list[tuple[str, bytes]]:
    """(key, Avro value) of the steps the gateway would produce from make_step(0..count-1)."""
    codec = codec_for("")
    messages = []
    for n in range(count):
        out = step_record(StepIn.model_validate(make_step(n)), "bench", int(time.time() * 1000))
        messages.append((out.key, codec.encode("whitebox_step", out.record)))
    return messages


class Baseline:
    """Kafka's own producer with the same Avro bytes, keys and producer settings as the gateway; one
    producer for every round (its start-up, the idempotent producer id, is not measured)."""

    def __init__(self, bootstrap: str, topic: str, messages: list[tuple[str, bytes]]) -> None:
        self.topic = topic
        self.messages = messages
        self.producer = make_producer(bootstrap, **gateway_producer_settings())
        self.acked = 0

    def _on_delivery(self, error: Any, _message: Any) -> None:
        if error is None:
            self.acked += 1

    def run(self, count: int) -> Phase:
        producer, topic, messages = self.producer, self.topic, self.messages
        self.acked = 0
        cpu = time.process_time()
        started = time.perf_counter()
        for n in range(count):
            key, value = messages[n % len(messages)]
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        left = producer.flush(60)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        if left or self.acked != count:
            raise RuntimeError(f"baseline: {count - self.acked} messages not acknowledged")
        return Phase("kafka_producer_direct", count, elapsed, count / elapsed,
                     cpu_us_per_step=round(1e6 * cpu / count, 1))


def server_cpu_s(pid: int | None, loop_only: bool = False) -> float | None:
    """The gateway process's CPU seconds so far (of its main thread, the event loop's, with
    ``loop_only``); None where /proc cannot tell."""
    try:
        return None if pid is None else process_cpu_s(pid, pid if loop_only else None)
    except (OSError, IndexError):
        return None


def _serve(bootstrap: str, topics: tuple[str, str, str], port: int, profile: str) -> None:
    """Gateway process entry point: serve until SIGTERM (under cProfile when ``profile`` names a file)."""
    from clawr1.gateway.app import create_app
    from clawr1.gateway.server import serve

    async def main() -> None:
        stop = stop_loop_on_signals([signal.SIGTERM])
        settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=PARTITIONS, max_batch_steps=1000)
        await serve(create_app(settings, topics=GatewayTopics(*topics)), "127.0.0.1", port, stop)

    if not profile:
        asyncio.run(main())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(main())
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


async def load(url: str, bodies: list[bytes], per_request: int, concurrency: int, seconds: float,
               name: str, server_pid: int | None = None) -> Phase:
    """``concurrency`` keep-alive connections posting ``bodies`` in turn for ``seconds``."""
    latencies: list[float] = []
    refused = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker(offset: int, deadline: float) -> None:
            nonlocal refused
            n = offset
            while time.perf_counter() < deadline:
                body = bodies[n % len(bodies)]
                n += concurrency
                headers = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
                sent = time.perf_counter()
                reply = await client.post("/v1/steps", content=body, headers=headers)
                if reply.status_code == 202:
                    latencies.append(time.perf_counter() - sent)
                else:
                    refused += 1

        # Open every connection before the clock starts: the phase measures requests, not handshakes.
        await asyncio.gather(*(client.get("/healthz") for _ in range(concurrency)))
        server_cpu, client_cpu = server_cpu_s(server_pid), time.process_time()
        loop_cpu = server_cpu_s(server_pid, loop_only=True)
        started = time.perf_counter()
        await asyncio.gather(*(worker(i, started + seconds) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
        server_after, client_cpu = server_cpu_s(server_pid), time.process_time() - client_cpu
        loop_after = server_cpu_s(server_pid, loop_only=True)
    steps = len(latencies) * per_request

    def per_step(before: float | None, after: float | None) -> float | None:
        if before is None or after is None or not steps:
            return None
        return round(1e6 * (after - before) / steps, 1)

    return Phase(name, steps, elapsed, steps / elapsed,
                 1000 * statistics.median(latencies) if latencies else None,
                 1000 * percentile(latencies, 0.99) if latencies else None, len(latencies), refused,
                 per_step(server_cpu, server_after), round(1e6 * client_cpu / steps, 1) if steps else None,
                 per_step(loop_cpu, loop_after))


def stage_costs(bootstrap: str, topics: GatewayTopics, per_request: int, steps: int) -> dict[str, float]:
    """CPU µs per step of each stage of the gateway's work on requests of ``per_request`` steps, run here
    with its own functions and producer (``create_app``'s lifespan), ``steps`` steps in all; also the
    model path's parse of the same bodies (``parse_pydantic_core``)."""
    import orjson

    from clawr1.core.topics import RAW_STEPS
    from clawr1.gateway.app import create_app, envelopes, publish
    from clawr1.gateway.fastpath import pack_steps
    from clawr1.gateway.validation import parse_json

    settings = Settings(kafka_bootstrap=bootstrap, topic_partitions=PARTITIONS, max_batch_steps=1000)
    app = create_app(settings, topics=topics)
    state = app.state.gateway
    bodies = request_bodies(per_request, steps)
    spent = dict.fromkeys((*STAGES, "parse_pydantic_core"), 0.0)

    def timed(stage: str, work: Callable[[], Any]) -> Any:
        # This thread's CPU only: the producer's threads run meanwhile, and are charged to produce.
        started = time.thread_time()
        result = work()
        spent[stage] += time.thread_time() - started
        return result

    async def run() -> None:
        async with app.router.lifespan_context(app):
            while state.publisher is None or not await state.publisher.ready():
                await asyncio.sleep(0.1)
            for body in bodies:
                timed("parse_pydantic_core", partial(parse_json, body))
                parsed = timed("parse", partial(orjson.loads, body))
                items = parsed if isinstance(parsed, list) else [parsed]
                packed = timed("validate", partial(pack_steps, items, "bench", int(time.time() * 1000)))
                keyed = [(step.key, step.record) for step in packed]
                messages = timed("encode", partial(envelopes, state, topics.steps, RAW_STEPS.schema, keyed))
                started = time.process_time()  # all threads: the producer's and its delivery reports'
                await publish(state, messages)
                spent["produce"] += time.process_time() - started

    asyncio.run(run())
    done = per_request * len(bodies)
    return {stage: round(1e6 * cpu / done, 1) for stage, cpu in spent.items()}


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


def stage_summary(measured: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Median CPU µs per step of each stage over the rounds, what the gateway process spent beyond them
    (HTTP and the framework), and the same-run ratios of orjson's parse to pydantic-core's and of each stage
    to the whole."""
    median = {stage: statistics.median(r["stages_cpu_us_per_step"][name][stage] for r in measured)
              for stage in (*STAGES, "parse_pydantic_core")}
    whole = statistics.median(r["gateway"][name]["cpu_us_per_step"] for r in measured
                              if r["gateway"][name]["cpu_us_per_step"])
    rest = whole - sum(median[stage] for stage in STAGES)
    loop = statistics.median(r["gateway"][name]["loop_cpu_us_per_step"] for r in measured
                             if r["gateway"][name]["loop_cpu_us_per_step"] is not None)
    return {**{k: round(v, 1) for k, v in median.items()}, "http_and_framework": round(rest, 1),
            "gateway_process": round(whole, 1), "gateway_event_loop_thread": round(loop, 1),
            "share_of_gateway_process": {k: round(median[k] / whole, 3) for k in STAGES}
            | {"http_and_framework": round(rest / whole, 3)},
            "orjson_parse_vs_pydantic_core": round(median["parse"] / median["parse_pydantic_core"], 3)}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def run(bootstrap: str, seconds: float, baseline_steps: int, rounds: int, profile: str = "",
        say: Callable[[str], None] = print) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    topics = GatewayTopics(f"bench.steps.{suffix}", f"bench.feedback.{suffix}", f"bench.events.{suffix}")
    direct_topic = f"bench.direct.{suffix}"
    ensure_topics(bootstrap, [*topics.names(), direct_topic], PARTITIONS)
    direct = Baseline(bootstrap, direct_topic, encoded_steps(2000))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(bootstrap, (topics.steps, topics.feedback, topics.events), port, profile),
        daemon=True)
    server.start()
    bodies = {per_request: request_bodies(per_request) for _, per_request, _ in PHASES}
    accepted = 0
    measured: list[dict[str, Any]] = []
    try:
        wait_healthy(url)
        # Warm-up, not reported: the broker's first produce requests, the gateway's first requests.
        direct.run(min(baseline_steps, 5000))
        for _name, per_request, concurrency in PHASES:
            warm = asyncio.run(load(url, bodies[per_request], per_request, concurrency, 1.0, "warm"))
            accepted += warm.steps
        for number in range(1, rounds + 1):
            base = direct.run(baseline_steps)
            phases = {}
            for name, per_request, concurrency in PHASES:
                phase = asyncio.run(load(url, bodies[per_request], per_request, concurrency, seconds,
                                         f"gateway_{name}", server.pid))
                accepted += phase.steps
                phases[name] = phase
            stages = {name: stage_costs(bootstrap, topics, per_request, STAGE_STEPS)
                      for name, per_request, _ in PHASES}
            accepted += sum(STAGE_STEPS // per * per for _, per, _ in PHASES)
            entry: dict[str, Any] = {"round": number, "baseline": asdict(base),
                     "gateway": {name: asdict(phase) for name, phase in phases.items()},
                     "stages_cpu_us_per_step": stages,
                     "ratios": {name: round(phase.steps_per_s / base.steps_per_s, 4)
                                for name, phase in phases.items()},
                     "cpu_ratios": {name: round(base.cpu_us_per_step / phase.cpu_us_per_step, 4)
                                    for name, phase in phases.items()
                                    if base.cpu_us_per_step and phase.cpu_us_per_step}}
            measured.append(entry)
            say(f"round {number}: direct {base.steps_per_s:.0f} steps/s "
                f"({base.cpu_us_per_step} us CPU/step); " + "; ".join(
                    f"{name} {phase.steps_per_s:.0f} steps/s (x{entry['ratios'][name]:.3f}, "
                    f"p50 {phase.p50_ms or 0:.1f} ms, p99 {phase.p99_ms or 0:.1f} ms, "
                    f"refused {phase.refused}, "
                    f"gateway {phase.cpu_us_per_step} us CPU/step, client {phase.client_cpu_us_per_step}; "
                    f"stages {stages[name]})"
                    for name, phase in phases.items()))
    finally:
        server.terminate()
        server.join(30)
    on_topic = records_on_topic(bootstrap, topics.steps, "whitebox_step")
    if on_topic < accepted:
        raise RuntimeError(f"{accepted} steps were answered 202 but only {on_topic} are on the topic")
    names = [name for name, _, _ in PHASES]
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "step_shape": {"prompt_tokens": PROMPT_TOKENS, "response_tokens": RESPONSE_TOKENS,
                       "avro_bytes": len(direct.messages[0][1])},
        "rounds": measured,
        "summary": {
            "baseline_steps_per_s": spread([r["baseline"]["steps_per_s"] for r in measured]),
            "ratios_vs_direct_producer": {n: spread([r["ratios"][n] for r in measured]) for n in names},
            "steps_per_s": {n: spread([r["gateway"][n]["steps_per_s"] for r in measured]) for n in names},
            "p50_ms": {n: spread([r["gateway"][n]["p50_ms"] for r in measured]) for n in names},
            "p99_ms": {n: spread([r["gateway"][n]["p99_ms"] for r in measured]) for n in names},
            "cpu_us_per_step": {
                "direct": spread([r["baseline"]["cpu_us_per_step"] for r in measured]),
                **{n: spread([r["gateway"][n]["cpu_us_per_step"] for r in measured
                              if r["gateway"][n]["cpu_us_per_step"]]) for n in names}},
            "cpu_ratios_vs_direct_producer": {n: spread([r["cpu_ratios"][n] for r in measured
                                                         if n in r["cpu_ratios"]]) for n in names},
            "stages_cpu_us_per_step": {n: stage_summary(measured, n) for n in names},
        },
        "accepted_steps_on_topic": {"accepted": accepted, "on_topic": on_topic},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="gateway steps/s and latency vs. the direct Kafka producer")
    parser.add_argument("--bootstrap", default=os.environ.get("CLAWR1_BENCH_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--rounds", type=int, default=5, help="baseline + gateway rounds, interleaved")
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each gateway phase per round")
    parser.add_argument("--baseline-steps", type=int, default=20_000, help="steps of each baseline round")
    parser.add_argument("--profile", default="", help="folder for a cProfile of the gateway process")
    args = parser.parse_args()

    profile = ""
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        profile = str(Path(args.profile).resolve() / "gateway.prof")
    broker = None
    bootstrap = args.bootstrap
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as scratch:
        if not bootstrap:
            broker = KafkaBroker(Path(scratch), port=free_port(), controller_port=free_port(), heap="768m")
            broker.start()
            bootstrap = broker.bootstrap
        try:
            result = run(bootstrap, args.seconds, args.baseline_steps, args.rounds, profile)
        finally:
            if broker is not None:
                broker.stop()
    out = REPO / "bench" / "results" / "bench_gateway.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    summary = result["summary"]
    base = summary["baseline_steps_per_s"]
    print(f"direct producer: median {base['median']:.0f} steps/s (range {base['min']:.0f}-{base['max']:.0f}) "
          f"over {len(result['rounds'])} rounds")
    for name, ratio in summary["ratios_vs_direct_producer"].items():
        rate, p50, p99 = (summary[k][name] for k in ("steps_per_s", "p50_ms", "p99_ms"))
        cpu, direct_cpu = summary["cpu_us_per_step"][name], summary["cpu_us_per_step"]["direct"]
        print(f"gateway {name}: x{ratio['median']:.3f} of direct "
              f"(range {ratio['min']:.3f}-{ratio['max']:.3f}), "
              f"{rate['median']:.0f} steps/s, p50 {p50['median']:.1f} ms, p99 {p99['median']:.1f} ms; "
              f"{cpu['median']:.0f} us gateway CPU per step vs {direct_cpu['median']:.0f} "
              f"direct (CPU ratio x{summary['cpu_ratios_vs_direct_producer'][name]['median']:.3f})")
    for name, stages in summary["stages_cpu_us_per_step"].items():
        print(f"{name} us CPU/step by stage: " + ", ".join(
            f"{stage} {stages[stage]}" for stage in (*STAGES, "http_and_framework")) +
            f" (gateway process {stages['gateway_process']}, its event-loop thread "
            f"{stages['gateway_event_loop_thread']}); "
            f"orjson parse x{stages['orjson_parse_vs_pydantic_core']} of pydantic-core's")
    if profile:
        print(f"gateway profile: {profile}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
