"""``clawr1 up``: the local stack as one supervised group of processes.

The stack owns the Kafka broker, or a local cluster of ``CLAWR1_KAFKA_NODES`` brokers, each a role
of its own (when no external bootstrap is configured), and starts one process per role: the API
process (gateway + pool SQL + sink + compat port; it owns the embedded chDB pool, which allows a
single process), the stream worker, the proxy, and the rewarder when
``CLAWR1_REWARD_FN`` names a reward function. Children get the same settings through ``CLAWR1_*``
variables. Once the stack is healthy, a role that dies is restarted (``clawr1.supervisor``); an exit
during start-up, or a crash loop, stops the whole stack with the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from clawr1 import readiness
from clawr1.broker.launcher import FatalFaultWatch, KafkaCluster
from clawr1.core import registry
from clawr1.core.kafka_io import ensure_topics
from clawr1.core.progress import ProgressWatch
from clawr1.core.settings import Settings, settings_to_env
from clawr1.core.signals import stop_on_signals
from clawr1.core.topics import ALL_TOPICS
from clawr1.status import BOOTSTRAP_FILE
from clawr1.streams.config import StreamConfig
from clawr1.supervisor import ProcessRole, RestartPolicy, Supervisor

STATE_FILE = Path("run") / "supervisor.json"


def _cli_role(name: str, args: list[str], env: dict[str, str], data_dir: Path) -> ProcessRole:
    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "clawr1.cli", *args], env=env,
                                stderr=subprocess.PIPE, start_new_session=True)

    return ProcessRole(name, launch, on_exit=lambda: readiness.withdraw(data_dir, name),
                       dump_signal=signal.SIGUSR1)


def _reported(data_dir: Path, part: str, check: Callable[[float], str | None],
              started_at: float) -> str | None:
    """``check``'s verdict, and /healthz names the part with it until the part is ready again. The check's
    clock starts when this process of the part marked itself ready (its start until then)."""
    ready_for = readiness.ready_for_s(data_dir, part)
    reason = check(started_at if ready_for is None else max(started_at, time.monotonic() - ready_for))
    if reason is not None:
        readiness.report_problem(data_dir, part, reason)
    return reason


def _healthy(api_url: str) -> tuple[bool, str]:
    try:
        reply = httpx.get(f"{api_url}/healthz", timeout=2)
    except httpx.HTTPError as exc:
        return False, str(exc)
    return reply.status_code == 200, reply.text


def wait_healthy(api_url: str, supervisor: Supervisor, timeout: float, stop: threading.Event) -> str | None:
    """None once /healthz answers 200; otherwise why the stack cannot start."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline and not stop.is_set():
        problem = supervisor.tick(restarting=False)
        if problem is not None:
            return problem
        ok, last = _healthy(api_url)
        if ok:
            return None
        stop.wait(0.3)
    return "stopped during start-up" if stop.is_set() else f"stack not healthy after {timeout:.0f}s: {last}"


