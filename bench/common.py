"""Small helpers the benchmarks share: a percentile, Kafka messages per topic, the records on a topic,
CPU seconds and resident memory per process of a stack, bytes on disk, waiting for a port, a captured
call. Free ports come from tests/support/ports.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from clawr1.core.kafka_io import make_consumer
from clawr1.schemas.codec import codec_for

REPO = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    """The value at fraction ``q`` (0..1) of the sorted sample (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def settled_message_counts(bootstrap: str, label: Callable[[str], str | None]) -> dict[str, int]:
    """Messages in each topic ``label`` names (None skips it), from the offsets, once they stopped
    growing: a worker still finishes work that no awaited output waits for."""
    consumer = make_consumer(bootstrap, "bench-offsets-" + uuid.uuid4().hex[:8])

    def counts() -> dict[str, int]:
        found = {}
        for name, meta in consumer.list_topics(timeout=10).topics.items():
            if (shown := label(name)) is not None:
                found[shown] = sum(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
                                   for p in meta.partitions)
        return dict(sorted(found.items()))

    try:
        previous, current = {}, counts()
        while current != previous:
            time.sleep(3)
            previous, current = current, counts()
        return current
    finally:
        consumer.close()


def records_on_topic(bootstrap: str, topic: str, schema: str) -> int:
    """Records of ``schema`` on ``topic``: of every message, lone or envelope, read to the topic's end."""
    codec = codec_for("")
    consumer = make_consumer(bootstrap, f"bench-{uuid.uuid4().hex[:8]}")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end])
        pending, records = {p for p, end in ends.items() if end}, 0
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() or message.offset() >= ends[message.partition()]:
                    continue
                records += len(codec.decode_records(message.value(), schema, plain=False))
                if message.offset() == ends[message.partition()] - 1:
                    pending.discard(message.partition())
        return records
    finally:
        consumer.close()


def process_cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds process ``pid`` (all its threads; or only its thread ``thread``) has used
    so far (Linux /proc): a figure a busy, shared machine does not distort the way it distorts wall-clock
    rates."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jit_cpu_s(pid: int, tasks: list[Path]) -> float:
    """CPU seconds so far of a JVM's JIT compiler threads (HotSpot's ``C1``/``C2 CompilerThread``s) among
    its ``tasks`` (``/proc/<pid>/task/*``, as listed once by the caller).

    A broker compiles its hot paths for minutes after it starts: a one-time cost that a benchmark of a
    freshly started stack charges to its first loads (about half the broker's CPU in ours)."""
    total = 0.0
    for task in tasks:
        try:
            if "CompilerThre" in (task / "comm").read_text():
                total += process_cpu_s(pid, int(task.name))
        except (FileNotFoundError, ProcessLookupError):  # a compiler thread the JVM let go meanwhile
            continue
    return total


def stack_processes(pid: int) -> list[tuple[str, int]]:
    """``pid`` and its live descendants, each with its role: ``clawr1 <role>`` processes by their role, the
    Kafka broker (a java process) as ``broker``, anything else by its program name after its parent's
    role (``proxy:python``: a process the proxy started)."""
    found: list[tuple[str, int]] = []

    def walk(p: int, parent: str) -> None:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            return
        if "clawr1.cli" in argv and argv.index("clawr1.cli") + 1 < len(argv):
            role = argv[argv.index("clawr1.cli") + 1]
        elif Path(argv[0]).name == "java":
            role = "broker"
        else:
            role = f"{parent}:{Path(argv[0]).name}" if parent else Path(argv[0]).name
        found.append((role, p))
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except FileNotFoundError:
                continue
            for child in children:
                walk(int(child), role)

    walk(pid, "")
    return found


def cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid`` and its live descendants, summed by role (``stack_processes``), the
    broker's JIT compiler threads apart as ``broker_jit``."""
    out: dict[str, float] = {}
    for role, p in stack_processes(pid):
        try:
            cpu = process_cpu_s(p)
            if role == "broker":
                jit = jit_cpu_s(p, list(Path(f"/proc/{p}/task").iterdir()))
                out["broker_jit"] = out.get("broker_jit", 0.0) + jit
                cpu -= jit
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        out[role] = out.get(role, 0.0) + cpu
    return out


def rss_by_role(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid`` and its live descendants, summed by role (``stack_processes``)."""
    page = os.sysconf("SC_PAGE_SIZE")
    out: dict[str, int] = {}
    for role, p in stack_processes(pid):
        try:
            resident = int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[role] = out.get(role, 0) + resident
    return out


def disk_bytes(path: Path) -> int:
    """Bytes ``path`` (a file, or a folder and everything under it) takes on disk, as ``du`` counts them:
    allocated blocks, so Kafka's preallocated, sparse index files count for what they hold."""
    if path.is_file():
        return path.lstat().st_blocks * 512
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # a segment deleted or a part merged meanwhile
                continue
    return total


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Until something accepts connections on ``port`` of this machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout:.0f}s")


def captured_chat_call(request: dict[str, Any], reply_text: str, reply_id: str = "chatcmpl-1") -> Any:
    """A plain (not streamed) chat-completions call as the proxy's hooks hand it to the emitter: the
    request as sent and the engine's JSON reply with ``reply_text``."""
    from clawr1.proxy.hints import Hints
    from clawr1.proxy.record import CapturedCall

    reply = {"id": reply_id, "object": "chat.completion", "model": "standin-1",
             "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                          "message": {"role": "assistant", "content": reply_text}}],
             "usage": {"prompt_tokens": 900, "completion_tokens": 64, "total_tokens": 964}}
    return CapturedCall(
        flow_id="f", api="openai.chat", method="POST", url="http://127.0.0.1:1/v1/chat/completions",
        upstream="http://127.0.0.1:1", request_headers=(("content-type", "application/json"),),
        request_body=json.dumps(request).encode(), hints=Hints(), streamed=False, status=200,
        response_headers=(("content-type", "application/json"),), response_body=json.dumps(reply).encode(),
        response_encoding="", engine_body=None, injection=None, started=1.0, first_byte=1.1, finished=1.2,
        captured_at=1.3)


@contextmanager
def process(
    args: list[str], env: dict[str, str] | None = None, ready_line: str | None = None,
    port: int | None = None, cwd: Path = REPO,
) -> Iterator[subprocess.Popen[str]]:
    """A child process (ready once ``ready_line`` is printed or ``port`` listens), SIGTERMed on exit."""
    child = subprocess.Popen(
        args,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        if ready_line is not None:
            assert child.stdout is not None
            for line in child.stdout:
                if ready_line in line:
                    break
            else:
                raise RuntimeError(f"{args[0]} exited with {child.wait()} before it was ready")
        if port is not None:
            wait_port(port)
        yield child
    finally:
        stop_process(child, signal.SIGTERM)


def stop_process(child: subprocess.Popen[Any], sig: signal.Signals) -> None:
    """``sig``, then SIGKILL if it has not exited within 30 s."""
    child.send_signal(sig)
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
