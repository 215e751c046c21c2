"""Held table writes: one record per key per batch, under the event each was made for."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import pytest
from faust.streams import _current_event, current_event

from clawr1.streams.held_tables import HOLDING, HeldTable


@dataclass(eq=False)
class _Event:
    partition: int


class _Table(dict):
    """Records each write with the partition Faust would send its changelog record to."""

    def __init__(self, fail_on: str = "") -> None:
        super().__init__()
        self.writes: list[tuple[str, Any, int]] = []
        self.fail_on = fail_on

    def __setitem__(self, key: str, value: Any) -> None:
        if key == self.fail_on:
            raise RuntimeError("broker away")
        event = current_event()
        assert event is not None, "Faust refuses a table write outside an event"
        self.writes.append((key, value, event.partition))
        super().__setitem__(key, value)


def _as(event: _Event) -> None:
    _current_event.set(weakref.ref(event))


def test_held_writes_are_read_back_and_written_once_per_key_under_their_own_event() -> None:
    table = _Table()
    held = HeldTable(table)  # type: ignore[arg-type]
    e0, e1 = _Event(0), _Event(1)
    token = HOLDING.set(True)
    try:
        _as(e0)
        held["t1"] = {"v": 1}
        held["t1"] = {"v": 2}
        _as(e1)
        held["t2"] = {"v": 9}
        assert table.writes == [] and held.get("t1") == {"v": 2} and len(held) == 2
        assert held.flush() == 2
    finally:
        HOLDING.reset(token)
    assert table.writes == [("t1", {"v": 2}, 0), ("t2", {"v": 9}, 1)]
    assert current_event() is e1  # the flush leaves the handler's event as it was
    assert held.flush() == 0 and held.get("t1") == {"v": 2}


def test_a_write_outside_a_batch_goes_through_and_takes_over_the_held_value() -> None:
    table = _Table()
    held = HeldTable(table)  # type: ignore[arg-type]
    e0 = _Event(3)
    _as(e0)
    token = HOLDING.set(True)
    held["t"] = {"v": 1}
    HOLDING.reset(token)
    held["t"] = {"v": 1, "feedback": True}  # an agent handling one event at a time
    assert table.writes == [("t", {"v": 1, "feedback": True}, 3)]
    assert held.flush() == 0  # nothing held can overwrite it later
    assert table["t"] == {"v": 1, "feedback": True}


def test_a_failed_flush_keeps_what_it_did_not_write() -> None:
    table = _Table(fail_on="b")
    held = HeldTable(table)  # type: ignore[arg-type]
    event = _Event(0)  # a batch holds its events until it is done: their weak references stay good
    _as(event)
    token = HOLDING.set(True)
    held["a"], held["b"], held["c"] = 1, 2, 3
    HOLDING.reset(token)
    with pytest.raises(RuntimeError):
        held.flush()
    assert [w[0] for w in table.writes] == ["a"] and len(held) == 2 and held.get("c") == 3
