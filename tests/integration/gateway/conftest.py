"""A live gateway (hypercorn on a free loopback port, in a thread) and a reader of its topics."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from fastapi import FastAPI

from bench.common import free_port
from clawr1.core.kafka_io import make_consumer
from clawr1.core.routing import partition_of
from clawr1.core.settings import Settings
from clawr1.gateway.app import create_app
from clawr1.gateway.config import GatewayTopics
from clawr1.gateway.server import serve
from clawr1.schemas.codec import codec_for

TEST_PARTITIONS = 2


def unique_topics() -> GatewayTopics:
    suffix = uuid.uuid4().hex[:10]
    return GatewayTopics(f"gw.steps.{suffix}", f"gw.feedback.{suffix}", f"gw.events.{suffix}")


class ServerThread:
    """Runs ``serve`` on its own event loop, as the stack's API process would."""

    def __init__(self, app: FastAPI, port: int, host: str = "127.0.0.1") -> None:
        self.app, self.host, self.port = app, host, port
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gateway-{port}", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._shutdown = asyncio.Event()
            self._ready.set()
            await serve(self.app, self.host, self.port, self._shutdown)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test by stop()/wait_listening()
            self.error = exc
            self._ready.set()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(10)
        return self

    def wait_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError(f"gateway failed to start: {self.error!r}") from self.error
            try:
                httpx.get(f"http://{self.host}:{self.port}/openapi.json", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"gateway not listening on {self.port} after {timeout}s")

    def stop(self) -> None:
        if self._loop is not None and self._shutdown is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._shutdown.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "gateway thread did not stop"


@dataclass
class LiveGateway:
    url: str
    bootstrap: str
    topics: GatewayTopics
    server: ServerThread
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def read(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        return read_topic(self.bootstrap, getattr(self.topics, kind))


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    reply = None
    while time.monotonic() < deadline:
        reply = httpx.get(f"{url}/healthz", timeout=5.0)
        if reply.status_code == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"gateway not healthy after {timeout}s: {reply.text if reply else 'no answer'}")


@contextmanager
def running_gateway(bootstrap: str, *, healthy: bool = True, **create: Any) -> Iterator[LiveGateway]:
    """``create`` takes ``settings`` overrides (as ``settings=``) and create_app's keyword arguments."""
    settings: Settings = create.pop("settings", None) or Settings()
    settings = settings.with_overrides(kafka_bootstrap=bootstrap, topic_partitions=TEST_PARTITIONS)
    topics = create.pop("topics", None) or unique_topics()
    port = free_port()
    server = ServerThread(create_app(settings, topics=topics, **create), port).start()
    try:
        server.wait_listening()
        url = f"http://127.0.0.1:{port}"
        if healthy:
            wait_healthy(url)
        gateway = LiveGateway(url, bootstrap, topics, server)
        try:
            yield gateway
        finally:
            gateway.http.close()
    finally:
        server.stop()


def record_key(record: dict[str, Any]) -> str:
    """The Kafka key a gateway record is routed by: a feedback's target, else its trajectory."""
    return str(record["target_id"] if "target_id" in record else record["trajectory_id"])


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[str, dict[str, Any]]]:
    """Every record on ``topic`` up to its current end, as (key, decoded record); a record of an
    envelope has its own key, and is checked to sit on the partition that key hashes to."""
    codec = codec_for("")
    consumer = make_consumer(bootstrap, f"gw-test-{uuid.uuid4().hex[:8]}")
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}
        pending = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        out: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to their end")
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise RuntimeError(f"{topic}: {message.error()}")
            partition, offset = message.partition(), message.offset()
            if offset < ends[partition]:
                key = message.key()
                _, records = codec.decode_all(message.value())
                for record in records:
                    own = key.decode() if key else record_key(record)
                    assert partition_of(own, len(partitions)) == partition, f"{own!r} on {partition}"
                    out.append((own, record))
            if offset >= ends[partition] - 1:
                pending.discard(partition)
        return out
    finally:
        consumer.close()


def message_count(bootstrap: str, topic: str) -> int:
    """Messages on ``topic`` (envelopes count once)."""
    consumer = make_consumer(bootstrap, f"gw-test-{uuid.uuid4().hex[:8]}")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in partitions)
    finally:
        consumer.close()


@pytest.fixture(scope="session")
def gateway(kafka_bootstrap: str) -> Iterator[LiveGateway]:
    """One gateway without API keys for the tests that need no special settings."""
    settings = Settings(max_request_bytes=64 * 1024, max_batch_steps=20)
    with running_gateway(kafka_bootstrap, settings=settings) as live:
        yield live
