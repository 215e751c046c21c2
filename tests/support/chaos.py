"""The chaos harness: ``clawr1 up`` in front of the stand-in engine, bounded agent load through every way
in, faults injected one at a time (a role killed, frozen or paused, a broker of a cluster lost, garbage on
the raw topics, a full spool) and the pool's figures once it holds what was acknowledged. The tests of the
stack's healing (tests/integration/test_chaos.py, test_kafka_cluster.py) and the chaos bench
(bench/chaos.py, which documents the run) both drive it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import httpx

from clawr1.gateway.client import GatewayClient, GatewayError
from tests.support.live_stack import CLAWR1, clean_env
from tests.support.ports import free_port, free_ports
from tests.support.waiting import wait_until

HEAL_TIMEOUT_S = 90.0
SPOOL_TMPFS = "4m"


class Stack:
    """``clawr1 up`` in front of a stand-in engine, on free ports and a fresh data dir; ``kafka_nodes``
    brokers on consecutive ports, ``env`` added to its environment."""

    def __init__(self, data_dir: Path, log_file: Path, kafka_nodes: int = 1,
                 env: dict[str, str] | None = None, workers: int = 1) -> None:
        self.data_dir = data_dir
        self.kafka_nodes = kafka_nodes
        self.workers = workers
        self.ports = {name: free_port() for name in ("engine", "api", "proxy", "reverse", "compat")}
        self.ports["kafka"] = free_ports(kafka_nodes)
        self.api = f"http://127.0.0.1:{self.ports['api']}"
        self.reverse = f"http://127.0.0.1:{self.ports['reverse']}"
        self.bootstrap = ",".join(f"127.0.0.1:{self.ports['kafka'] + i}" for i in range(kafka_nodes))
        self.log_file = log_file
        self._log = log_file.open("ab")
        self._env = clean_env(env)
        self.engine: subprocess.Popen[bytes] | None = None
        self.up: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 240.0) -> float:
        started = time.monotonic()
        self.engine = subprocess.Popen([*CLAWR1, "standin-engine", "--port", str(self.ports["engine"])],
                                       env=self._env, stdout=self._log, stderr=self._log)
        self.up = subprocess.Popen(
            [*CLAWR1, "up", "--data-dir", str(self.data_dir), "--api-port", str(self.ports["api"]),
             "--proxy-port", str(self.ports["proxy"]), "--reverse-port", str(self.ports["reverse"]),
             "--kafka-port", str(self.ports["kafka"]), "--kafka-nodes", str(self.kafka_nodes),
             "--compat-port", str(self.ports["compat"]), "--workers", str(self.workers),
             "--upstream", f"http://127.0.0.1:{self.ports['engine']}"],
            env=self._env, stdout=self._log, stderr=self._log)
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def health(self) -> set[str]:
        """The parts /healthz names as missing (``no answer`` while the API itself is down)."""
        return set(self.problems())

    def problems(self) -> dict[str, str]:
        """What /healthz names as not healthy, with its reason where it gives one."""
        try:
            reply = httpx.get(f"{self.api}/healthz", timeout=2)
        except httpx.HTTPError:
            return {"no answer": ""}
        if reply.status_code == 200:
            return {}
        body = reply.json()
        named = {name: body.get("problems", {}).get(name, "") for name, ok in body.get("parts", {}).items()
                 if not ok}
        return named or {str(reply.status_code): ""}

    def wait_healthy(self, timeout: float, until: Callable[[], bool] = lambda: True,
                     missing: set[str] | None = None) -> float:
        """Seconds until /healthz answers 200 and ``until`` holds, adding what it named meanwhile to
        ``missing``; raises past ``timeout``."""
        started = time.monotonic()

        def healthy() -> bool:
            assert self.up is not None
            if self.up.poll() is not None:
                raise RuntimeError(f"clawr1 up exited with {self.up.returncode}")
            named = self.health()
            if missing is not None:
                missing.update(named)
            return not named and until()

        wait_until(healthy, timeout, interval=0.2, message="not healthy")
        return time.monotonic() - started

    def roles(self) -> dict[str, dict[str, object]]:
        """The supervisor's view (run/supervisor.json)."""
        try:
            state = json.loads((self.data_dir / "run" / "supervisor.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {role["role"]: role for role in state["roles"]}

    def pid(self, role: str) -> int:
        return int(str(self.roles()[role]["pid"]))

    def sql(self, query: str) -> list[dict[str, object]]:
        reply = httpx.post(f"{self.api}/v1/sql", json={"query": query, "format": "JSONEachRow"}, timeout=60)
        reply.raise_for_status()
        return [json.loads(line) for line in reply.text.splitlines() if line.strip()]

    def stop(self) -> int | None:
        """SIGINT, as Ctrl-C: returns clawr1 up's exit code (None if it had to be killed)."""
        code = None
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGINT)
            try:
                code = self.up.wait(120)
            except subprocess.TimeoutExpired:
                self.up.kill()
                self.up.wait()
        elif self.up is not None:
            code = self.up.returncode
        if self.engine is not None:
            self.engine.terminate()
            self.engine.wait(30)
        self._log.close()
        return code


@contextmanager
def running(stack: Stack) -> Iterator[Stack]:
    """``stack`` started and, on the way out, stopped as with Ctrl-C; it must then exit with 0."""
    try:
        stack.start()
        yield stack
    finally:
        code = stack.stop()
    assert code == 0, f"clawr1 up did not stop cleanly on SIGINT (exit {code}); see {stack.log_file}"


@dataclass
class LoadFigures:
    proxy_calls_answered: int = 0
    proxy_calls_failed: int = 0
    streamed_answered: int = 0
    batches_acked: int = 0
    batches_failed: int = 0
    steps_acked: int = 0
    feedback_acked: int = 0


@dataclass(frozen=True)
class Answer:
    """One probe request: when it was sent and answered (monotonic clock), and the HTTP status (0: none)."""

    sent: float
    answered: float
    status: int
    retry_after: bool = False  # a 429 that said when to come back (the gateway's backpressure)


@dataclass
class Load:
    """Bounded agent loops: an agent through the proxy, ``whitebox_clients`` gateway clients, and with
    ``probe`` one posting a step at a time without retries (every answer kept);
    what they were told was accepted is what must be in the pool."""

    stack: Stack
    run_id: str
    whitebox_clients: int = 1
    batch_size: int = 10
    max_ops: int = 20_000
    pause_s: float = 0.05
    probe: bool = False
    figures: LoadFigures = field(default_factory=LoadFigures)
    answered: set[str] = field(default_factory=set)
    acked: dict[str, tuple[str, int]] = field(default_factory=dict)
    rewarded: set[str] = field(default_factory=set)
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        clients = [partial(self._whitebox_agent, n) for n in range(self.whitebox_clients)]
        targets = [self._proxy_agent, *clients, *([self._gateway_probe] if self.probe else [])]
        for n, target in enumerate(targets):
            thread = threading.Thread(target=target, name=f"chaos-load-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(180)

    def _proxy_agent(self) -> None:
        from openai import OpenAI, OpenAIError

        agent = OpenAI(base_url=f"{self.stack.reverse}/v1", api_key="sk-chaos-agent", max_retries=0,
                       timeout=15)
        for i in range(self.max_ops):
            if self._stop.is_set():
                return
            marker = f"chaos-{self.run_id}-call-{i}"
            messages = [{"role": "user", "content": f"{marker}: say something"}]
            try:
                if i % 2:
                    chunks = list(agent.chat.completions.create(model="m", messages=messages, stream=True))
                    if not any(c.choices and c.choices[0].finish_reason for c in chunks):
                        raise OpenAIError("stream ended without a finish reason")
                    self.figures.streamed_answered += 1
                else:
                    agent.chat.completions.create(model="m", messages=messages)
            except OpenAIError:
                self.figures.proxy_calls_failed += 1  # not seen answered: nothing is owed
                time.sleep(0.2)
                continue
            self.answered.add(marker)
            self.figures.proxy_calls_answered += 1
            time.sleep(self.pause_s)

    def _whitebox_agent(self, client_no: int) -> None:
        client = GatewayClient(self.stack.api, batch_size=self.batch_size, timeout_s=15, retry_for_s=120)
        with client:
            for i in range(self.max_ops):
                if self._stop.is_set():
                    return
                trajectory = f"chaos-{self.run_id}-t{client_no}-{i}"
                steps = [{"trajectory_id": trajectory, "step_index": n, "prompt_token_ids": [1, 2, n],
                          "response_token_ids": [3, i % 250], "terminal": n == self.batch_size - 1}
                         for n in range(self.batch_size)]
                try:
                    ids = client.submit_steps(steps)
                    with self._lock:
                        self.acked.update((step_id, (trajectory, n)) for n, step_id in enumerate(ids))
                        self.figures.batches_acked += 1
                        self.figures.steps_acked += len(ids)
                    client.submit_feedback({"step_id": ids[0], "reward": 1.0, "source": "chaos"})
                    with self._lock:
                        self.rewarded.add(ids[0])
                        self.figures.feedback_acked += 1
                except GatewayError:
                    with self._lock:
                        self.figures.batches_failed += 1
                time.sleep(self.pause_s * 4)

    def _gateway_probe(self) -> None:
        """What a client without retries sees: each answer's status and how long it took."""
        with httpx.Client(base_url=self.stack.api, timeout=30) as client:
            for i in range(self.max_ops):
                if self._stop.is_set():
                    return
                trajectory = f"chaos-{self.run_id}-tprobe-{i}"
                sent = time.monotonic()
                try:
                    reply = client.post("/v1/steps", json=[{
                        "trajectory_id": trajectory, "step_index": 0, "prompt_token_ids": [5, i % 250],
                        "response_token_ids": [6], "terminal": True}])
                    status = reply.status_code
                    retry_after = "retry-after" in reply.headers
                except httpx.HTTPError:
                    status, retry_after = 0, False
                self.answers.append(Answer(sent, time.monotonic(), status, retry_after))
                if status == 202:
                    self.acked[reply.json()["ids"][0]] = (trajectory, 0)
                time.sleep(self.pause_s * 2)

    def refusals_after(self, started: float, until: float | None = None) -> dict[str, float]:
        """The probe's view of a fault at ``started`` (up to the next one, at ``until``): how long after
        it the last refusal came (0 when none did), how many there were, and the slowest
        acknowledgement of a request sent after it. Backpressure (429 with Retry-After: the pipeline
        behind ``CLAWR1_MAX_LAG_S``, docs/gateway.md) is counted apart: an answer saying when to come
        back, not a failed write."""
        after = [a for a in self.answers if a.sent >= started and (until is None or a.sent < until)]
        held = [a for a in after if a.status == 429 and a.retry_after]
        refused = [a for a in after if a.status != 202 and a not in held]
        acked = [a for a in after if a.status == 202]
        return {"refused": len(refused),
                "refused_for_s": round(max((a.answered - started for a in refused), default=0.0), 1),
                "held_back": len(held),
                "held_back_for_s": round(max((a.answered - started for a in held), default=0.0), 1),
                "slowest_ack_s": round(max((a.answered - a.sent for a in acked), default=0.0), 1)}


@dataclass
class Fault:
    name: str
    healthy_after_s: float
    detail: str = ""
    health_named: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    at: float = 0.0  # when it was injected (monotonic clock): the probe's answers after it are its own


def _restarted(stack: Stack, role: str, old_pid: int) -> Callable[[], bool]:
    def check() -> bool:
        state = stack.roles().get(role, {})
        return state.get("state") == "running" and state.get("pid") not in (None, old_pid)
    return check


def kill_role(stack: Stack, role: str, sig: signal.Signals = signal.SIGKILL) -> Fault:
    pid = stack.pid(role)
    at = time.monotonic()
    os.kill(pid, sig)
    missing: set[str] = set()
    healthy = stack.wait_healthy(HEAL_TIMEOUT_S, _restarted(stack, role, pid), missing)
    return Fault(f"{sig.name} {role}", healthy, health_named=sorted(missing), at=at)


def kafka_view(bootstrap: str) -> tuple[int | None, set[int], int]:
    """The active controller's id, the live brokers and how many partitions are under-replicated."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    controller = admin.describe_cluster(request_timeout=10).result(15).controller
    metadata = admin.list_topics(timeout=10)
    lagging = sum(1 for topic in metadata.topics.values() for p in topic.partitions.values()
                  if len(p.isrs) < len(p.replicas))
    return (controller.id if controller else None), set(metadata.brokers), lagging


def answers_itself(stack: Stack, node: int) -> bool:
    """Broker ``node``'s own listener answers for it. The cluster's metadata is no witness: a broker
    SIGKILLed and restarted within the controller's session timeout is still listed live and its
    replicas still in sync while its new process has not started serving (a rolling restart once sent
    the next SIGTERM to such a broker 2 s into its start-up; Kafka faulted and hung in its exit)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{stack.ports['kafka'] + node - 1}", "log_level": 0})
    return bool(admin.list_topics(timeout=5).orig_broker_id == node)


def broker_fault(stack: Stack, node: int, sig: signal.Signals) -> Fault:
    """``sig`` to broker ``node`` of a cluster; back once the supervisor restarted it, /healthz is 200,
    the new broker process serves and is live again, and no partition is under-replicated (it caught
    up)."""
    fault = kill_role(stack, f"broker-{node}", sig)
    back_s = in_sync_s = None
    while (elapsed := time.monotonic() - fault.at) < HEAL_TIMEOUT_S:
        with contextlib.suppress(Exception):  # a cluster between leaders may not answer at once
            _, live, lagging = kafka_view(stack.bootstrap)
            back_s = back_s or (elapsed if node in live and answers_itself(stack, node) else None)
            if back_s and not lagging:
                in_sync_s = elapsed
                break
        time.sleep(0.5)
    if in_sync_s is None:
        raise TimeoutError(f"broker {node} not back in sync within {HEAL_TIMEOUT_S:.0f}s")
    fault.figures = {"back_s": round(back_s or in_sync_s, 1), "in_sync_s": round(in_sync_s, 1)}
    return fault


def kill_controller(stack: Stack) -> Fault:
    """SIGKILL the node that is the active controller: its partitions and the quorum both lose a leader."""
    controller, _, _ = kafka_view(stack.bootstrap)
    fault = broker_fault(stack, controller or 1, signal.SIGKILL)
    fault.detail = "the active controller"
    return fault


def rolling_restart(stack: Stack) -> list[tuple[str, Callable[[Stack], Fault]]]:
    """SIGTERM each broker in turn, the next once the last is back in sync."""
    return [(f"restart broker-{node}", lambda s, node=node: broker_fault(s, node, signal.SIGTERM))
            for node in range(1, stack.kafka_nodes + 1)]


def pause_broker(stack: Stack, seconds: float = 8.0) -> Fault:
    pid = stack.pid("broker")
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    healthy = stack.wait_healthy(HEAL_TIMEOUT_S) + time.monotonic() - started - seconds
    return Fault("SIGSTOP broker", healthy, f"paused {seconds:.0f}s, then SIGCONT")


def freeze_worker(stack: Stack, seconds: float) -> Fault:
    """SIGSTOP the last worker: /healthz must name it within the stall window and the supervisor must
    restart it; the pool keeps filling meanwhile when another worker takes its partitions."""
    role = "worker" if stack.workers == 1 else f"worker-{stack.workers - 1}"
    pid = stack.pid(role)
    before = int(str(stack.sql("SELECT count() AS n FROM steps")[0]["n"]))
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    named_after: float | None = None
    reason = ""
    try:
        while time.monotonic() - started < seconds:
            problems = stack.problems()
            if named_after is None and any(name.startswith("worker") for name in problems):
                named_after = time.monotonic() - started
                reason = next(r for name, r in problems.items() if name.startswith("worker"))
            if _restarted(stack, role, pid)():
                break
            time.sleep(0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the supervisor may have killed it already
            os.kill(pid, signal.SIGCONT)
    restarted_after = time.monotonic() - started if _restarted(stack, role, pid)() else None
    meanwhile = int(str(stack.sql("SELECT count() AS n FROM steps")[0]["n"])) - before
    stack.wait_healthy(HEAL_TIMEOUT_S, _restarted(stack, role, pid))
    figures = {"named_unhealthy_after_s": None if named_after is None else round(named_after, 1),
               "reason": reason,
               "restarted_after_s": None if restarted_after is None else round(restarted_after, 1),
               "steps_into_pool_while_frozen": meanwhile}
    return Fault(f"SIGSTOP {role}", time.monotonic() - started, json.dumps(figures),
                 ["worker"] if named_after is not None else [], figures)


def corrupt_raw(stack: Stack, count: int = 5) -> Fault:
    from confluent_kafka import Producer

    from clawr1.core.topics import RAW_FEEDBACK, RAW_LLM, RAW_STEPS

    producer = Producer({"bootstrap.servers": stack.bootstrap})
    for i in range(count):
        for topic in (RAW_LLM, RAW_STEPS, RAW_FEEDBACK):
            producer.produce(topic.name, key=b"chaos", value=b"\x00garbage " + str(i).encode())
    producer.flush(30)
    return Fault("garbage on raw topics", stack.wait_healthy(HEAL_TIMEOUT_S), f"{count * 3} records")


def fill_spool(stack: Stack, seconds: float = 6.0) -> Fault:
    """The proxy's spool (a small tmpfs) is full for a while: calls still answered, captures held."""
    spool = stack.data_dir / "proxy-spool"
    filler = spool / "chaos-filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):  # ENOSPC: that is the point
        while True:
            os.write(fd, b"\0" * 65536)
    os.close(fd)
    full = os.statvfs(spool).f_bavail == 0
    started = time.monotonic()
    time.sleep(seconds)
    filler.unlink()
    healthy = stack.wait_healthy(HEAL_TIMEOUT_S) + time.monotonic() - started - seconds
    return Fault("spool disk full", healthy, f"{SPOOL_TMPFS} tmpfs {'full' if full else 'NOT full'} "
                 f"for {seconds:.0f}s")


QUICK_FAULTS: list[tuple[str, Callable[[Stack], Fault]]] = [
    (role, lambda stack, role=role: kill_role(stack, role)) for role in ("worker", "proxy", "api", "broker")
]
FULL_EXTRAS: list[tuple[str, Callable[[Stack], Fault]]] = [
    ("restart broker", lambda stack: kill_role(stack, "broker", signal.SIGTERM)),
    ("pause broker", pause_broker),
    ("corrupt raw", corrupt_raw),
]


def count_pool(stack: Stack, load: Load) -> dict[str, object]:
    prefix = f"chaos-{load.run_id}-"
    white = stack.sql(
        f"SELECT step_id, trajectory_id, step_index, reward FROM steps "
        f"WHERE startsWith(trajectory_id, '{prefix}t')")
    calls = stack.sql(
        f"SELECT extract(prompt_messages, '{prefix}call-[0-9]+') AS marker FROM steps "
        f"WHERE source_kind = 'blackbox_agent' AND position(prompt_messages, '{prefix}call-') > 0")
    identities = Counter((str(r["trajectory_id"]), int(str(r["step_index"]))) for r in white)
    markers = Counter(str(r["marker"]) for r in calls)
    in_pool = {str(r["step_id"]) for r in white}
    rewarded = {str(r["step_id"]) for r in white if r["reward"] is not None}
    return {
        "steps_acked": len(load.acked),
        "steps_in_pool": len(white),
        "steps_lost": len(set(load.acked) - in_pool),
        "steps_duplicated": sum(n - 1 for n in identities.values()),
        "calls_answered": len(load.answered),
        "calls_captured": len(markers),
        "calls_lost": len(load.answered - set(markers)),
        "calls_duplicated": sum(n - 1 for n in markers.values()),
        "rewards_sent": len(load.rewarded),
        "rewards_joined": len(load.rewarded & rewarded),
        "dead_letters": int(str(stack.sql("SELECT count() AS n FROM dead_letters")[0]["n"])),
    }


def drain(stack: Stack, load: Load, timeout: float) -> tuple[dict[str, object], float]:
    """Pool figures once everything acknowledged arrived (or ``timeout`` passed)."""
    started = time.monotonic()
    while True:
        figures = count_pool(stack, load)
        complete = figures["steps_lost"] == 0 and figures["calls_lost"] == 0 and \
            figures["rewards_joined"] == figures["rewards_sent"]
        if complete or time.monotonic() - started > timeout:
            return figures, time.monotonic() - started
        time.sleep(2)


@contextmanager
def spool_tmpfs(data_dir: Path, wanted: bool) -> Iterator[bool]:
    """Mount a small tmpfs on the proxy's spool when wanted and root may; yields whether it did."""
    spool = data_dir / "proxy-spool"
    spool.mkdir(parents=True, exist_ok=True)
    mounted = wanted and os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SPOOL_TMPFS},mode=0700", "tmpfs", str(spool)],
        capture_output=True, check=False).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(spool)], check=False)


