"""``clawr1 up``: the local stack as one supervised group of processes.

The supervisor owns the Kafka broker (when no external bootstrap is configured) and starts one
process per role: the API process (gateway + pool SQL + sink; it owns the embedded chDB pool, which
allows a single process), the stream worker, the proxy, and the rewarder when
``CLAWR1_REWARD_FN`` names a reward function. Children get the same settings through
``CLAWR1_*`` variables. If any child dies, the stack stops rather than run half-alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from broker.launcher import KafkaBroker, stop_on_signals
from clawr1 import readiness
from clawr1.kafka_io import ensure_topics
from clawr1.settings import Settings, settings_to_env
from clawr1.topics import ALL_TOPICS


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def _spawn(name: str, args: list[str], env: dict[str, str]) -> Child:
    command = [sys.executable, "-m", "clawr1.cli", *args]
    return Child(name, subprocess.Popen(command, env=env, start_new_session=True))


def _stop(children: list[Child], timeout: float = 20.0) -> None:
    """Reverse start order: the proxy stops taking traffic before the pool owner goes away."""
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in reversed(children):
        remaining = max(0.1, deadline - time.monotonic())
        try:
            child.process.wait(remaining)
        except subprocess.TimeoutExpired:
            print(f"[clawr1] {child.name} did not stop in time; killing it", file=sys.stderr, flush=True)
            child.process.kill()
            child.process.wait()


def wait_healthy(api_url: str, children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        for child in children:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode} during start-up")
        try:
            reply = httpx.get(f"{api_url}/healthz", timeout=2)
            if reply.status_code == 200:
                return
            last = reply.text
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"stack not healthy after {timeout:.0f}s: {last}")


def run_stack(settings: Settings, demo: bool = False, health_timeout: float = 180.0) -> int:
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    readiness.clear(data_dir)
    stop = stop_on_signals()

    broker: KafkaBroker | None = None
    children: list[Child] = []
    started = time.monotonic()
    try:
        if settings.manages_kafka:
            broker = KafkaBroker(
                data_dir=data_dir / "kafka", port=settings.kafka_port, heap=settings.kafka_heap
            )
            broker.start()
            print(f"[clawr1] kafka ready on {broker.bootstrap}", flush=True)
        ensure_topics(settings.bootstrap_servers, [t.name for t in ALL_TOPICS], settings.topic_partitions)
        env = {
            **os.environ,
            **settings_to_env(settings),
            "CLAWR1_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        }
        if demo and not settings.upstream:
            engine_port = settings.extra.get("CLAWR1_DEMO_ENGINE_PORT", "8091")
            children.append(_spawn("standin-engine", ["standin-engine", "--port", engine_port], env))
            env["CLAWR1_UPSTREAM"] = f"http://127.0.0.1:{engine_port}"
            env["CLAWR1_CAPTURE_TOKEN_IDS"] = "true"  # the stand-in speaks vLLM's token-id fields
            if not settings.reverse_port:
                env["CLAWR1_REVERSE_PORT"] = str(settings.proxy_port + 1)
        rewarding = bool(settings.role_setting("CLAWR1_REWARD_FN", ""))
        parts = "worker,proxy,rewarder" if rewarding else "worker,proxy"
        children.append(_spawn("api", ["api", "--expect-parts", parts], env))
        children.append(_spawn("worker", ["worker"], env))
        children.append(_spawn("proxy", ["proxy"], env))
        if rewarding:
            children.append(_spawn("rewarder", ["rewarder"], env))
        api_url = f"http://127.0.0.1:{settings.api_port}"
        wait_healthy(api_url, children, health_timeout)
        print(
            f"[clawr1] stack healthy in {time.monotonic() - started:.1f}s: API {api_url}, "
            f"proxy 127.0.0.1:{settings.proxy_port}, reverse {env.get('CLAWR1_REVERSE_PORT', '0')}, "
            f"data {data_dir}",
            flush=True,
        )
        if demo:
            from demo.workload import run_demo

            run_demo(api_url=api_url, reverse_url=f"http://127.0.0.1:{env['CLAWR1_REVERSE_PORT']}")
        while not stop.is_set():
            for child in children:
                if child.process.poll() is not None:
                    print(
                        f"[clawr1] {child.name} exited with {child.process.returncode}; stopping the stack",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
            stop.wait(0.3)
        return 0
    finally:
        _stop(children)
        if broker is not None:
            broker.stop()
        readiness.clear(data_dir)
        print("[clawr1] stopped", flush=True)
