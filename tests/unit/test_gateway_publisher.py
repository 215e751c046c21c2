"""KafkaPublisher waits once per request: every delivery report counted, whichever thread and order
they come in (even before the request finished producing), failures chosen as before."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from clawr1.gateway.publisher import KafkaPublisher, KafkaUnavailable, OutMessage, RecordTooLarge


class Producer:
    """Reports each message at once (on the producing thread) or later from another thread."""

    def __init__(self, errors: dict[bytes, KafkaError], immediate: bool) -> None:
        self.errors = errors
        self.immediate = immediate
        self.later: list[tuple[Any, bytes]] = []

    def produce(self, _topic: str, value: bytes, _key: str, on_delivery: Any) -> None:
        if self.immediate:
            on_delivery(self.errors.get(value), None)
        else:
            self.later.append((on_delivery, value))

    def report_from_a_thread(self) -> None:
        reports, self.later = self.later, []

        def run() -> None:
            for on_delivery, value in reversed(reports):
                on_delivery(self.errors.get(value), None)

        threading.Thread(target=run).start()


class Producers:
    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.generation = 0
        self.fatal = None
        self.last_fatal = None


def publisher_with(producer: Producer) -> KafkaPublisher:
    publisher = KafkaPublisher("fake:9092", ["t"], partitions=1, max_in_flight=1000, delivery_timeout_s=5.0)
    publisher._producers = Producers(producer)  # type: ignore[assignment]
    publisher._topics_ready = True
    return publisher


def messages(*values: bytes) -> list[OutMessage]:
    return [OutMessage("t", "k", value) for value in values]


@pytest.mark.parametrize("immediate", [True, False])
async def test_a_request_returns_once_every_message_is_acknowledged(immediate: bool) -> None:
    producer = Producer({}, immediate)
    publisher = publisher_with(producer)
    request = asyncio.create_task(publisher.publish(messages(*[b"m%d" % i for i in range(100)])))
    await asyncio.sleep(0.05)
    assert request.done() == immediate
    if not immediate:
        assert publisher._in_flight == 100
        producer.report_from_a_thread()
    await asyncio.wait_for(request, 5.0)
    assert publisher._in_flight == 0


@pytest.mark.parametrize("immediate", [True, False])
async def test_a_record_too_large_wins_over_other_failures(immediate: bool) -> None:
    errors = {b"late": KafkaError(KafkaError._MSG_TIMED_OUT),
              b"big": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)}
    producer = Producer(errors, immediate)
    publisher = publisher_with(producer)
    request = asyncio.create_task(publisher.publish(messages(b"ok", b"late", b"big", b"ok2")))
    if not immediate:
        await asyncio.sleep(0.05)
        producer.report_from_a_thread()
    with pytest.raises(RecordTooLarge):
        await asyncio.wait_for(request, 5.0)
    assert publisher._in_flight == 0


async def test_a_timed_out_request_still_returns_its_in_flight_count() -> None:
    producer = Producer({}, immediate=False)
    publisher = publisher_with(producer)
    publisher.delivery_timeout_s = -4.9  # the wait gives up after 0.1 s
    with pytest.raises(KafkaUnavailable, match="in time"):
        await publisher.publish(messages(b"a", b"b"))
    assert publisher._in_flight == 2
    producer.report_from_a_thread()
    for _ in range(100):
        if publisher._in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert publisher._in_flight == 0
