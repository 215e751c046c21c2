"""A batch that would carry few records waits longer, up to a bound, so its fixed cost is shared.

The worker's checkpoint (one Kafka transaction, a commit marker on every partition it wrote), the sink's
insert (a pool part, an offset commit) and the proxy's envelope (a Kafka message, a produce request,
a message the worker polls) each cost about the same whatever they carry. On their usual timers, at a
few dozen calls a second, each carries one or two records and that fixed cost is most of the capture's
CPU. ``ThinWait`` spaces such thin batches: one holding fewer than ``fill`` records goes no sooner than
``wait_s`` after the previous one; one holding ``fill`` goes on the usual timer (freshness under load is
unchanged), and so does the first after a pause longer than ``wait_s`` (a lone call is not held).
The added delay is bounded by ``wait_s`` less the usual interval, and only below ``fill`` records per it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinWait:
    """``fill`` records make a batch worth its fixed cost; a thinner one waits until ``wait_s`` has passed
    since the previous batch went (``wait_s`` 0: never)."""

    wait_s: float
    fill: int

    def due_at(self, usual: float, previous: float, count: int) -> float:
        """When a batch of ``count`` records that its usual timer makes due at ``usual`` goes, the previous
        batch having gone at ``previous`` (clock values)."""
        if count >= self.fill:
            return usual
        return max(usual, previous + self.wait_s)


NEVER = ThinWait(0.0, 1)  # a batch goes on its usual timer, however thin
