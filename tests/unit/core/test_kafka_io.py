"""kafka_io's produce-error classification and its one policy for fatal producer errors, with fake
producers (no broker): the proxy's emitter and the gateway's publisher both replace a failed producer
and hand back what it still held."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import clawr1.gateway.publisher as publisher_module
import clawr1.proxy.emitter as emitter_module
from clawr1.core import kafka_io
from clawr1.core.kafka_io import Fatal, RebuildingProducer, Retriable, Undeliverable, classify, error_code
from clawr1.gateway.publisher import KafkaPublisher, KafkaUnavailable, OutMessage, RecordTooLarge
from clawr1.proxy.emitter import Emitter
from tests.support.fake_producer import Factory, FakeProducer
from tests.support.waiting import wait_until, wait_until_async

# --- classify -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._PURGE_QUEUE,
                                  KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_transient_errors_are_retriable(code: int) -> None:
    assert isinstance(classify(KafkaError(code)), Retriable)


@pytest.mark.parametrize(("code", "too_large"), [
    (KafkaError.MSG_SIZE_TOO_LARGE, True), (KafkaError.RECORD_LIST_TOO_LARGE, True),
    (KafkaError.INVALID_RECORD, False), (KafkaError.TOPIC_AUTHORIZATION_FAILED, False)])
def test_refusals_for_good_are_undeliverable(code: int, too_large: bool) -> None:
    outcome = classify(KafkaError(code))
    assert isinstance(outcome, Undeliverable)
    assert outcome.too_large is too_large and outcome.code == code
    assert KafkaError(code).name() in outcome.reason


def test_fatal_flag_or_fatal_code_is_fatal() -> None:
    outcome = classify(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence lost", fatal=True))
    assert isinstance(outcome, Fatal) and "sequence lost" in outcome.reason
    # A delivery report of a message that failed because its producer is fatal.
    assert isinstance(classify(KafkaError(KafkaError._FATAL)), Fatal)
    # Fatal wins over a code that alone would mean "undeliverable".
    assert isinstance(classify(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, fatal=True)), Fatal)


def test_the_retriable_flag_wins_over_the_code() -> None:
    assert isinstance(classify(KafkaError(KafkaError.INVALID_RECORD, retriable=True)), Retriable)


def test_error_code_reads_the_kafka_error_not_the_text() -> None:
    exists = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "something else entirely"))
    assert error_code(exists) == KafkaError.TOPIC_ALREADY_EXISTS
    assert error_code(KafkaException(KafkaError(KafkaError._TIMED_OUT, "TOPIC_ALREADY_EXISTS"))) \
        == KafkaError._TIMED_OUT
    assert error_code(RuntimeError("TOPIC_ALREADY_EXISTS")) is None
    assert error_code(KafkaException()) is None


# --- the policy itself --------------------------------------------------------------------------


def test_rebuild_replaces_a_fatal_producer_and_fails_back_what_it_held() -> None:
    factory = Factory()
    seen: list[KafkaError] = []
    producers = RebuildingProducer("fake:9092", on_error=seen.append, factory=factory)
    old = factory.built[0]
    assert producers.rebuild_if_fatal() is None and producers.generation == 0

    reports: list[KafkaError | None] = []
    old.healthy = False
    old.produce("t", b"owed", on_delivery=lambda err, _msg: reports.append(err))
    old.break_()
    old.poll()
    assert producers.fatal is not None and seen and seen[0].fatal()

    error = producers.rebuild_if_fatal()
    assert error is not None and error.str() == "sequence lost"
    assert producers.producer is factory.built[1] and producers.generation == 1
    assert producers.fatal is None and producers.last_fatal is error
    assert old.purged and old.flushed
    assert [r.code() for r in reports if r is not None] == [KafkaError._PURGE_QUEUE]
    # The replaced producer's late fatal reports do not condemn the new one.
    old.error_cb(KafkaError(KafkaError._FATAL, fatal=True))
    assert producers.fatal is None and producers.rebuild_if_fatal() is None
    # Non-fatal errors only reach the owner's callback.
    producers.producer.error_cb(KafkaError(KafkaError._TRANSPORT))
    assert producers.fatal is None and len(factory.built) == 2


def test_a_failed_rebuild_leaves_the_fatal_error_to_retry() -> None:
    factory = Factory()
    producers = RebuildingProducer("fake:9092", factory=factory)
    factory.built[0].break_()
    factory.built[0].poll()

    def broken(*_args: Any, **_kwargs: Any) -> FakeProducer:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG))

    producers._factory = broken
    with pytest.raises(KafkaException):
        producers.rebuild_if_fatal()
    assert producers.fatal is not None and producers.generation == 0
    producers._factory = factory
    assert producers.rebuild_if_fatal() is not None and producers.generation == 1


# --- ensure_topics: a forming cluster's refusals asked again, a refusal of the topic itself final ----


class RefusingAdmin:
    """An admin client whose broker answers each topic's creation from a script of error codes (then
    creates it), and serves every created topic with one partition led by broker 1."""

    def __init__(self, answers: dict[str, list[int]]) -> None:
        self.answers = answers
        self.created: set[str] = set()
        self.asked: list[list[str]] = []

    def list_topics(self, timeout: float) -> Any:
        topic = SimpleNamespace(error=None, partitions={0: SimpleNamespace(error=None, leader=1)})
        return SimpleNamespace(topics=dict.fromkeys(self.created, topic))

    def create_topics(self, topics: list[Any], operation_timeout: float) -> dict[str, Future[None]]:
        self.asked.append([t.topic for t in topics])
        futures: dict[str, Future[None]] = {}
        for t in topics:
            script = self.answers.get(t.topic, [])
            code = script.pop(0) if script else None
            future: Future[None] = Future()
            if code in (None, KafkaError.TOPIC_ALREADY_EXISTS):  # another client may have created it
                self.created.add(t.topic)
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            futures[t.topic] = future
        return futures


def test_ensure_topics_asks_again_while_the_cluster_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = RefusingAdmin({"a": [KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_CONTROLLER],
                           "b": [KafkaError.TOPIC_ALREADY_EXISTS]})
    monkeypatch.setattr(kafka_io, "make_admin", lambda _bootstrap: admin)
    assert kafka_io.ensure_topics("fake:9092", ["a", "b", "c"], timeout=10) == {"a": 1, "b": 1, "c": 1}
    assert admin.asked == [["a", "b", "c"], ["a"], ["a"]]  # only the refused one is asked again


def test_ensure_topics_gives_up_on_a_refusal_of_the_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = RefusingAdmin({"a": [KafkaError.INVALID_REPLICATION_FACTOR]})
    monkeypatch.setattr(kafka_io, "make_admin", lambda _bootstrap: admin)
    with pytest.raises(RuntimeError, match="could not create topic a") as raised:
        kafka_io.ensure_topics("fake:9092", ["a"], timeout=10)
    assert error_code(raised.value.__cause__) == KafkaError.INVALID_REPLICATION_FACTOR
    assert admin.asked == [["a"]]


def test_ensure_topics_gives_up_on_a_cluster_that_never_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = RefusingAdmin({"a": [KafkaError.UNKNOWN_TOPIC_OR_PART] * 100})
    monkeypatch.setattr(kafka_io, "make_admin", lambda _bootstrap: admin)
    with pytest.raises(RuntimeError, match="could not create topic a.*UNKNOWN_TOPIC_OR_PART"):
        kafka_io.ensure_topics("fake:9092", ["a"], timeout=1.2)
    assert 2 <= len(admin.asked) <= 5


# --- the proxy: what the failed producer held stays spooled and goes out on the new one ---------


def test_emitter_replaces_a_fatal_producer_and_delivers_everything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    factory = Factory()
    monkeypatch.setattr(kafka_io, "make_producer", factory)
    monkeypatch.setattr(emitter_module, "ensure_topics", lambda *_a, **_k: {"t": 4})
    emitter: Emitter[str] = Emitter(bootstrap="fake:9092", topic="t", spool_dir=tmp_path / "spool",
                                    prepare=lambda item: (item, item.encode()))
    emitter.start()
    try:
        wait_until(lambda: bool(factory.built), 10)
        first = factory.built[0]
        first.healthy = False  # the broker holds these unacknowledged
        for n in range(5):
            emitter.submit(f"r{n}")
        wait_until(lambda: len(first.held) == 5, 10)
        first.break_()
        wait_until(lambda: len(factory.built) == 2, 10)
        second = factory.built[1]
        wait_until(lambda: emitter.stats.delivered == 5, 10)
        assert first.purged and first.acked == []
        assert sorted(second.acked) == [f"r{n}".encode() for n in range(5)]
        emitter.submit("after")
        wait_until(lambda: emitter.stats.delivered == 6, 10)
        assert emitter.stats.rejected == 0
    finally:
        emitter.close(2.0)
    assert emitter.pending == 0


def test_emitter_sets_aside_only_undeliverable_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    factory = Factory()
    monkeypatch.setattr(kafka_io, "make_producer", factory)
    monkeypatch.setattr(emitter_module, "ensure_topics", lambda *_a, **_k: {"t": 4})
    emitter: Emitter[str] = Emitter(bootstrap="fake:9092", topic="t", spool_dir=tmp_path / "spool",
                                    prepare=lambda item: (item, item.encode()))
    emitter.start()
    try:
        wait_until(lambda: bool(factory.built), 10)
        producer = factory.built[0]
        producer.healthy = False
        emitter.submit("big")
        emitter.submit("later")
        wait_until(lambda: len(producer.held) == 2, 10)
        with producer.lock:
            (_, big), (_, later) = producer.held
            producer.held = []
            producer.reports = [(big, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
                                (later, KafkaError(KafkaError._MSG_TIMED_OUT))]
        producer.healthy = True
        wait_until(lambda: emitter.stats.delivered == 1 and emitter.stats.rejected == 1, 10)
        assert producer.acked == [b"later"]
        assert (tmp_path / "spool" / "rejected.log").stat().st_size > 0
    finally:
        emitter.close(2.0)


# --- the gateway: in-flight requests get a 503 naming the error; new requests use the new producer


async def test_publisher_replaces_a_fatal_producer_without_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    factory = Factory()
    monkeypatch.setattr(kafka_io, "make_producer", factory)
    monkeypatch.setattr(publisher_module, "ensure_topics", lambda *_a, **_k: {"t": 1})
    publisher = KafkaPublisher("fake:9092", ["t"], partitions=1, max_in_flight=100, delivery_timeout_s=5.0)
    await publisher.start()
    try:
        await wait_until_async(lambda: publisher._topics_ready, 10)
        first = factory.built[0]
        first.healthy = False
        pending = asyncio.create_task(publisher.publish([OutMessage("t", "k", b"owed")]))
        await wait_until_async(lambda: len(first.held) == 1, 10)
        first.break_()
        with pytest.raises(KafkaUnavailable, match="sequence lost.*replaced"):
            await asyncio.wait_for(pending, 5.0)
        assert len(factory.built) == 2 and first.purged
        await publisher.publish([OutMessage("t", "k", b"next")])
        assert factory.built[1].acked == [b"next"]
        assert publisher._in_flight == 0
    finally:
        await publisher.close(0.1)


async def test_publisher_maps_outcomes_to_413_and_503(monkeypatch: pytest.MonkeyPatch) -> None:
    factory = Factory()
    monkeypatch.setattr(kafka_io, "make_producer", factory)
    monkeypatch.setattr(publisher_module, "ensure_topics", lambda *_a, **_k: {"t": 1})
    publisher = KafkaPublisher("fake:9092", ["t"], partitions=1, max_in_flight=100, delivery_timeout_s=5.0)
    await publisher.start()
    try:
        assert isinstance(publisher._failure(KafkaError(KafkaError.RECORD_LIST_TOO_LARGE), 0), RecordTooLarge)
        refused = publisher._failure(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), 0)
        assert isinstance(refused, KafkaUnavailable) and "TOPIC_AUTHORIZATION_FAILED" in str(refused)
        assert isinstance(publisher._failure(KafkaError(KafkaError._MSG_TIMED_OUT), 0), KafkaUnavailable)
    finally:
        await publisher.close(0.1)
