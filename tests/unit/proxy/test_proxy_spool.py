"""The spool keeps every record until Kafka confirms it, across restarts and torn writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawr1.proxy.spool import SUFFIX, Spool, SpoolBusyError


def _records(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"value-{i}".encode() * 3) for i in range(start, start + n)]


def test_records_leave_the_spool_only_when_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_records=3)
    spool.open()
    spool.append(_records(5))
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 2
    taken = list(spool.take_unsent(10))
    assert [(r.key, r.value) for r in taken] == _records(5)
    assert spool.pending == 5 and list(spool.take_unsent(10)) == []
    for record in taken[:3]:
        spool.ack(record.seq)
    assert spool.trim() == 1 and len(list(tmp_path.glob(f"*{SUFFIX}"))) == 1
    spool.retry(taken[3].seq)
    assert [r.seq for r in spool.take_unsent(10)] == [taken[3].seq]
    spool.ack(taken[3].seq)
    spool.ack(taken[4].seq)
    spool.trim()
    assert spool.pending == 0 and list(tmp_path.glob(f"*{SUFFIX}")) == []
    spool.close()


def test_unconfirmed_records_are_replayed_after_a_restart(tmp_path: Path) -> None:
    first = Spool(tmp_path, segment_records=2)
    first.open()
    first.append(_records(3))
    delivered = next(iter(first.take_unsent(1)))
    first.ack(delivered.seq)
    first.close()  # a crash: the half-confirmed segment is still on disk

    second = Spool(tmp_path, segment_records=2)
    assert second.open() == 3
    assert [(r.key, r.value) for r in second.take_unsent(10)] == _records(3)
    second.append(_records(1, start=3))
    assert [r.key for r in second.take_unsent(10)] == [b"k3"]
    second.close()


def test_a_torn_last_frame_is_cut_off_on_open(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append(_records(2))
    spool.close()
    segment = next(tmp_path.glob(f"*{SUFFIX}"))
    segment.write_bytes(segment.read_bytes()[:-4])
    reopened = Spool(tmp_path)
    assert reopened.open() == 1
    assert [r.key for r in reopened.take_unsent(10)] == [b"k0"]
    reopened.close()


def test_in_flight_records_return_when_the_producer_is_replaced(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append(_records(2))
    assert len(list(spool.take_unsent(10))) == 2
    spool.release_in_flight()
    assert [r.key for r in spool.take_unsent(10)] == [b"k0", b"k1"]
    spool.close()


def test_one_spool_one_owner(tmp_path: Path) -> None:
    owner = Spool(tmp_path)
    owner.open()
    with pytest.raises(SpoolBusyError, match="in use by another process"):
        Spool(tmp_path).open()
    owner.close()
    Spool(tmp_path).open()


def test_a_failed_write_leaves_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append(_records(1))

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("clawr1.proxy.spool.os.write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        spool.append(_records(2, start=1))
    monkeypatch.undo()
    assert spool.append(_records(2, start=1)) == 2
    spool.close()
    reopened = Spool(tmp_path)
    assert reopened.open() == 3
    assert [r.key for r in reopened.take_unsent(10)] == [b"k0", b"k1", b"k2"]
    reopened.close()
