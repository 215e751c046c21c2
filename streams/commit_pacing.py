"""Checkpoints stay open longer while input keeps coming: fewer, larger transactions under load, and the
same freshness once input pauses.

Every checkpoint is one Kafka transaction (its outputs, its state changelogs, its input offsets, and a
commit marker on every partition it wrote), whose cost hardly depends on how much it holds. Committed
every ``CLAWR1_STREAMS_COMMIT_INTERVAL_MS`` whatever the load, a worker with a backlog pays it again and
again on small checkpoints: on a loaded 2-core machine, 14 white-box steps a checkpoint. While every
poll brings a message, ``CommitPacing`` holds a due checkpoint open up to
``CLAWR1_STREAMS_BUSY_COMMIT_INTERVAL_MS``; the first poll that brings nothing (input paused, or the
worker caught up) lets it commit as before. A forced commit (a revoke, the stop) is never held, nor a
checkpoint that holds ``commit_every`` input records.

The other way round, a trickle: checkpoints of a record or two, each paying a transaction and its
markers. A checkpoint holding fewer than ``CLAWR1_STREAMS_THIN_COMMIT_RECORDS`` records commits no sooner
than ``CLAWR1_STREAMS_THIN_COMMIT_INTERVAL_MS`` after the previous commit (``clawr1.core.thin_batch``); the
first records after a longer pause commit on the usual interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from clawr1.core.thin_batch import ThinWait

Commit = Callable[..., Any]


class CommitPacing:
    """Counts the input records handled (``fed``) and decides, at each of Quix's commit calls, whether
    the open checkpoint waits for more. ``usual_s``: Quix's commit interval."""

    def __init__(self, busy_s: float, commit_every: int, thin: ThinWait, usual_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._busy_s = busy_s
        self._every = commit_every
        self._thin = thin
        self._usual_s = usual_s
        self._clock = clock
        self._fed = 0  # records handled since the last commit call (what the last poll brought)
        self._held = 0  # records in the open checkpoint
        self._checkpoint: object | None = None
        self._opened = 0.0
        self._committed = -float("inf")  # when a checkpoint holding records last committed

    def fed(self, records: int = 1) -> None:
        self._fed += records

    def hold(self, checkpoint: object) -> bool:
        """Whether a timed commit of ``checkpoint`` waits: the last poll brought input and it has been
        open less than the busy interval, or it is thin (``ThinWait``); never once it holds
        ``commit_every`` records."""
        now = self._clock()
        if checkpoint is not self._checkpoint:  # the last one committed: this one opened since
            if self._held:
                self._committed = now
            self._checkpoint, self._opened, self._held = checkpoint, now, 0
        fed, self._fed = self._fed, 0
        self._held += fed
        if self._held >= self._every:
            return False
        busy = fed > 0 and now - self._opened < self._busy_s
        thin = self._held > 0 and now < self._thin.due_at(self._opened + self._usual_s, self._committed,
                                                          self._held)
        return busy or thin

    def wrap(self, checkpoint: Callable[[], object]) -> Callable[[Commit], Commit]:
        """A wrapper for the processing context's ``commit_checkpoint`` (``quix_compat.wrap_commits``);
        ``checkpoint`` returns the open checkpoint."""
        def wrap(commit: Commit) -> Commit:
            def paced(force: bool = False, revoking: bool = False) -> Any:
                if force or revoking or not self.hold(checkpoint()):
                    return commit(force=force, revoking=revoking)
                return None
            return paced
        return wrap
