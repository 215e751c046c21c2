"""The gateway's one Kafka producer, awaited per request: a request is answered 202 only after the
broker acknowledged every one of its messages (idempotent producer, acks=all).

A request's records travel as envelopes, one message per partition (``clawr1.core.envelopes``): the
producer is told each envelope's partition, hashed from its records' keys with the topic's partition
count as the broker reports it once the topics are ready (``partitions_of``).

Memory stays bounded: at most ``max_in_flight`` records wait for acknowledgement over all
requests; beyond that a request is refused at once (503) instead of queueing. A message the broker
does not acknowledge within ``delivery_timeout_s`` (librdkafka's message.timeout.ms) fails its
request with a 503, and the client retries. A background thread serves librdkafka's delivery
reports and hands them to the event loop.

Errors mean what ``clawr1.core.kafka_io.classify`` says: a message too large (for the broker or its
segment) is a ``RecordTooLarge`` naming the messages Kafka refused (the caller splits an envelope and
sends it again, and answers 413 only for a record too large on its own); everything else is a 503
with Retry-After, a message Kafka refuses for good included (an operator can fix a topic's ACLs; the
gateway keeps nothing, the client still holds the request). A fatal producer error follows kafka_io's
one policy (``RebuildingProducer``): the poll thread replaces the producer at once, the requests it
still held get a 503 naming the error, and new requests go to the new producer; no restart needed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from clawr1.core.backoff import Backoff
from clawr1.core.kafka_io import Fatal, RebuildingProducer, Undeliverable, classify, ensure_topics

log = logging.getLogger(__name__)

_HEALTH_CACHE_S = 1.0
_METADATA_TIMEOUT_S = 2.0
# Between the tries to make the topics: from 0.1 s doubling, at most 1 s (full jitter).
_TOPIC_BACKOFF = Backoff(0.1, 1.0)


class KafkaUnavailable(Exception):
    """Kafka cannot take the messages now: retry later (HTTP 503)."""


class RecordTooLarge(Exception):
    """The broker refuses ``messages`` for their size: sending them again as they are cannot help.
    ``others``: what else failed in the same request (each message not named here was acknowledged
    unless ``others`` has something)."""

    def __init__(self, reason: str, messages: Sequence[OutMessage] = (),
                 others: Sequence[Exception] = ()) -> None:
        super().__init__(reason)
        self.messages = list(messages)
        self.others = list(others)


@dataclass(frozen=True)
class OutMessage:
    """A lone record (its ``key`` picks the partition) or an envelope (``key`` None, ``partition``
    chosen) with the ``records`` it carries in their packed form, of schema ``schema``: kept so that
    an envelope Kafka finds too large can be split and sent again."""

    topic: str
    key: str | None
    value: bytes
    partition: int | None = None
    records: tuple[dict[str, Any], ...] = ()
    schema: str = ""

    @property
    def weight(self) -> int:
        """Records it carries: what the in-flight bound counts."""
        return len(self.records) or 1


class KafkaPublisher:
    def __init__(self, bootstrap: str, topics: Sequence[str], *, partitions: int, max_in_flight: int,
                 delivery_timeout_s: float, producer_overrides: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.partitions = partitions
        self.max_in_flight = max_in_flight
        self.delivery_timeout_s = delivery_timeout_s
        self._overrides = {
            "message.timeout.ms": int(delivery_timeout_s * 1000),
            "queue.buffering.max.messages": max(100_000, max_in_flight),
            "logger": logging.getLogger("gateway.kafka"),
            **(producer_overrides or {}),
        }
        self._producers: RebuildingProducer | None = None
        self._in_flight = 0
        self._topics_ready = False
        self._partitions: dict[str, int] = {}
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._topics_task: asyncio.Task[None] | None = None
        self._health_lock = asyncio.Lock()
        self._health: tuple[float, bool] = (0.0, False)

    async def start(self) -> None:
        self._producers = RebuildingProducer(self.bootstrap, on_error=self._on_error, **self._overrides)
        self._poller = threading.Thread(target=self._poll_loop, name="gateway-kafka-poll", daemon=True)
        self._poller.start()
        self._topics_task = asyncio.create_task(self._prepare_topics())

    async def close(self, flush_timeout_s: float = 10.0) -> None:
        if self._topics_task is not None:
            self._topics_task.cancel()
        self._stop.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join)
        if self._producers is not None:
            left = await asyncio.to_thread(self._producers.producer.flush, flush_timeout_s)
            if left:
                log.warning("%d message(s) were still unacknowledged at shutdown", left)

    def partitions_of(self, topic: str) -> int:
        """The topic's partition count as the broker has it; KafkaUnavailable until the topics are ready."""
        if not self._topics_ready:
            raise KafkaUnavailable("Kafka is not ready yet (broker unreachable or topics not created)")
        return self._partitions[topic]

    async def publish(self, messages: Sequence[OutMessage]) -> None:
        """Returns once the broker acknowledged every message; raises otherwise."""
        producers = self._producers
        if producers is None or not self._topics_ready:
            raise KafkaUnavailable("Kafka is not ready yet (broker unreachable or topics not created)")
        fatal = producers.fatal  # read once: the poll thread clears it when it replaces the producer
        if fatal is not None:
            raise KafkaUnavailable(f"the Kafka producer failed ({fatal.str()}) and is being replaced; "
                                   "retry later")
        producer, generation = producers.producer, producers.generation
        weight = sum(message.weight for message in messages)
        if self._in_flight + weight > self.max_in_flight:
            raise KafkaUnavailable(f"{self._in_flight} records are waiting for Kafka already (limit "
                                   f"{self.max_in_flight}); retry later")
        request = _Request(self, asyncio.get_running_loop(), generation)
        refused: list[tuple[int, Exception]] = []  # refused at produce(): not in flight
        produced = carried = 0
        for index, message in enumerate(messages):
            try:
                producer.produce(message.topic, message.value, message.key,
                                 on_delivery=partial(request.report, index),
                                 **({} if message.partition is None else {"partition": message.partition}))
            except BufferError:
                refused.append((index, KafkaUnavailable("the Kafka producer queue is full; retry later")))
                break
            except KafkaException as exc:
                refused.append((index, self._failure(exc.args[0], generation)))
                if isinstance(refused[-1][1], RecordTooLarge):
                    continue  # the others may still go; the caller splits this one
                break
            produced += 1
            carried += message.weight
        failures = refused  # a refusal that stopped the loop stands for the messages never produced
        if produced:
            self._in_flight += carried
            failures = [*await self._acknowledged(request, produced, carried), *refused]
        _raise_for(messages, failures)

    async def _acknowledged(self, request: _Request, produced: int,
                            carried: int) -> list[tuple[int, Exception]]:
        """Waits once for every delivery report of the request (not a future per message)."""
        done = request.seal(produced, carried)
        # librdkafka fails each message after message.timeout.ms; the margin only guards against a stall.
        try:
            return await asyncio.wait_for(done, timeout=self.delivery_timeout_s + 5.0)
        except TimeoutError as exc:
            raise KafkaUnavailable("Kafka did not acknowledge in time; retry later") from exc

    async def ready(self) -> bool:
        """Topics exist and the broker answers metadata requests (cached for a second)."""
        if self._producers is None or not self._topics_ready or self._producers.fatal is not None:
            return False
        async with self._health_lock:
            checked_at, ok = self._health
            if time.monotonic() - checked_at >= _HEALTH_CACHE_S:
                ok = await asyncio.to_thread(self._metadata_ok)
                self._health = (time.monotonic(), ok)
            return ok

    def _metadata_ok(self) -> bool:
        assert self._producers is not None
        try:
            metadata = self._producers.producer.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException:
            return False
        return bool(metadata.brokers) and all(
            name in metadata.topics and metadata.topics[name].error is None for name in self.topics)

    async def _prepare_topics(self) -> None:
        """Create the topics with the stack's partition count before the first produce; otherwise the
        broker would auto-create them with its default count and break co-partitioning. Their counts as
        the broker has them (a topic made earlier may differ) are what envelopes are hashed into."""
        waits = _TOPIC_BACKOFF.delays()
        while True:
            try:
                counts = await asyncio.to_thread(ensure_topics, self.bootstrap, self.topics,
                                                 self.partitions, 3.0)
            except (KafkaException, RuntimeError) as exc:
                log.warning("Kafka topics not ready, retrying: %s", exc)
                await asyncio.sleep(next(waits))
                continue
            self._partitions = counts
            self._topics_ready = True
            return

    def _poll_loop(self) -> None:
        producers = self._producers
        assert producers is not None
        while not self._stop.is_set():
            producers.producer.poll(0.05)
            # Serves the failed producer's delivery reports (503s) before polling the new one.
            producers.rebuild_if_fatal()

    def _on_error(self, error: KafkaError) -> None:
        if not error.fatal():  # a fatal one is logged and handled by RebuildingProducer
            log.warning("Kafka: %s", error.str())

    def _failure(self, error: KafkaError, generation: int) -> Exception:
        """The exception a request gets for ``error`` on a message sent by producer ``generation``."""
        producers = self._producers
        assert producers is not None
        outcome = classify(error)
        if isinstance(outcome, Undeliverable) and outcome.too_large:
            return RecordTooLarge(f"Kafka refused a record as too large: {outcome.reason}")
        if generation != producers.generation and producers.last_fatal is not None:
            # The message went to a producer since replaced after a fatal error (it was purged).
            return KafkaUnavailable(f"the Kafka producer failed ({producers.last_fatal.str()}) and was "
                                    "replaced; retry")
        if isinstance(outcome, Fatal):
            return KafkaUnavailable(f"the Kafka producer failed ({outcome.reason}) and is being "
                                    "replaced; retry")
        return KafkaUnavailable(f"Kafka did not take the record ({outcome.reason}); retry later")


