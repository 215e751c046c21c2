"""A live gateway for the tests (served in a thread, tests/support/asgi.py) and a reader of its topics
that checks each record sits on the partition its key hashes to."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from confluent_kafka import TopicPartition

from clawr1.core.kafka_io import make_consumer
from clawr1.core.routing import partition_of
from clawr1.core.settings import Settings
from clawr1.gateway.app import create_app
from clawr1.gateway.config import GatewayTopics
from tests.support.asgi import AsgiServer, serve_asgi
from tests.support.kafka import read_topic as support_read_topic
from tests.support.waiting import wait_until

TEST_PARTITIONS = 2


def unique_topics() -> GatewayTopics:
    suffix = uuid.uuid4().hex[:10]
    return GatewayTopics(f"gw.steps.{suffix}", f"gw.feedback.{suffix}", f"gw.events.{suffix}")


@dataclass
class LiveGateway:
    url: str
    bootstrap: str
    topics: GatewayTopics
    server: AsgiServer
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def read(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        return read_topic(self.bootstrap, getattr(self.topics, kind))


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    replies: list[httpx.Response] = []

    def healthy() -> bool:
        replies.append(httpx.get(f"{url}/healthz", timeout=5.0))
        return replies[-1].status_code == 200

    wait_until(healthy, timeout, interval=0.1, message=lambda: f"gateway not healthy: {replies[-1].text}")


@contextmanager
def running_gateway(bootstrap: str, *, healthy: bool = True, **create: Any) -> Iterator[LiveGateway]:
    """``create`` takes ``settings`` overrides (as ``settings=``) and create_app's keyword arguments."""
    settings: Settings = create.pop("settings", None) or Settings()
    settings = settings.with_overrides(kafka_bootstrap=bootstrap, topic_partitions=TEST_PARTITIONS)
    topics = create.pop("topics", None) or unique_topics()
    with serve_asgi(create_app(settings, topics=topics, **create)) as server:
        if healthy:
            wait_healthy(server.url)
        gateway = LiveGateway(server.url, bootstrap, topics, server)
        try:
            yield gateway
        finally:
            gateway.http.close()


def record_key(record: dict[str, Any]) -> str:
    """The Kafka key a gateway record is routed by: a feedback's target, else its trajectory."""
    return str(record["target_id"] if "target_id" in record else record["trajectory_id"])


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[str, dict[str, Any]]]:
    """Every record on ``topic`` up to its current end, as (key, decoded record); a record of an
    envelope has its own key, and is checked to sit on the partition that key hashes to."""
    out = []
    for read in support_read_topic(bootstrap, topic, timeout):
        own = read.key.decode() if read.key else record_key(read.record)
        assert partition_of(own, read.partitions) == read.partition, f"{own!r} on {read.partition}"
        out.append((own, read.record))
    return out


def message_count(bootstrap: str, topic: str) -> int:
    """Messages on ``topic`` (envelopes count once)."""
    consumer = make_consumer(bootstrap, f"gw-test-{uuid.uuid4().hex[:8]}")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in partitions)
    finally:
        consumer.close()
