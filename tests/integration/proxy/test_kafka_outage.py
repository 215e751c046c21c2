"""Kafka down mid-traffic (its own broker): agents keep working, calls wait in the spool (across a
proxy restart too) and every call reaches the topic exactly once after Kafka returns."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clawr1.broker.launcher import KafkaBroker
from clawr1.core.kafka_io import ensure_topics
from clawr1.core.settings import Settings
from clawr1.demo.standin.toy import DEFAULT_MODEL
from tests.support.ports import free_port
from tests.support.proxy import ProxyProcess, Standin, TopicReader
from tests.support.waiting import holds_for


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(
        data_dir=tmp_path / "kafka", port=free_port(), controller_port=free_port(), heap="512m"
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class Agent:
    """Sends marked chat calls through the proxy's base URL and times them."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=10)
        self.markers: list[str] = []
        self.latencies: list[float] = []

    def call(self, stream: bool = False) -> None:
        marker = uuid.uuid4().hex
        started = time.monotonic()
        response = self.client.post(
            "/v1/chat/completions",
            json={
                "model": DEFAULT_MODEL,
                "messages": [{"role": "user", "content": f"Outage {marker}"}],
                "stream": stream,
            },
        )
        assert response.status_code == 200 and response.content
        self.latencies.append(time.monotonic() - started)
        self.markers.append(marker)


def test_outage_and_proxy_restart_lose_and_duplicate_nothing(
    tmp_path: Path, own_broker: KafkaBroker, standin: Standin
) -> None:
    topic = f"clawr1.test.outage.{uuid.uuid4().hex[:8]}"
    ensure_topics(own_broker.bootstrap, [topic], partitions=4)
    settings = Settings(
        data_dir=tmp_path / "proxy",
        kafka_bootstrap=own_broker.bootstrap,
        proxy_port=0,
        reverse_port=free_port(),
        upstream=standin.url,
    )
    reader = TopicReader(own_broker.bootstrap, topic)
    try:
        agent = Agent(f"http://127.0.0.1:{settings.reverse_port}")
        with ProxyProcess(settings, topic, drain_s=1.0):
            for _ in range(5):
                agent.call()
            reader.wait_for(lambda r: True, count=5)
            own_broker.stop()
            agent.latencies.clear()
            for i in range(10):
                agent.call(stream=i % 2 == 1)
            assert max(agent.latencies) < 1.0, agent.latencies
        assert list((settings.data_dir / "proxy-spool").glob("*.seg")), "undelivered calls must be spooled"

        with ProxyProcess(settings, topic, drain_s=5.0):
            for _ in range(5):
                agent.call()
            own_broker.start()
            reader.wait_for(lambda r: True, count=20, timeout=90)
            holds_for(lambda: len(reader.events()) <= 20, 3,  # room for a duplicate to show up
                      message=lambda: f"{len(reader.events())} records of 20 calls")

        recorded = [next(m for m in agent.markers if m in e.record["request_body"]) for e in reader.events()]
        assert Counter(recorded) == Counter(agent.markers)  # every call exactly once
        assert len({e.record["event_id"] for e in reader.events()}) == 20
    finally:
        reader.close()
