"""Offsets Faust hands to no agent are noticed and processed before the event that revealed them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from clawr1.streams.app import StreamsApp
from clawr1.streams.config import StreamConfig
from clawr1.streams.gaps import GapGuard, GapTracker, SkippedEvent, SkippedMessage

TP = ("clawr1.raw.steps", 3)


def test_a_jump_within_a_generation_is_the_skipped_range() -> None:
    tracker = GapTracker()
    for offset in (10, 11, 12):
        assert not tracker.missing(TP, 1, offset)
        tracker.processed(TP, 1, offset)
    assert tracker.missing(TP, 1, 15) == range(13, 15)


def test_redeliveries_and_other_partitions_are_not_gaps() -> None:
    tracker = GapTracker()
    tracker.processed(TP, 1, 20)
    assert not tracker.missing(TP, 1, 5)  # a seek back: already processed, not skipped
    tracker.processed(TP, 1, 5)
    assert not tracker.missing(TP, 1, 21)  # the position stays after the highest processed
    assert not tracker.missing(("clawr1.raw.steps", 0), 1, 400)  # no baseline: nothing to compare


def test_a_new_generation_starts_from_the_later_of_own_progress_and_the_commit() -> None:
    tracker = GapTracker()
    tracker.processed(TP, 1, 33)
    assert tracker.needs_committed(TP, 2) and not tracker.needs_committed(TP, 1)
    # The chaos case: 34 was fetched in generation 1 and dropped, 35 arrives in generation 2.
    assert tracker.missing(TP, 2, 35, committed=34) == range(34, 35)
    # The partition was elsewhere meanwhile and that worker committed up to 50: nothing owed.
    assert not tracker.missing(TP, 2, 50, committed=50)
    # A fresh process knows only the commit.
    assert GapTracker().missing(TP, 7, 35, committed=30) == range(30, 35)


class _Reader:
    def __init__(self, records: dict[int, bytes], committed: int, failures: int = 0) -> None:
        self.records, self._committed, self.failures, self.reads = records, committed, failures, []

    def committed(self, topic: str, partition: int) -> int:
        return self._committed

    def read(self, topic: str, partition: int, start: int, stop: int) -> list[SkippedEvent]:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("broker away")
        self.reads.append((start, stop))
        return [SkippedEvent(SkippedMessage(topic, partition, o, b"k", self.records[o], 0.0))
                for o in range(start, stop) if o in self.records]


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int
    generation_id: int
    key: bytes = b"k"
    value: bytes = b""
    timestamp: float = 0.0


@dataclass
class _Event:
    message: _Message

    @property
    def key(self) -> bytes:
        return self.message.key

    @property
    def value(self) -> bytes:
        return self.message.value


def _event(offset: int, generation: int) -> _Event:
    return _Event(_Message(*TP, offset, generation, value=f"v{offset}".encode()))


class _Stream:
    """Faust's stream as the agent body uses it: processors run as events arrive, then batches."""

    def __init__(self, events: list[_Event], batch: int = 2) -> None:
        self._events = events
        self._batch = batch
        self._processors: list = []
        self.current_event: _Event | None = None

    def add_processor(self, processor) -> None:  # noqa: ANN001
        self._processors.append(processor)

    def _arrive(self, event: _Event) -> None:
        self.current_event = event
        for processor in self._processors:
            processor(event.value)

    async def take_events(self, max_: int, within: float):  # noqa: ANN201 - an async generator, as Faust's
        for start in range(0, len(self._events), self._batch):
            batch = self._events[start:start + self._batch]
            for event in batch:
                self._arrive(event)
            yield batch

    async def events(self):  # noqa: ANN201 - an async generator, as Faust's
        for event in self._events:
            self._arrive(event)
            yield event


@pytest.mark.parametrize("batched", [True, False])
def test_the_agent_body_handles_a_dropped_record_before_the_one_that_revealed_it(tmp_path: Path,
                                                                               batched: bool) -> None:
    app = StreamsApp(StreamConfig(bootstrap="127.0.0.1:1", data_dir=tmp_path))
    reader = _Reader({34: b"v34"}, committed=34, failures=1)
    app.gaps = GapGuard(lambda: reader)
    seen: list[bytes] = []

    async def handler(event) -> None:  # noqa: ANN001
        seen.append(event.value)

    body = app._agent_body("ingest_steps", handler, "normalize", batched)
    # 33 in generation 1; 34 dropped by Faust; 35 in generation 2 (after the rebalance).
    asyncio.run(body(_Stream([_event(33, 1), _event(35, 2), _event(36, 2)])))  # type: ignore[arg-type]
    assert seen == [b"v33", b"v34", b"v35", b"v36"]
    assert reader.reads == [(34, 35)]  # read once, after one failed try
    assert app.gaps.idle(TP[0], 0.0)  # every event that arrived was finished


def test_a_dropped_tail_is_owed_from_the_generation_s_own_progress_or_the_commit() -> None:
    tracker = GapTracker()
    tracker.processed(TP, 4, 20)
    assert tracker.owed(TP, 4, highwater=21) is None  # all seen
    assert tracker.owed(TP, 4, highwater=24) == 21  # 21-23 were handed to no agent
    assert tracker.owed(TP, 5, highwater=24, committed=23) == 23  # a new generation: the commit
    assert tracker.owed(TP, 5, highwater=24) is None  # no baseline: nothing to say
    assert tracker.owed(TP, 4, highwater=None) is None  # the fetcher knows no end yet


def test_idle_means_nothing_in_hand_and_nothing_finished_lately() -> None:
    guard = GapGuard(lambda: _Reader({}, committed=0))
    guard._started -= 10  # an agent that has seen nothing for 10 s
    assert guard.idle(TP[0], 2.0)
    guard.handling(_event(1, 1))
    assert not guard.idle(TP[0], 2.0)
    guard.processed(_event(1, 1))
    assert not guard.idle(TP[0], 2.0) and guard.idle(TP[0], 0.0)


def test_the_tail_check_asks_the_commit_once_per_generation() -> None:
    reader = _Reader({}, committed=7)
    guard = GapGuard(lambda: reader)
    assert asyncio.run(guard.dropped_tail(TP, 2, highwater=9)) == 7
    assert asyncio.run(guard.dropped_tail(TP, 2, highwater=None)) is None
