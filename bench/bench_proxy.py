"""What the capture proxy costs an agent, against a direct call and against bare mitmdump, in one run.

Four targets serve the same stand-in engine (each server in its own process, all on loopback):
direct; bare ``mitmdump`` in reverse mode with no addon (the floor any mitmproxy addon stands on);
the Claw-R1 proxy (capture to Kafka); the Claw-R1 proxy with ``--capture-token-ids`` (request
injection plus live stripping of every SSE chunk). Phases, interleaved round by round so drift in
this shared machine's load hits every target alike:

- latency: sequential plain chat calls (keep-alive), p50/p99;
- time to first chunk: sequential streamed chat calls, p50/p99 of first byte and of the whole stream;
- throughput: ``--concurrency`` concurrent clients for ``--seconds`` per target (bounded loops);
  calls/s and the proxy process's CPU ms per call;
- record building: the emitter thread's work for one of these calls (``build_record``, redaction
  included, and Avro encoding), in this process: CPU the proxy spends beside its event loop;
- token-id stripping: the event-loop work of taking the injected fields out of the engine's replies to
  this call, in this process: the proxy's JSON path (parsed with orjson, ``token_ids.load``) against
  the same path parsing with the standard library.

Finally every call sent through a Claw-R1 proxy must be on its Kafka topic (nothing dropped).

    .venv/bin/python -m bench.bench_proxy [--bootstrap HOST:PORT] [--calls 300] [--seconds 4]

Without --bootstrap (or CLAWR1_BENCH_KAFKA_BOOTSTRAP) a private broker is started and stopped.
Results: bench/results/bench_proxy.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    captured_chat_call,
    cpu_by_role,
    process,
    process_cpu_s,
    records_on_topic,
)
from clawr1.broker.launcher import KafkaBroker
from clawr1.core.kafka_io import ensure_topics
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent

PARTITIONS = 4
PROXY_MAIN = (
    "import sys; from clawr1.core.settings import load_settings; from clawr1.proxy.runner import run_proxy; "
    "sys.exit(run_proxy(load_settings(), lambda: print('READY', flush=True), topic=sys.argv[1]))"
)


@dataclass
class Target:
    name: str
    url: str
    pid: int | None = None
    topic: str | None = None
    # Fields added to every request body (the direct call that asks the engine for ids itself).
    extra_body: dict[str, Any] = field(default_factory=dict)
    sent: int = 0
    throughput_calls: int = 0
    throughput_s: float = 0.0
    cpu_s: float = 0.0
    loop_cpu_s: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    first_chunk_ms: list[float] = field(default_factory=list)
    stream_ms: list[float] = field(default_factory=list)
    calls_per_s: float = 0.0
    cpu_ms_per_call: float | None = None
    loop_cpu_ms_per_call: float | None = None
    errors: int = 0


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` itself (the event loop that forwards traffic) and of it with every live
    descendant (the proxy's emitter and extra proxy processes)."""
    return process_cpu_s(pid), sum(cpu_by_role(pid).values())


