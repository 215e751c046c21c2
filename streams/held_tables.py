"""Table writes held until the end of an agent's batch, one changelog record per key instead of one per write.

A white-box trajectory posted in one request arrives as consecutive events of one partition, and every
step rewrote its trajectory's join state and prefix-tree scope (a record that grows with the trajectory)
to the changelog. Inside a batch those writes are held here and the last value of each key is written
when the batch ends, before Faust acks the batch's events, so a crash loses only writes whose events are
delivered again. Reads see held values first, from every agent: an agent that handles events one by one
writes through at once and takes over the held value it read, so nothing held can overwrite it later.

Each held write remembers the event it was made for: Faust sends a table's changelog record to the
partition of the event being handled, and at the end of the batch that is no longer the right one.
"""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Any

from faust.streams import _current_event
from faust.types import TableT

# Set by an agent body while it handles a batch whose writes may be held.
HOLDING: ContextVar[bool] = ContextVar("clawr1_holding", default=False)


class HeldTable:
    """A Faust table read and written through ``get`` and item assignment, with batch writes held."""

    def __init__(self, table: TableT) -> None:
        self.table = table
        self._held: dict[Any, tuple[Any, weakref.ReferenceType[Any] | None]] = {}

    def get(self, key: Any) -> Any:
        held = self._held.get(key)
        return held[0] if held is not None else self.table.get(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if HOLDING.get():
            self._held[key] = (value, _current_event.get(None))
        else:
            self._held.pop(key, None)
            self.table[key] = value

    def __len__(self) -> int:
        return len(self._held)

    def flush(self) -> int:
        """Write every held value under the event it was made for; how many records that was."""
        written = 0
        restore = _current_event.set(None)
        try:
            for key in list(self._held):
                value, event = self._held[key]
                _current_event.set(event)
                self.table[key] = value
                del self._held[key]  # only once written: a failure keeps the rest held
                written += 1
        finally:
            _current_event.reset(restore)
        return written
