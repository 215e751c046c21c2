"""A confluent-kafka producer stand-in for unit tests of the produce-error policy: it holds messages until a
poll acknowledges them, and can turn fatal, so the proxy's emitter and the gateway's publisher can be
driven through a broker failing without a broker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

Report = Callable[[KafkaError | None, Any], None]


class FakeProducer:
    """Holds produced messages until ``poll``/``flush`` acknowledge them (while ``healthy``); ``break_()``
    makes the next poll report a fatal error, after which it refuses every produce."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.error_cb: Callable[[KafkaError], None] = config["error_cb"]
        self.held: list[tuple[bytes, Report]] = []
        self.partitions: list[int] = []  # of every message produced
        self.max_bytes: int | None = None  # larger messages are reported too large
        self.reports: list[tuple[Report, KafkaError | None]] = []
        self.acked: list[bytes] = []
        self.healthy = True
        self.dead = False
        self.fatal_pending = False
        self.purged = False
        self.flushed = False
        self.lock = threading.Lock()

    def produce(self, topic: str, value: bytes | None = None, key: Any = None,
                on_delivery: Report | None = None, partition: int = -1) -> None:
        if self.dead:
            raise KafkaException(KafkaError(KafkaError._FATAL, "producer is fatal", fatal=True))
        assert on_delivery is not None and value is not None
        with self.lock:
            self.partitions.append(partition)
            if self.max_bytes is not None and len(value) > self.max_bytes:
                self.reports.append((on_delivery, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
                return
            self.held.append((value, on_delivery))

    def break_(self) -> None:
        self.fatal_pending = True

    def poll(self, _timeout: float = 0) -> int:
        if self.fatal_pending:
            self.fatal_pending, self.dead = False, True
            self.error_cb(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence lost", fatal=True))
        with self.lock:
            if self.healthy and not self.dead:
                self.reports += [(report, None) for _, report in self.held]
                self.acked += [value for value, _ in self.held]
                self.held = []
            reports, self.reports = self.reports, []
        for report, error in reports:
            report(error, None)
        return len(reports)

    def purge(self) -> None:
        self.purged = True
        with self.lock:
            self.reports += [(report, KafkaError(KafkaError._PURGE_QUEUE)) for _, report in self.held]
            self.held = []

    def flush(self, _timeout: float = 0) -> int:
        self.flushed = True
        self.poll()
        return 0

    def list_topics(self, **_kwargs: Any) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))


class Factory:
    """The `factory` a RebuildingProducer builds its producers with; `built` keeps every one, in order."""

    def __init__(self) -> None:
        self.built: list[FakeProducer] = []

    def __call__(self, _bootstrap: str, **config: Any) -> FakeProducer:
        producer = FakeProducer(config)
        self.built.append(producer)
        return producer