def conversation(n: int) -> dict[str, Any]:
    """A mid-episode agent call: system prompt, tool definitions, a few turns (about 6 KB of JSON)."""
    filler = "Inspect the repository, run the tests and report what fails. " * 12
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " + filler}]
    for turn in range(3):
        messages += [
            {"role": "user", "content": f"Step {turn} of call {n}: {filler}"},
            {"role": "assistant", "content": f"Done with step {turn}: {filler[:200]}"},
        ]
    messages.append({"role": "user", "content": f"Call {n}: summarize."})
    return {"model": "standin-1", "messages": messages, "max_tokens": 64}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_latency(targets: list[Target], calls: int, rounds: int) -> None:
    clients = {t.name: httpx.Client(base_url=t.url, timeout=30) for t in targets}
    for target in targets:  # warm-up: connections and caches
        for n in range(20):
            body = {**conversation(n), **target.extra_body}
            clients[target.name].post("/v1/chat/completions", json=body).raise_for_status()
            clients[target.name].post("/v1/chat/completions", json={**body, "stream": True})
            target.sent += 2
    per_round = max(1, calls // rounds)
    for r in range(rounds):
        for target in targets:
            client = clients[target.name]
            for n in range(per_round):
                body = {**conversation(r * per_round + n), **target.extra_body}
                started = time.perf_counter()
                client.post("/v1/chat/completions", json=body).raise_for_status()
                target.latency_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                    chunks = response.iter_raw()
                    next(chunks)
                    target.first_chunk_ms.append((time.perf_counter() - started) * 1000)
                    for _ in chunks:
                        pass
                target.stream_ms.append((time.perf_counter() - started) * 1000)
                target.sent += 2
    for client in clients.values():
        client.close()


async def throughput_slice(target: Target, seconds: float, concurrency: int) -> None:
    """``concurrency`` clients calling back to back for ``seconds`` (a bounded loop)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    done = 0
    async with httpx.AsyncClient(base_url=target.url, timeout=30, limits=limits) as client:
        deadline = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal done
            n = offset
            while time.perf_counter() < deadline:
                response = await client.post(
                    "/v1/chat/completions", json={**conversation(n), **target.extra_body}
                )
                if response.status_code != 200:
                    target.errors += 1
                done += 1
                n += concurrency

        cpu_before = cpu_seconds(target.pid) if target.pid else (0.0, 0.0)
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        target.throughput_s += time.perf_counter() - started
        if target.pid:
            own, total = cpu_seconds(target.pid)
            target.loop_cpu_s += own - cpu_before[0]
            target.cpu_s += total - cpu_before[1]
    target.sent += done
    target.throughput_calls += done


def run_throughput(targets: list[Target], seconds: float, rounds: int, concurrency: int) -> None:
    """Slices interleaved across targets, so background load hits all of them alike."""
    for _ in range(rounds):
        for target in targets:
            asyncio.run(throughput_slice(target, seconds / rounds, concurrency))
    for target in targets:
        target.calls_per_s = target.throughput_calls / target.throughput_s
        if target.pid:
            calls = max(target.throughput_calls, 1)
            target.cpu_ms_per_call = round(target.cpu_s * 1000 / calls, 3)
            target.loop_cpu_ms_per_call = round(target.loop_cpu_s * 1000 / calls, 3)


def wait_captured(bootstrap: str, target: Target, timeout: float = 60.0) -> int:
    assert target.topic is not None
    deadline = time.monotonic() + timeout
    size = records_on_topic(bootstrap, target.topic, "raw_llm_call")
    while size < target.sent and time.monotonic() < deadline:
        time.sleep(0.5)
        size = records_on_topic(bootstrap, target.topic, "raw_llm_call")
    return size


def record_cost_ms(calls: int = 300) -> dict[str, float]:
    """Median ms of ``build_record`` (with redaction) and of Avro encoding, for one latency-phase call."""
    from clawr1.core.topics import RAW_LLM
    from clawr1.proxy.record import build_record
    from clawr1.schemas.codec import codec_for, pack_record

    call = captured_chat_call(conversation(1), "All tests pass. " * 16)
    codec = codec_for("")
    build, encode = [], []
    for _ in range(calls):
        started = time.perf_counter()
        _, record = build_record(call, "bench")
        built = time.perf_counter()
        codec.encode_batch(RAW_LLM.schema, [pack_record(RAW_LLM.schema, record)])  # as the emitter spools it
        build.append((built - started) * 1000)
        encode.append((time.perf_counter() - built) * 1000)
    return {"build_record_ms": round(statistics.median(build), 3),
            "encode_ms": round(statistics.median(encode), 3)}


def _stdlib_stream(raw: bytes, injection: Any) -> bytes:
    """The baseline: the stream's JSON path parsing with the standard library (each one-line ``data:``
    event, as engines send them, parsed, stripped and written again)."""
    from clawr1.proxy.sse import split_events
    from clawr1.proxy.token_ids import dump, strip_chunk

    events, rest = split_events(raw)
    out = []
    for event in events:
        if not event.startswith(b"data: {"):
            out.append(event)
            continue
        end = event.index(b"\n")
        obj = json.loads(event[6:end])
        changed = strip_chunk(obj, injection)
        if changed is not None:
            out.append(b"data: " + dump(obj) + event[end:] if changed else event)
    return b"".join(out) + rest


def _stdlib_body(body: bytes, injection: Any) -> bytes | None:
    from clawr1.proxy.token_ids import dump, strip_json

    obj = json.loads(body)
    return dump(obj) if strip_json(obj, injection) else None


def strip_cost_us(upstream: str, loops: int = 100, repeats: int = 7) -> dict[str, Any]:
    """Process CPU µs per reply (min of ``repeats``) of stripping the injected token-id fields on the
    stand-in engine's replies to the bench's call: the proxy's JSON path (``strip_body``,
    ``SseRewriter``) against that path parsing with the standard library (and whether both give the
    same bytes)."""
    import functools
    from dataclasses import replace

    from clawr1.proxy.stream import token_id_rewriter
    from clawr1.proxy.token_ids import inject_body, strip_body

    def stream_path(injection: Any) -> Any:
        def run(raw: bytes) -> bytes:
            rewriter = token_id_rewriter(injection)
            return rewriter.feed(raw) + rewriter.flush()
        return run

    cases: dict[str, tuple[bytes, Any, Any]] = {}
    with httpx.Client(base_url=upstream, timeout=30) as client:
        for api, path, request in (
            ("openai.chat", "/v1/chat/completions", conversation(0)),
            ("openai.completions", "/v1/completions",
             {"model": "standin-1", "prompt": json.dumps(conversation(0)["messages"]), "max_tokens": 64}),
        ):
            for stream in (False, True) if api == "openai.chat" else (False,):
                injected = inject_body(api, json.dumps({**request, "stream": stream}).encode())
                assert injected is not None
                body, injection = injected[0], replace(injected[1], sglext=True)  # as the proxy asks
                reply = client.post(path, content=body, headers={"content-type": "application/json"})
                reply.raise_for_status()
                name = f"{api.split('.')[1]}_{'streamed' if stream else 'plain'}"
                if stream:
                    cases[name] = (reply.content, stream_path(injection),
                                   functools.partial(_stdlib_stream, injection=injection))
                    first = reply.content.split(b"\n\n", 1)[0] + b"\n\n"
                    cases[f"{name}_first_event"] = (first, *cases[name][1:])
                else:
                    cases[name] = (reply.content, functools.partial(strip_body, injection=injection),
                                   functools.partial(_stdlib_body, injection=injection))

    def cost(run: Any, data: bytes) -> float:
        best = float("inf")
        for _ in range(repeats):
            started = time.process_time()
            for _ in range(loops):
                run(data)
            best = min(best, time.process_time() - started)
        return round(best / loops * 1e6, 1)

    out: dict[str, Any] = {}
    for name, (data, json_path, stdlib_json) in cases.items():
        costs = {"json_path": cost(json_path, data), "stdlib_json": cost(stdlib_json, data)}
        out[name] = {"bytes": len(data), **{f"{k}_us": v for k, v in costs.items()},
                     "json_path_vs_stdlib": round(costs["stdlib_json"] / costs["json_path"], 2),
                     "same_bytes": json_path(data) == stdlib_json(data)}
    return out


def summary(target: Target, baselines: list[Target]) -> dict[str, Any]:
    p50, p99 = percentile(target.latency_ms, 50), percentile(target.latency_ms, 99)
    out: dict[str, Any] = {
        "latency_p50_ms": p50,
        "latency_p99_ms": p99,
        "first_chunk_p50_ms": percentile(target.first_chunk_ms, 50),
        "first_chunk_p99_ms": percentile(target.first_chunk_ms, 99),
        "stream_p50_ms": percentile(target.stream_ms, 50),
        "calls_per_s": round(target.calls_per_s, 1),
        "cpu_ms_per_call": target.cpu_ms_per_call,
        "loop_cpu_ms_per_call": target.loop_cpu_ms_per_call,
        "errors": target.errors,
    }
    for base in baselines:
        b50, b99 = percentile(base.latency_ms, 50) or 0.0, percentile(base.latency_ms, 99) or 0.0
        out[f"vs_{base.name}"] = {
            "added_p50_ms": round((p50 or 0.0) - b50, 3),
            "added_p99_ms": round((p99 or 0.0) - b99, 3),
            "added_first_chunk_p50_ms": round(
                (percentile(target.first_chunk_ms, 50) or 0.0) - (percentile(base.first_chunk_ms, 50) or 0.0),
                3,
            ),
            "added_first_chunk_p99_ms": round(
                (percentile(target.first_chunk_ms, 99) or 0.0) - (percentile(base.first_chunk_ms, 99) or 0.0),
                3,
            ),
            "latency_p50_ratio": round((p50 or 0.0) / b50, 3) if b50 else None,
            "latency_p99_ratio": round((p99 or 0.0) / b99, 3) if b99 else None,
            "throughput_ratio": round(target.calls_per_s / base.calls_per_s, 3),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default=os.environ.get("CLAWR1_BENCH_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--calls", type=int, default=300, help="plain and streamed calls per target")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput phase per target")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2,
                        help="also run the proxy with this many processes on one port (1: skip)")
    parser.add_argument("--before", type=Path,
                        help="a checkout of an earlier proxy (e.g. git archive), run as clawr1_before and, "
                             "with token-id capture, clawr1_before_token_ids")
    args = parser.parse_args()

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-proxy-")))
        bootstrap = args.bootstrap
        if not bootstrap:
            broker = KafkaBroker(data_dir=work / "kafka", port=free_port(), controller_port=free_port())
            broker.start()
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        engine_port = free_port()
        stack.enter_context(
            process(
                [sys.executable, "-m", "clawr1.demo.standin.server", "--port", str(engine_port)],
                ready_line="stand-in engine on",
            )
        )
        upstream = f"http://127.0.0.1:{engine_port}"
        ids = {"return_token_ids": True, "logprobs": True}
        targets = [Target("direct", upstream), Target("direct_asking_ids", upstream, extra_body=ids)]

        bare_port = free_port()
        bare = stack.enter_context(
            process(
                [
                    str(Path(sys.executable).parent / "mitmdump"),
                    "-q",
                    "--mode",
                    f"reverse:{upstream}@127.0.0.1:{bare_port}",
                    "--set",
                    f"confdir={work / 'bare'}",
                ],
                port=bare_port,
            )
        )
        targets.append(Target("bare_mitmdump", f"http://127.0.0.1:{bare_port}", bare.pid))

        proxies: list[tuple[str, bool, dict[str, str]]] = [("clawr1", False, {})]
        if args.before:
            proxies.append(("clawr1_before", False, {"PYTHONPATH": str(args.before.resolve())}))
        proxies.append(("clawr1_token_ids", True, {}))
        if args.before:
            proxies.append(("clawr1_before_token_ids", True, {"PYTHONPATH": str(args.before.resolve())}))
        if args.processes > 1:
            many = {"CLAWR1_PROXY_PROCESSES": str(args.processes)}
            proxies.append((f"clawr1_{args.processes}proc", False, many))
        for name, token_ids, extra in proxies:
            port, topic = free_port(), f"clawr1.bench.raw.llm.{uuid.uuid4().hex[:8]}"
            ensure_topics(bootstrap, [topic], PARTITIONS)
            env = {
                "CLAWR1_DATA_DIR": str(work / name),
                "CLAWR1_KAFKA_BOOTSTRAP": bootstrap,
                "CLAWR1_PROXY_PORT": "0",
                "CLAWR1_REVERSE_PORT": str(port),
                "CLAWR1_UPSTREAM": upstream,
                "CLAWR1_CAPTURE_TOKEN_IDS": str(token_ids).lower(),
                **extra,
            }
            child = stack.enter_context(
                process([sys.executable, "-c", PROXY_MAIN, topic], env=env, ready_line="READY",
                        cwd=Path(extra.get("PYTHONPATH", REPO)))
            )
            targets.append(Target(name, f"http://127.0.0.1:{port}", child.pid, topic))

        started = time.monotonic()
        run_latency(targets, args.calls, args.rounds)
        run_throughput(targets, args.seconds, max(1, round(args.seconds)), args.concurrency)
        captured = {
            t.name: {"sent": t.sent, "on_topic": wait_captured(bootstrap, t)} for t in targets if t.topic
        }
        stripping = strip_cost_us(upstream)

    by_name = {t.name: t for t in targets}
    direct, bare_target = by_name["direct"], by_name["bare_mitmdump"]
    baselines = {
        "direct": [],
        "direct_asking_ids": [direct],
        "bare_mitmdump": [direct],
        "clawr1_token_ids": [direct, bare_target, by_name["direct_asking_ids"]],
    }
    if "clawr1_before_token_ids" in by_name:
        baselines["clawr1_before_token_ids"] = [direct, bare_target, by_name["clawr1_token_ids"]]
    for name in by_name:  # the other Claw-R1 proxies: against direct, bare mitmdump and one process
        baselines.setdefault(name, [direct, bare_target, *([by_name["clawr1"]] if name != "clawr1" else [])])
    result = {
        "bench": "proxy",
        "calls_per_target": args.calls,
        "concurrency": args.concurrency,
        "seconds_per_target": args.seconds,
        "duration_s": round(time.monotonic() - started, 1),
        "targets": {t.name: summary(t, baselines[t.name]) for t in targets},
        "captured": captured,
        "latency_stdev_ms": {t.name: round(statistics.pstdev(t.latency_ms), 3) for t in targets},
        "record_building": record_cost_ms(),
        "token_id_stripping": stripping,
    }
    out = REPO / "bench" / "results" / "bench_proxy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"results: {out}")
    lost = {k: v for k, v in captured.items() if v["on_topic"] < v["sent"]}
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
