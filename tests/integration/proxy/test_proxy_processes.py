"""The proxy's processes: records are built in an emitter process that outlives a killed proxy long
enough to keep every answered call, and ``CLAWR1_PROXY_PROCESSES`` proxies share one port."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import httpx

from clawr1.core.settings import Settings
from clawr1.demo.standin.toy import DEFAULT_MODEL
from clawr1.proxy.config import PROCESSES_ENV
from tests.support.kafka import read_topic
from tests.support.metrics import scrape, total
from tests.support.ports import free_port
from tests.support.proxy import ProxyProcess, Standin, TopicReader, marked
from tests.support.waiting import wait_until


def children(pid: int) -> list[int]:
    """The proxy's own child processes (not multiprocessing's resource tracker)."""
    tasks = Path(f"/proc/{pid}/task")
    pids = [int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()]
    return [child for child in pids if b"resource_tracker" not in Path(f"/proc/{child}/cmdline").read_bytes()]


def sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def listening(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port``."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {row[9] for row in rows if row[3] == "0A" and int(row[1].split(":")[1], 16) == port}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def chat(client: httpx.Client, marker: str, stream: bool = False) -> None:
    messages = [{"role": "user", "content": f"Processes {marker}"}]
    response = client.post("/v1/chat/completions",
                           json={"model": DEFAULT_MODEL, "messages": messages, "stream": stream})
    assert response.status_code == 200 and response.content


def settings_for(tmp_path: Path, kafka_bootstrap: str, standin: Standin, processes: int) -> Settings:
    return Settings(data_dir=tmp_path / "proxy", kafka_bootstrap=kafka_bootstrap, proxy_port=0,
                    reverse_port=free_port(), upstream=standin.url, extra={PROCESSES_ENV: str(processes)})


def test_calls_answered_before_a_sigkill_reach_kafka_and_the_proxy_restarts(
    tmp_path: Path, kafka_bootstrap: str, standin: Standin, capture_topic: str
) -> None:
    settings = settings_for(tmp_path, kafka_bootstrap, standin, 1)
    settings = settings.with_overrides(proxy_metrics_port=free_port())
    metrics = f"http://127.0.0.1:{settings.proxy_metrics_port}/metrics"
    marker = uuid.uuid4().hex
    reader = TopicReader(kafka_bootstrap, capture_topic)
    try:
        proxy = ProxyProcess(settings, capture_topic)
        with proxy:
            assert proxy.process is not None
            (emitter,) = children(proxy.process.pid)
            with httpx.Client(base_url=f"http://127.0.0.1:{settings.reverse_port}", timeout=10) as client:
                for i in range(30):
                    chat(client, marker, stream=i % 3 == 0)
            # The guarantee is for calls handed to the emitter's pipe: a sender thread does that just after
            # the answer, and a kill inside those milliseconds loses the call (docs/durability.md, "What is
            # not covered"; CI hit it once in 6 runs under load). Kill once the emitter counted all 30.
            wait_until(lambda: total(scrape(metrics), "clawr1_proxy_calls_captured_total") == 30, 30,
                       message="the emitter receiving the 30 calls")
            proxy.process.send_signal(signal.SIGKILL)
            proxy.process.wait()
            assert len(reader.wait_for(marked(marker), count=30, timeout=60)) == 30
            wait_until(lambda: not alive(emitter), 15, interval=0.1,
                       message="an orphaned emitter exiting once it has spooled what it read")

        after = uuid.uuid4().hex
        with ProxyProcess(settings, capture_topic), \
                httpx.Client(base_url=f"http://127.0.0.1:{settings.reverse_port}", timeout=10) as client:
            chat(client, after)
            reader.wait_for(marked(after), timeout=60)
        # Stopped: what its emitter replayed is on the topic, read here to its end.
        replayed = [read for read in read_topic(kafka_bootstrap, capture_topic, skip_undecodable=True)
                    if read.schema == "raw_llm_call" and marked(marker)(read.record)]
        assert len(replayed) == 30  # nothing replayed twice
    finally:
        reader.close()


def test_two_processes_serve_one_port_through_one_emitter(
    tmp_path: Path, kafka_bootstrap: str, standin: Standin, capture_topic: str
) -> None:
    settings = settings_for(tmp_path, kafka_bootstrap, standin, 2)
    marker = uuid.uuid4().hex
    reader = TopicReader(kafka_bootstrap, capture_topic)
    url = f"http://127.0.0.1:{settings.reverse_port}"
    clients = [httpx.Client(base_url=url, timeout=10) for _ in range(24)]
    try:
        with ProxyProcess(settings, capture_topic) as proxy:
            assert proxy.process is not None
            pids = [proxy.process.pid, *children(proxy.process.pid)]
            assert len(pids) == 3  # this one, another proxy, the emitter
            port = listening(settings.reverse_port)
            fronts = [pid for pid in pids if sockets(pid) & port]
            assert len(fronts) == 2 and len(port) == 2  # two listeners on one port (SO_REUSEPORT)
            before = {pid: len(sockets(pid)) for pid in fronts}
            for i, client in enumerate(clients):  # each keeps its connection open
                chat(client, marker, stream=i % 2 == 1)
            assert all(len(sockets(pid)) > before[pid] for pid in fronts), \
                "the kernel spreads the agents' connections over both proxies"
            assert len(reader.wait_for(marked(marker), count=24, timeout=60)) == 24
            assert proxy.stop() == 0
        assert not any(alive(pid) for pid in pids[1:])
        assert len({e.record["event_id"] for e in reader.events(marked(marker))}) == 24
    finally:
        for client in clients:
            client.close()
        reader.close()