def _raise_for(messages: Sequence[OutMessage], failures: list[tuple[int, Exception]]) -> None:
    """A request's outcome: a record too large wins (retrying the request cannot help, splitting can),
    then the first other failure; nothing raised when every message was acknowledged."""
    too_large = [(index, f) for index, f in failures if isinstance(f, RecordTooLarge)]
    others = [f for _, f in failures if not isinstance(f, RecordTooLarge)]
    if too_large:
        raise RecordTooLarge(str(too_large[0][1]), [messages[index] for index, _ in too_large], others)
    if others:
        raise others[0]


class _Request:
    """The delivery reports of one request's messages, counted on the poll thread; the event loop is
    woken once, when the last of them arrived (one ``call_soon_threadsafe`` per request, not per
    message)."""

    __slots__ = ("_publisher", "_loop", "_generation", "_lock", "_expected", "_carried", "_reported",
                 "_failures", "_done")

    def __init__(self, publisher: KafkaPublisher, loop: asyncio.AbstractEventLoop, generation: int) -> None:
        self._publisher = publisher
        self._loop = loop
        self._generation = generation
        self._lock = threading.Lock()
        self._expected: int | None = None
        self._carried = 0
        self._reported = 0
        self._failures: list[tuple[int, Exception]] = []
        self._done: asyncio.Future[list[tuple[int, Exception]]] = loop.create_future()

    def report(self, index: int, error: KafkaError | None, _message: Message) -> None:
        """librdkafka's delivery report of message ``index`` (poll thread, or whichever thread flushes)."""
        failure = None if error is None else self._publisher._failure(error, self._generation)
        with self._lock:
            self._reported += 1
            if failure is not None:
                self._failures.append((index, failure))
            last = self._reported == self._expected
        if last:
            self._wake()

    def seal(self, expected: int, carried: int) -> asyncio.Future[list[tuple[int, Exception]]]:
        """No more messages: the future answers every failure once ``expected`` reports arrived; then
        the ``carried`` records leave the in-flight count."""
        with self._lock:
            self._expected = expected
            self._carried = carried
            last = self._reported == expected
        if last:
            self._wake()
        return self._done

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._settle)
        except RuntimeError:
            log.warning("delivery reports after the event loop closed: %s", self._failures or "acknowledged")

    def _settle(self) -> None:
        self._publisher._in_flight -= self._carried
        if not self._done.done():  # done: the request stopped waiting (timed out or cancelled)
            self._done.set_result(list(self._failures))
