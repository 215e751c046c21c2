"""When the worker lets state go: a timer wheel kept in the state store itself.

Every state value that can grow with traffic (a home record, a trajectory kept under its own hash, an
index entry, held feedback, a prompt group's merge scope) records when a checkpoint last wrote it
(``touched_ms``, the worker's wall clock). A checkpoint that writes one also schedules a check of it in
the wheel, ``ttl_ms`` later; a later checkpoint that finds the check due and the value untouched since
deletes it (tombstones on the changelog), with what hangs off it (chunks, index entries). A value
touched again meanwhile was scheduled again, later, so a stale check is skipped: no clock per key
needs rewriting, and a checkpoint writes one wheel key per partition, never rewritten.

The wheel, per partition, in namespace ``E`` (``Namespace.WHEEL``): ``E/<bucket>`` counts the slices
scheduled into bucket ``bucket`` (``bucket_ms`` of wall clock each), ``E/<bucket>.<n>`` is slice ``n``
(the checks one checkpoint scheduled there), ``E/cursor`` the next (bucket, slice) to sweep. A bucket
is swept once the clock has passed its start; since every check lands at least ``ttl_ms`` after it was
scheduled, nothing is scheduled into a bucket already passed. A sweep handles at most ``max_checks``
checks per checkpoint and resumes at its cursor.

Expired trajectories and conversations leave a small marker (namespace ``Z``, ``Namespace.EXPIRED``)
for ``marker_ttl_ms``, so what arrives for them later is told apart from what is new
(``clawr1.streams.expiring.Expiring.expired_here``).

Only checkpoints sweep, and Quix closes an empty checkpoint without running it, so the worker sends
its partitions a tick (``TICK``) every ``bucket_ms``: state expires on an idle stack too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from clawr1.streams.namespaces import Namespace

# What a check names: the kind of value, and its name in its namespace.
HOME, TRAJECTORY, TARGET, HELD, GROUP, MARKER = "r", "t", "x", "h", "g", "z"
KINDS = (HOME, TRAJECTORY, TARGET, HELD, GROUP, MARKER)
TICK = "tick"  # a work message that only opens a checkpoint (so that it sweeps)

Check = tuple[str, str]  # (kind, name)
Checks = list[tuple[int, Check]]  # (partition, check): what a checkpoint schedules


@dataclass(frozen=True)
class Clock:
    """The expiry settings of a worker."""

    ttl_ms: int
    marker_ttl_ms: int
    max_checks: int = 20_000

    @property
    def bucket_ms(self) -> int:
        """A tenth of the TTL (a value lives at most 10% past it), at least a second."""
        return max(1_000, self.ttl_ms // 10)

    def bucket_of(self, at_ms: int) -> int:
        return -(-at_ms // self.bucket_ms)  # the first bucket starting at or after ``at_ms``

    def due_bucket(self, now_ms: int, kind: str) -> int:
        """Where a check of a value written now goes."""
        return self.bucket_of(now_ms + self.ttl_for(kind))

    def ttl_for(self, kind: str) -> int:
        return self.marker_ttl_ms if kind == MARKER else self.ttl_ms

    def expired(self, touched_ms: int | None, now_ms: int, kind: str) -> bool:
        """Whether a value last written at ``touched_ms`` is due. A value without a time (written before
        the worker kept one) counts as written when its check was scheduled, which was ``ttl`` ago."""
        return touched_ms is None or touched_ms + self.ttl_for(kind) <= now_ms

    def swept_through(self, now_ms: int) -> int:
        """The last bucket a sweep at ``now_ms`` may take: every check in it is due."""
        return now_ms // self.bucket_ms


class PartitionStore(Protocol):
    """What the wheel needs of ``clawr1.streams.store.Store``."""

    def get(self, partition: int, namespace: Namespace, name: str) -> Any: ...

    def put(self, partition: int, namespace: Namespace, name: str, value: Any) -> None: ...

    def delete(self, partition: int, namespace: Namespace, name: str) -> None: ...


CURSOR = "cursor"
MAX_EMPTY_BUCKETS = 10_000  # buckets a sweep steps over per checkpoint (a partition idle for long)


class Wheel:
    """The timer wheel of every partition, read and written through the checkpoint's store."""

    def __init__(self, store: PartitionStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def schedule(self, partition: int, checks: Iterable[Check], now_ms: int) -> None:
        """Add one slice per due bucket holding ``checks``."""
        cursor = self.store.get(partition, Namespace.WHEEL, CURSOR)
        floor = cursor[0] if cursor else 0
        by_bucket: dict[int, list[list[str]]] = {}
        for kind, name in checks:
            bucket = max(self.clock.due_bucket(now_ms, kind), floor)
            by_bucket.setdefault(bucket, []).append([kind, name])
        for bucket, entries in by_bucket.items():
            slices = self.store.get(partition, Namespace.WHEEL, str(bucket)) or 0
            self.store.put(partition, Namespace.WHEEL, f"{bucket}.{slices}", entries)
            self.store.put(partition, Namespace.WHEEL, str(bucket), slices + 1)
        if cursor is None and by_bucket:
            self.store.put(partition, Namespace.WHEEL, CURSOR, [min(by_bucket), 0])

    def take(self, partition: int, now_ms: int) -> list[Check]:
        """The due checks of ``partition`` (at most about ``max_checks``), removed from the wheel."""
        cursor = self.store.get(partition, Namespace.WHEEL, CURSOR)
        if cursor is None:
            return []
        bucket, n = cursor
        last = self.clock.swept_through(now_ms)
        taken: list[Check] = []
        stepped = 0
        while bucket <= last and len(taken) < self.clock.max_checks and stepped < MAX_EMPTY_BUCKETS:
            slices = self.store.get(partition, Namespace.WHEEL, str(bucket)) or 0
            if n < slices:
                name = f"{bucket}.{n}"
                entries = self.store.get(partition, Namespace.WHEEL, name) or ()
                taken += [(str(kind), str(key)) for kind, key in entries]
                self.store.delete(partition, Namespace.WHEEL, name)
                n += 1
                continue
            if slices:
                self.store.delete(partition, Namespace.WHEEL, str(bucket))
            bucket, n = bucket + 1, 0
            stepped += 1
        if [bucket, n] != list(cursor):
            self.store.put(partition, Namespace.WHEEL, CURSOR, [bucket, n])
        return taken
