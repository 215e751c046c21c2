"""A checkpoint commit that does not return is a wedged worker: it leaves, so that its restart fences the
open transaction and carries on from the last committed checkpoint.

Seen in a rolling restart of a 3-broker cluster: the worker blocked in Quix's commit, inside librdkafka's
``send_offsets_to_transaction`` (which Quix calls without a timeout off the revoke path), while the
transaction coordinator had already rolled the transaction back on its timeout. The process stayed alive
and in its group, committed nothing, and did not stop on SIGTERM (the main thread never came back to
Python). A commit cannot succeed once its transaction has timed out on the broker, so a commit that
runs far past ``transaction.timeout.ms`` is given up: the watchdog writes every thread's stack to stderr
and ends the process with ``EXIT_CODE``. Nothing is lost: the transaction never committed, so its
outputs are never read and its input offsets are read again.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

EXIT_CODE = 75  # EX_TEMPFAIL: a restart is the remedy


def _leave(seconds: float) -> None:
    log.critical("a checkpoint commit has not returned for %.0fs (its transaction cannot commit any more): "
                 "the worker exits so that its restart fences the transaction; where each thread was:",
                 seconds)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_CODE)


class CommitWatchdog:
    """``watch(commit)`` wraps a commit function; a call that runs past ``limit_s`` calls ``on_overrun``
    (by default: log, dump the stacks, exit) from the watchdog's own thread."""

    def __init__(self, limit_s: float, on_overrun: Callable[[float], None] = _leave) -> None:
        self.limit_s = limit_s
        self._on_overrun = on_overrun
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="clawr1-commit-watchdog", daemon=True)

    def watch(self, commit: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            outermost = self._started is None  # a revoke's commit inside another: the outer one is timed
            if outermost:
                self._started = time.monotonic()
            try:
                return commit(*args, **kwargs)
            finally:
                if outermost:
                    self._started = None
        return watched

    def start(self) -> CommitWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.limit_s / 4)):
            if (seconds := self._overrun()) is not None:
                self._on_overrun(seconds)
                return

    def _overrun(self) -> float | None:
        """How long the running commit has run, once past the limit. The commit is read again after the
        clock: a watchdog descheduled between the two reads must not blame a commit that returned."""
        started = self._started
        if started is None:
            return None
        seconds = time.monotonic() - started
        return seconds if seconds > self.limit_s and self._started == started else None
