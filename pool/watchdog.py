"""One thread that keeps every running SQL query's deadline (``clawr1.pool.admission``).

A thread per query cost ~160 us to start and stop, a tenth of a trainer's small poll; one thread and a
heap of deadlines cost nothing per query but a push.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Protocol

# How long past max_execution_time the watchdog waits for the engine's own check before it acts.
WATCHDOG_GRACE_S = 1.0


class Overdue(Protocol):
    def overdue(self) -> None:
        """Called once, at the deadline, unless the watched thing ended first (it then ignores it)."""


class Watchdog:
    """``watch(item, after_s)``: call ``item.overdue()`` once ``after_s`` have passed."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Overdue]] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, item: Overdue, after_s: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + after_s, id(item), item))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clawr1-sql-watchdog", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, item = heapq.heappop(self._due)
            item.overdue()


WATCHDOG = Watchdog()
