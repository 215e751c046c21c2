"""KafkaPublisher waits once per request: every delivery report counted, whichever thread and order
they come in (even before the request finished producing), failures chosen as before, envelopes
sent to their partition, records counted in flight, and the messages too large named."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from clawr1.gateway.publisher import KafkaPublisher, KafkaUnavailable, OutMessage, RecordTooLarge
from tests.support.waiting import wait_until_async


class Producer:
    """Reports each message at once (on the producing thread) or later from another thread."""

    def __init__(self, errors: dict[bytes, KafkaError], immediate: bool,
                 refuse: frozenset[bytes] = frozenset()) -> None:
        self.errors = errors
        self.immediate = immediate
        self.refuse = refuse  # too large at produce(), as librdkafka says past message.max.bytes
        self.later: list[tuple[Any, bytes]] = []
        self.partitions: list[int | None] = []

    def produce(self, _topic: str, value: bytes, _key: str | None, on_delivery: Any,
                partition: int | None = None) -> None:
        if value in self.refuse:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.partitions.append(partition)
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
    await wait_until_async(lambda: len(producer.partitions) == 100, 5.0, message="every message produced")
    if not immediate:
        assert not request.done() and publisher._in_flight == 100  # the request waits for the reports
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
        await wait_until_async(lambda: len(producer.later) == 4, 5.0, message="every message produced")
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
    await wait_until_async(lambda: publisher._in_flight == 0, 1.0, message="the late reports counted")


def envelope(value: bytes, partition: int, records: int) -> OutMessage:
    return OutMessage("t", None, value, partition, tuple({"n": n} for n in range(records)), "step")


@pytest.mark.parametrize("immediate", [True, False])
async def test_envelopes_go_to_their_partition_and_count_their_records_in_flight(immediate: bool) -> None:
    producer = Producer({}, immediate)
    publisher = publisher_with(producer)
    request = asyncio.create_task(publisher.publish([envelope(b"a", 1, 50), envelope(b"b", 0, 30)]))
    await wait_until_async(lambda: len(producer.partitions) == 2, 5.0, message="both envelopes produced")
    assert producer.partitions == [1, 0]
    if not immediate:
        assert publisher._in_flight == 80
        with pytest.raises(KafkaUnavailable, match="80 records"):
            await publisher.publish([envelope(b"c", 0, 921)])
        producer.report_from_a_thread()
    await asyncio.wait_for(request, 5.0)
    assert publisher._in_flight == 0


@pytest.mark.parametrize("refused_at_produce", [True, False])
async def test_too_large_names_the_messages_kafka_refused_and_what_else_failed(
        refused_at_produce: bool) -> None:
    big = envelope(b"big", 0, 10)
    errors = {} if refused_at_produce else {b"big": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)}
    producer = Producer(errors, True, frozenset({b"big"}) if refused_at_produce else frozenset())
    publisher = publisher_with(producer)
    with pytest.raises(RecordTooLarge) as refused:
        await publisher.publish([envelope(b"ok", 1, 2), big, envelope(b"ok2", 1, 2)])
    assert refused.value.messages == [big] and refused.value.others == []
    assert producer.partitions == ([1, 1] if refused_at_produce else [1, 0, 1])  # the others still went
    producer.errors = {b"big": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
                       b"late": KafkaError(KafkaError._MSG_TIMED_OUT)}
    with pytest.raises(RecordTooLarge) as both:
        await publisher.publish([big, envelope(b"late", 1, 1)])
    assert both.value.messages == [big] and isinstance(both.value.others[0], KafkaUnavailable)
    assert publisher._in_flight == 0
