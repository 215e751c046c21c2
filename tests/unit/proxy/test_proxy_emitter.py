"""The emitter's envelopes, with a fake producer (no broker): records bound for one partition share a
message within the window, each leaves the spool only once the message that carried it is
acknowledged, and a message Kafka finds too large goes again in halves."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import clawr1.proxy.emitter as emitter_module
from clawr1.core import kafka_io
from clawr1.core.routing import partition_of
from clawr1.core.thin_batch import ThinWait
from clawr1.proxy.emitter import Emitter
from tests.support.fake_producer import Factory, FakeProducer
from tests.support.waiting import holds_for, wait_until

PARTITIONS = 4


@contextmanager
def running_emitter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    **options: object) -> Iterator[tuple[Emitter[str], FakeProducer]]:
    """An emitter whose items ``key:rest`` are keyed ``key`` and combined as ``[a|b|...]``, started, with
    its fake producer; closed (drained for 2 s) at the end."""
    factory = Factory()
    monkeypatch.setattr(kafka_io, "make_producer", factory)
    monkeypatch.setattr(emitter_module, "ensure_topics", lambda *_a, **_k: {"t": PARTITIONS})
    emitter: Emitter[str] = Emitter(
        bootstrap="fake:9092", topic="t", spool_dir=tmp_path / "spool", partitions=1,
        prepare=lambda item: (item.split(":")[0], item.encode()),
        combine=lambda values: b"[" + b"|".join(values) + b"]", **options)  # type: ignore[arg-type]
    emitter.start()
    try:
        wait_until(lambda: bool(factory.built), 10)
        yield emitter, factory.built[0]
    finally:
        emitter.close(2.0)


def calls_in(value: bytes) -> list[bytes]:
    return value.strip(b"[]").split(b"|")


def test_calls_of_one_partition_share_a_message_within_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [f"conv-{n}" for n in range(6)]
    items = [f"{key}:{n}" for n in range(2) for key in keys]  # 12 calls, each conversation twice
    with running_emitter(tmp_path, monkeypatch, batch_s=0.3, batch_records=4) as (emitter, producer):
        for item in items:
            emitter.submit(item)
        wait_until(lambda: emitter.stats.delivered == len(items) and emitter.pending == 0, 10)
    by_partition: dict[int, list[str]] = {}
    for key in keys:
        by_partition.setdefault(partition_of(key, PARTITIONS), []).append(key)
    # The broker's partition count is what keys hash into (the emitter was told 1).
    assert set(producer.partitions) == set(by_partition)
    sent = list(zip(producer.partitions, producer.acked, strict=True))
    assert sorted(call for _, value in sent for call in calls_in(value)) == sorted(i.encode() for i in items)
    for partition, value in sent:
        assert len(calls_in(value)) <= 4
        assert all(partition_of(c.split(b":")[0].decode(), PARTITIONS) == partition for c in calls_in(value))
    assert len(sent) < len(items)
    for key in keys:  # a conversation's calls in their order
        mine = [c for _, value in sent for c in calls_in(value) if c.startswith(f"{key}:".encode())]
        assert mine == [f"{key}:0".encode(), f"{key}:1".encode()]


def test_thin_envelopes_wait_until_the_thin_interval_after_the_last_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = {"batch_s": 0.0, "batch_records": 64, "thin": ThinWait(1.5, fill=3)}
    with running_emitter(tmp_path, monkeypatch, **options) as (emitter, producer):
        emitter.submit("k:0")  # nothing sent before: goes at once
        wait_until(lambda: producer.acked == [b"k:0"], 10)
        emitter.submit("k:1")
        emitter.submit("k:2")
        holds_for(lambda: len(producer.acked) == 1, 0.5, message="a thin envelope left at once")
        wait_until(lambda: len(producer.acked) == 2, 10)
        assert calls_in(producer.acked[1]) == [b"k:1", b"k:2"]
        for n in range(3, 6):  # three calls fill an envelope: it goes on the usual (no) wait
            emitter.submit(f"k:{n}")
        wait_until(lambda: len(producer.acked) == 3, 1.0)


def test_an_envelope_too_large_goes_again_in_halves_and_a_lone_call_too_large_is_set_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [f"k:{n:02d}-{'x' * 10}" for n in range(8)]  # 17 bytes each: two fit in 40, eight do not
    with running_emitter(tmp_path, monkeypatch, batch_s=0.3, batch_records=64) as (emitter, producer):
        producer.max_bytes = 40
        for call in calls:
            emitter.submit(call)
        wait_until(lambda: emitter.stats.delivered == 8, 10)
        assert all(len(value) <= 40 for value in producer.acked)
        assert sorted(c for value in producer.acked for c in calls_in(value)) == [c.encode() for c in calls]
        emitter.submit("k:" + "y" * 60)
        wait_until(lambda: emitter.stats.rejected == 1, 10)
        assert b"y" * 60 in (tmp_path / "spool" / "rejected.log").read_bytes()
    assert emitter.pending == 0 and emitter.stats.delivered == 8


def test_records_stay_spooled_until_their_envelope_is_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_emitter(tmp_path, monkeypatch, batch_s=0.0, batch_records=64) as (emitter, producer):
        producer.healthy = False  # the broker holds the envelope unacknowledged
        for n in range(5):
            emitter.submit(f"k:{n}")
        wait_until(lambda: sum(len(calls_in(value)) for value, _ in producer.held) == 5, 10)
        wait_until(lambda: emitter.pending == 5, 10)
        producer.healthy = True
        wait_until(lambda: emitter.stats.delivered == 5, 10)
    assert emitter.pending == 0 and not list((tmp_path / "spool").glob("*.seg"))


def test_while_paused_captures_are_spooled_not_sent_and_go_once_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backpressure: while the pipeline is behind, calls keep being captured into the spool and nothing
    is handed to Kafka; once it caught up they all go, none lost."""
    paused = [True]
    with running_emitter(tmp_path, monkeypatch, paused=lambda: paused[0]) as (emitter, producer):
        for n in range(5):
            emitter.submit(f"k{n}:{n}")
        wait_until(lambda: emitter.stats.spooled == 5 and emitter.pending == 5, 10)
        assert producer.acked == [] and emitter.stats.delivered == 0
        paused[0] = False
        wait_until(lambda: emitter.stats.delivered == 5 and emitter.pending == 0, 10)
    assert sorted(producer.acked) == sorted(f"k{n}:{n}".encode() for n in range(5))


def test_the_thread_sleeps_between_passes_instead_of_spinning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a record waits for its window and then for Kafka's confirmation the thread looks every 50 ms
    or so, and every 0.5 s with nothing pending: an idle proxy's emitter costs next to nothing. (Counted
    over a one-second window: a rate needs one.)"""
    with running_emitter(tmp_path, monkeypatch, batch_s=0.3, batch_records=64) as (emitter, producer):
        producer.healthy = False  # the envelope stays unacknowledged
        passes: list[float] = []
        poll = producer.poll
        monkeypatch.setattr(producer, "poll", lambda timeout=0: passes.append(timeout) or poll(timeout))
        emitter.submit("k:1")
        wait_until(lambda: len(producer.held) == 1, 10)
        passes.clear()
        holds_for(lambda: len(passes) <= 25, 1.0, message=lambda: f"{len(passes)} passes within a second")
        producer.healthy = True
        wait_until(lambda: emitter.stats.delivered == 1 and emitter.pending == 0, 10)
        passes.clear()
        holds_for(lambda: len(passes) <= 3, 1.0, message=lambda: f"{len(passes)} idle passes within a second")