def run_stack(settings: Settings, demo: bool = False, health_timeout: float = 180.0) -> int:
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    readiness.clear(data_dir)
    stop = stop_on_signals()
    supervisor = Supervisor(RestartPolicy.from_settings(settings), state_file=data_dir / STATE_FILE)
    started = time.monotonic()
    demo_thread: threading.Thread | None = None
    progress: ProgressWatch | None = None
    try:
        # Topics follow the cluster's replication (ensure_topics); the worker's changelogs need it named.
        replicated: dict[str, str] = {}
        if settings.manages_kafka:
            cluster = KafkaCluster(data_dir / "kafka", settings.kafka_port, settings.kafka_nodes,
                                   settings.kafka_heap, settings.role_setting(registry.KAFKA_REQUEST_LOG))
            for broker in cluster.brokers:
                # Tier 0: stopped after its clients, so they flush into it first.
                # A JVM prints every thread's stack to its stdout (our log) on SIGQUIT, and goes on.
                supervisor.add(ProcessRole(cluster.role_name(broker), broker.launch, log_file=broker.log_file,
                                           stop_timeout_s=60.0, dump_signal=signal.SIGQUIT,
                                           votes=settings.kafka_nodes > 1),
                               tier=0, health=FatalFaultWatch(broker))
            cluster.wait_ready(120.0)
            replicated["CLAWR1_STREAMS_REPLICATION"] = str(cluster.layout.replication.factor)
            print(f"[clawr1] kafka ready on {cluster.bootstrap}", flush=True)
        (data_dir / BOOTSTRAP_FILE).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / BOOTSTRAP_FILE).write_text(settings.bootstrap_servers)
        ensure_topics(settings.bootstrap_servers, [t.name for t in ALL_TOPICS], settings.topic_partitions)
        env = {
            **replicated,
            **os.environ,
            **settings_to_env(settings),
            "CLAWR1_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        }
        if demo and not settings.upstream:
            engine_port = str(settings.role_setting(registry.DEMO_ENGINE_PORT))
            engine = ["standin-engine", "--port", engine_port]
            supervisor.add(_cli_role("standin-engine", engine, env, data_dir))
            env["CLAWR1_UPSTREAM"] = f"http://127.0.0.1:{engine_port}"
            env["CLAWR1_CAPTURE_TOKEN_IDS"] = "true"  # the stand-in speaks vLLM's token-id fields
            if not settings.reverse_port:
                env["CLAWR1_REVERSE_PORT"] = str(settings.proxy_port + 1)
        if demo and not settings.role_setting(registry.REWARD_FN):
            # The demo's rewarder scores every step (the default readiness needs a step reward).
            env |= {"CLAWR1_REWARD_FN": "clawr1.demo.tasks:demo_reward", "CLAWR1_REWARD_TARGET": "step"}
        rewarding = bool(env.get("CLAWR1_REWARD_FN"))
        worker_names = ["worker", *(f"worker-{n}" for n in range(1, settings.role_setting(registry.WORKERS)))]
        parts = ",".join([*worker_names, "proxy", *(["rewarder"] if rewarding else [])])
        supervisor.add(_cli_role("api", ["api", "--expect-parts", parts], env, data_dir))
        # Workers restarted in place: a slot's instance id lets its next process resume at once and abort
        # its predecessor's open transaction (docs/streams.md). One that stops making progress (its
        # partitions stall, or it dropped out of its group) is restarted too.
        stall_s = settings.role_setting(registry.STALL_S)
        worker_config = StreamConfig.from_settings(settings)
        progress = ProgressWatch(settings.bootstrap_servers,
                                 {worker_config.app_id: worker_config.topics.inputs()}, stall_s).start()
        for slot, name in enumerate(worker_names):
            instance = f"up-{slot}"
            worker_env = {**env, "CLAWR1_STREAMS_INSTANCE_ID": instance}
            member = f"{worker_config.app_id}-{instance}"  # its client id (clawr1.streams.app)
            supervisor.add(_cli_role(name, ["worker", "--ready-as", name], worker_env, data_dir),
                           health=partial(_reported, data_dir, name, partial(
                               progress.member_problem, worker_config.app_id, member)),
                           grace_s=stall_s)
        supervisor.add(_cli_role("proxy", ["proxy"], env, data_dir))
        if rewarding:
            supervisor.add(_cli_role("rewarder", ["rewarder"], env, data_dir))
        api_url = f"http://127.0.0.1:{settings.api_port}"
        problem = wait_healthy(api_url, supervisor, health_timeout, stop)
        if problem is not None:
            return _fail(problem, stop)
        print(
            f"[clawr1] stack healthy in {time.monotonic() - started:.1f}s: API {api_url}, "
            f"proxy 127.0.0.1:{settings.proxy_port}, reverse {env.get('CLAWR1_REVERSE_PORT', '0')}, "
            f"data {data_dir}",
            flush=True,
        )
        if demo:
            compat_url = f"http://127.0.0.1:{settings.compat_port}" if settings.compat_port else None
            reverse_url = f"http://127.0.0.1:{env['CLAWR1_REVERSE_PORT']}"
            demo_thread = _start_demo(api_url, reverse_url, compat_url, env.get("CLAWR1_UPSTREAM"), stop)
        while not stop.is_set():
            problem = supervisor.tick()
            if problem is not None:
                return _fail(f"{problem}\n[clawr1] stopping the stack", stop)
            stop.wait(0.3)
        return 0
    finally:
        stop.set()  # also after a crash loop: the demo's actors end too
        if progress is not None:
            progress.stop()
        if demo_thread is not None:  # its actors finish their call before the roles stop under them
            demo_thread.join(timeout=30)
        supervisor.stop_all()
        readiness.clear(data_dir)
        (data_dir / BOOTSTRAP_FILE).unlink(missing_ok=True)
        print("[clawr1] stopped", flush=True)


def _fail(problem: str, stop: threading.Event) -> int:
    if stop.is_set():  # Ctrl-C during start-up is a clean stop, not a failure
        return 0
    print(f"[clawr1] {problem}", file=sys.stderr, flush=True)
    return 1


def _start_demo(api_url: str, reverse_url: str, compat_url: str | None, engine_url: str | None,
                stop: threading.Event) -> threading.Thread:
    """The demo loop runs beside the supervision loop (a role dying during it is restarted) until ``stop``."""
    from clawr1.demo.workload import run_demo

    thread = threading.Thread(target=run_demo, name="demo", daemon=True, kwargs={
        "api_url": api_url, "reverse_url": reverse_url, "compat_url": compat_url, "stop": stop,
        "engine_url": engine_url})
    thread.start()
    return thread