def run_faults(stack: Stack, plan: list[tuple[str, Callable[[Stack], Fault]]], settle_s: float,
               drain_s: float, first_fault_s: float | None = None, whitebox_clients: int = 1,
               probe: bool = False) -> dict[str, object]:
    """Load on a healthy stack, the first fault after ``first_fault_s`` of it (default ``settle_s``), each
    next after ``settle_s``, then the pool's figures once it holds everything acknowledged; with
    ``probe``, each fault's figures add what a client without retries saw after it."""
    load = Load(stack, run_id=f"{time.time_ns()}", whitebox_clients=whitebox_clients, probe=probe)
    faults: list[Fault] = []
    load.start()
    started = time.monotonic()
    try:
        for n, (_name, inject) in enumerate(plan):
            time.sleep(first_fault_s if n == 0 and first_fault_s is not None else settle_s)
            faults.append(inject(stack))
            print(f"[chaos] {faults[-1].name}: healthy again after {faults[-1].healthy_after_s:.1f}s "
                  f"(/healthz named {faults[-1].health_named})", flush=True)
        time.sleep(settle_s)
    finally:
        load.stop()
    load_s = time.monotonic() - started
    if probe:
        for fault, following in zip(faults, [*faults[1:], None], strict=True):
            fault.figures |= load.refusals_after(fault.at, following.at if following else None)
    pool, drained_s = drain(stack, load, drain_s)
    return {
        "load_s": round(load_s, 1),
        "load": asdict(load.figures),
        "faults": [asdict(f) | {"healthy_after_s": round(f.healthy_after_s, 1)} for f in faults],
        "pool": pool,
        "drained_s": round(drained_s, 1),
        "stack_stayed_up": stack.up is not None and stack.up.poll() is None,
        "restarts": {name: role["restarts"] for name, role in stack.roles().items()},
    }


# A killed broker of a cluster comes back after this long (the supervisor's first backoff): long enough
# for the cluster to fence it and move its partitions' leaders, so the run shows the cluster serving
# without it, not only a fast restart.
CLUSTER_RESTART_BACKOFF_S = "5"


def cluster_stack(data_dir: Path, log_file: Path, nodes: int = 3) -> Stack:
    return Stack(data_dir, log_file, kafka_nodes=nodes,
                 env={"CLAWR1_RESTART_BACKOFF_S": CLUSTER_RESTART_BACKOFF_S})


def cluster_plan(stack: Stack) -> list[tuple[str, Callable[[Stack], Fault]]]:
    """The active controller SIGKILLed, then a rolling restart of every broker."""
    return [("kill controller", kill_controller), *rolling_restart(stack)]
