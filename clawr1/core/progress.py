"""Healthy means progressing: a consumer group with input waiting and no progress for a while is stuck,
whatever its processes say.

A worker that wedged once looked alive to every check that asked the process; what it did not do was
move its group's committed offsets while records waited. So health is judged from the outside, from
Kafka: per partition of the group's inputs, the committed offset and the end of the log. A partition
*progresses* when its committed offset moved since the last look, or when nothing waits beyond it; it
*stalls* when records have waited for ``stall_s`` while the offset did not move. The group is stuck while any
partition stalls, and stays stuck until that partition's offset moves: a restart alone does not make
it healthy.

Overload is not a stall: a worker busy with a backlog may leave one of its partitions waiting while it
commits others. A stalled partition whose owner (as last described) moved the committed offset of any of
its partitions within ``stall_s`` is excused; only a member that committed nothing at all for ``stall_s``
while its records waited is stuck.

Records beyond the committed offset are not always work: a transaction's commit marker takes an offset
of its own, and an aborted transaction's records are never delivered. Before a partition is called
stalled, ``probe`` reads from its committed offset as a ``read_committed`` consumer does, and the
partition stalls only if the first record it finds was in the log when the clock started (below the end
seen then). Nothing found means only markers or aborted records wait: caught up. A record found past that
end came later: a partition whose lag was only a trailing marker looks stalled the moment new work
arrives (its committed offset has not moved for as long as it idled), so its clock starts again instead.
A probe that read nothing and skipped nothing could not tell: that is no verdict, not "caught up".

The clocks run only while Kafka answers the watch: a failed look pauses them, a slow one does not. (A
watch that started its clocks again after any gap of more than 6 s between looks did not name a worker
wedged for three minutes in a rolling restart of a 3-broker cluster; a describe timing out at 5 s makes
such gaps.)

A worker can also be cut off while its group goes on: frozen (SIGSTOP) or partitioned from the broker,
it drops out of the group after its session timeout and another worker takes its partitions, so no
offset stalls. ``ProgressWatch`` therefore also records when each member (by client id) was last seen
in its group: a worker process that has not been a member for ``stall_s`` is stuck too.

``ProgressTracker`` is the rule (pure, tested without Kafka); ``ProgressWatch`` samples the offsets and
the members in a background thread for ``/healthz`` (the API) and for the supervisor (which restarts a
stuck worker).

Each look is four requests per group the broker answers (describe, metadata, committed offsets, log
ends: ~5 ms of its CPU, and ~3 ms of the watcher's), and two watches look (the supervisor's and the
API's): at a look every 2 s, most of an idle stack's requests. So while the last look found every group
caught up (nothing waiting beyond a trailing commit marker, its members as the look before), the next
comes later (``look_interval``): a fifth of ``stall_s``, 6 s at most, never sooner than ``interval_s``.
Records that arrive meanwhile start their clock at the look that first sees them, so a worker that
wedges on them is named at most that much later than ``stall_s`` after they arrived (36 s instead of 32
at the default 30 s); a group with anything waiting is looked at every ``interval_s`` as before.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from clawr1.core.metrics import CONSUMER_STALLED_SECONDS
from clawr1.core.offsets import Offsets, Partition, group_offsets, group_reader

log = logging.getLogger(__name__)

CAUGHT_UP_SHARE = 0.2  # of stall_s: the look interval while every group is caught up
CAUGHT_UP_MAX_S = 6.0


@dataclass(frozen=True)
class Stall:
    """A stuck group: how much waits in its stalled partitions, and for how long nothing moved."""

    group: str
    lag: int
    seconds: float
    partitions: tuple[str, ...]

    def describe(self) -> str:
        where = ", ".join(self.partitions[:4]) + (" ..." if len(self.partitions) > 4 else "")
        return (f"consumer group {self.group}: {self.lag} records waiting, no progress for "
                f"{self.seconds:.0f}s ({where})")


@dataclass
class _Seen:
    committed: int
    since: float  # when the partition last progressed (or records started waiting)
    waiting: bool
    end: int  # the log's end at ``since``: what waits below it has waited since then


class ProbeInconclusive(Exception):
    """The probe could not tell what waits (no answer in time): no verdict on that partition this look."""


@dataclass
class ProgressTracker:
    """The stall clocks run only while the group is seen: a look that failed (``unseen``) pauses its
    clocks until the next look that succeeds, so a group is not blamed for a time when nobody could see
    it, while looks that are slow, or fail now and then, still add up to a verdict."""

    stall_s: float
    _seen: dict[tuple[str, Partition], _Seen] = field(default_factory=dict)
    _moved: dict[tuple[str, Partition], float] = field(default_factory=dict)  # when its offset last moved
    _looked: dict[str, float] = field(default_factory=dict)  # group -> its last look that succeeded
    _owner: dict[tuple[str, Partition], str] = field(default_factory=dict)  # its member at the last look
    _blind: set[str] = field(default_factory=set)  # groups with a failed look since then

    def unseen(self, group: str) -> None:
        """A look at ``group`` failed: the time until its next look does not count."""
        self._blind.add(group)

    def observe(self, group: str, now: float, offsets: Mapping[Partition, Offsets],
                probe: Callable[[Partition, int], int | None],
                owners: Mapping[Partition, str] | None = None) -> Stall | None:
        """Fold in one look at ``group``'s offsets (those of the partitions Kafka answered for); the
        stall, if the group is stuck now.

        ``probe(partition, offset)``: the offset of the first committed record at or after ``offset``
        (None: none), or ``ProbeInconclusive``. ``owners``: each partition's member as last described
        (a partition left out has none known, and is judged alone). A partition that changed hands
        starts its clock again: its new owner gets the window of its own (it rebuilds the partition's
        state first), not what is left of its last owner's.
        """
        last = self._looked.get(group)
        if group in self._blind and last is not None:
            for (owner, _), paused in self._seen.items():
                if owner == group:
                    paused.since += now - last
        self._blind.discard(group)
        self._looked[group] = now
        stalled: list[tuple[Partition, Offsets, float]] = []
        for partition, at in offsets.items():
            seen = self._seen.get((group, partition))
            if seen is None or seen.committed != at.committed:
                self._moved[(group, partition)] = now
            if self._changed_hands(group, partition, owners):
                seen = None
            if seen is None or seen.committed != at.committed or at.lag == 0 or not seen.waiting:
                self._seen[(group, partition)] = _Seen(at.committed, now, at.lag > 0, at.end)
                continue
            if now - seen.since >= self.stall_s and not self._owner_progressed(group, partition, now, owners):
                try:
                    found = probe(partition, at.committed)
                except ProbeInconclusive:
                    continue  # the clock runs on; the next look probes again
                if found is not None and found < seen.end:
                    stalled.append((partition, at, now - seen.since))
                else:  # only markers or aborted records waited then: caught up, and the clock starts again
                    seen.since, seen.end = now, at.end if found is None else max(at.end, found + 1)
        if not stalled:
            return None
        return Stall(group, sum(at.lag for _, at, _ in stalled), max(s for _, _, s in stalled),
                     tuple(sorted(f"{t}[{p}]" for (t, p), _, _ in stalled)))

    def _changed_hands(self, group: str, partition: Partition,
                       owners: Mapping[Partition, str] | None) -> bool:
        """Whether ``partition`` has another owner than at the last look that named one."""
        owner = None if owners is None else owners.get(partition)
        if owner is None:
            return False
        before = self._owner.get((group, partition))
        self._owner[(group, partition)] = owner
        return before is not None and before != owner

    def _owner_progressed(self, group: str, partition: Partition, now: float,
                          owners: Mapping[Partition, str] | None) -> bool:
        """Whether ``partition``'s owner committed on any of its partitions within ``stall_s``: busy."""
        if owners is None or (owner := owners.get(partition)) is None:
            return False
        return any(now - self._moved.get((group, p), -float("inf")) < self.stall_s
                   for p, member in owners.items() if member == owner)


def caught_up(offsets: Mapping[Partition, Offsets], members: Mapping[str, set[Partition]] | None,
              before: Mapping[str, set[Partition]] | None) -> bool:
    """Whether a look found nothing to watch closely: every partition behind by one offset at most (a
    transactional producer's trailing commit marker), and the group described with the members and
    assignments of the description before."""
    return members is not None and members == before and all(at.lag <= 1 for at in offsets.values())


def look_interval(caught_up: bool, interval_s: float, stall_s: float) -> float:
    """Seconds to the next look: ``interval_s`` unless every group was caught up at the last look; then
    ``CAUGHT_UP_SHARE`` of ``stall_s`` (at most ``CAUGHT_UP_MAX_S``), never less than ``interval_s``."""
    if not caught_up:
        return interval_s
    return max(interval_s, min(CAUGHT_UP_MAX_S, stall_s * CAUGHT_UP_SHARE))


@dataclass
class _Blindness:
    """How long each group has gone without an answer to one kind of look; logged, not hidden."""

    what: str
    every_s: float
    _since: dict[str, float] = field(default_factory=dict)
    _told: dict[str, float] = field(default_factory=dict)

    def failed(self, group: str, exc: Exception) -> float:
        """Seconds ``group`` has gone unanswered (logged past ``every_s``, then every ``every_s``)."""
        now = time.monotonic()
        since = self._since.setdefault(group, now)
        if now - since >= self.every_s and now - self._told.get(group, since) >= self.every_s:
            self._told[group] = now
            log.warning("consumer group %s not %s for %.0fs (its progress is not judged meanwhile): %s",
                        group, self.what, now - since, exc)
        else:
            log.debug("consumer group %s not %s: %s", group, self.what, exc)
        return now - since

    def answered(self, group: str) -> None:
        if self._since.pop(group, None) is not None and self._told.pop(group, None) is not None:
            log.warning("consumer group %s %s again", group, self.what)


class ProgressWatch:
    """Samples the committed offsets of ``groups`` (group -> its input topics) every ``interval_s`` (less
    often while all are caught up: ``look_interval``) with a consumer that never joins them; ``stalls()``
    is the latest verdict per group.

    The watch must not go blind quietly: a group that cannot be looked at or described for ``stall_s``
    is logged (and again every ``stall_s``), and the watch's Kafka clients are made anew while its looks
    keep failing, in case it is they that are stuck (a probe that cannot tell, too)."""

    def __init__(self, bootstrap: str, groups: Mapping[str, Iterable[str]], stall_s: float,
                 interval_s: float = 2.0) -> None:
        self._bootstrap = bootstrap
        self._groups = {group: list(topics) for group, topics in groups.items()}
        self._tracker = ProgressTracker(stall_s)
        self._interval = interval_s
        self._stale_s = max(5.0, 3 * interval_s)  # looks failing for longer than this: new clients
        # Members described longer ago than this: no verdict (three looks, one of them a caught-up one).
        self._described_within_s = self._stale_s + look_interval(True, interval_s, stall_s) - interval_s
        self._stalls: dict[str, Stall] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clawr1-progress", daemon=True)
        self._readers: dict[str, Consumer] = {}
        self._probe: Consumer | None = None
        self._admin: AdminClient | None = None
        self._members: dict[str, dict[str, set[Partition]]] = {}  # group -> client id -> its partitions
        self._last_seen: dict[tuple[str, str], float] = {}  # (group, client id) -> when
        self._described: dict[str, float] = {}  # group -> when its members were last described
        self._renewed_at = -float("inf")
        self._unlooked = _Blindness("looked at", stall_s)
        self._undescribed = _Blindness("described", stall_s)

    def start(self) -> ProgressWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def stalls(self) -> dict[str, Stall]:
        with self._lock:
            return dict(self._stalls)

    def member_problem(self, group: str, client_id: str, since: float) -> str | None:
        """Why the member ``client_id`` of ``group`` is stuck, if it is. ``since``: when its process started
        (or became ready): its clock starts there, so a restarted worker gets ``stall_s`` of its own before
        it is judged; then it is stuck when out of the group for ``stall_s``, or owning a stalled partition
        (as last described)."""
        now = time.monotonic()
        if now - since < self._tracker.stall_s:
            return None
        with self._lock:
            described = now - self._described.get(group, -float("inf")) <= self._described_within_s
            stall = self._stalls.get(group)
            owned = self._members.get(group, {}).get(client_id)
            seen = max(since, self._last_seen.get((group, client_id), since))
        # Membership is judged only on a recent answer: when Kafka is away, it is Kafka that is down.
        if described and owned is None and now - seen >= self._tracker.stall_s:
            return f"not a member of consumer group {group} for {now - seen:.0f}s (frozen or cut off)"
        if stall is not None and (owned is None or any(f"{t}[{p}]" in stall.partitions for t, p in owned)):
            return stall.describe()
        return None

    def _run(self) -> None:
        wait = self._interval
        try:
            while not self._stop.wait(wait):
                calm = [self._look(group, topics) for group, topics in self._groups.items()]
                wait = look_interval(all(calm), self._interval, self._tracker.stall_s)
        finally:
            self._close_clients()

    def _look(self, group: str, topics: list[str]) -> bool:
        """Look at ``group`` once; whether it was caught up (``caught_up``)."""
        members = self._describe(group)
        with self._lock:
            before = self._members.get(group)
            known = members if members is not None else before or {}
        owners = {partition: member for member, owned in known.items() for partition in owned}
        try:
            offsets = self._offsets(group, topics)
            stall = self._tracker.observe(group, time.monotonic(), offsets, self._first_record, owners)
        except Exception as exc:  # noqa: BLE001 - Kafka away: no verdict, and the clocks pause
            self._tracker.unseen(group)
            with self._lock:
                self._stalls.pop(group, None)
            if self._unlooked.failed(group, exc) > self._stale_s:
                self._renew_clients()
            return False
        self._unlooked.answered(group)
        with self._lock:
            if stall is None:
                self._stalls.pop(group, None)
            else:
                self._stalls[group] = stall
            if members is not None:
                now = time.monotonic()
                self._members[group] = members
                self._described[group] = now
                self._last_seen.update({(group, m): now for m in members})
        CONSUMER_STALLED_SECONDS.labels(group=group).set(0 if stall is None else stall.seconds)
        return stall is None and caught_up(offsets, members, before)

    def _describe(self, group: str) -> dict[str, set[Partition]] | None:
        """The group's members (client id -> assigned partitions), None when the broker did not say."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self._bootstrap})
        try:
            described = self._admin.describe_consumer_groups([group])[group].result(5)
        except Exception as exc:  # noqa: BLE001 - unknown group, broker away: no verdict this time
            if self._undescribed.failed(group, exc) > self._stale_s:
                self._renew_clients()
            return None
        self._undescribed.answered(group)
        return {m.client_id: {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
                for m in described.members}

    def _offsets(self, group: str, topics: list[str]) -> dict[Partition, Offsets]:
        reader = self._readers.get(group)
        if reader is None:
            reader = self._readers[group] = group_reader(self._bootstrap, group)
        return group_offsets(reader, topics)

    def _first_record(self, partition: Partition, offset: int) -> int | None:
        """The offset of the first committed record at or after ``offset`` (read as the group reads it);
        None when only commit markers or aborted records follow it, ``ProbeInconclusive`` when the read
        did not get that far."""
        if self._probe is None:
            self._probe = Consumer({"bootstrap.servers": self._bootstrap,
                                    "group.id": f"clawr1-progress-probe-{uuid.uuid4().hex[:8]}",
                                    "enable.auto.commit": False, "isolation.level": "read_committed"})
        where = TopicPartition(partition[0], partition[1], offset)
        self._probe.assign([where])
        try:
            read = self._probe.consume(1, timeout=3.0)
            position = self._probe.position([where])[0].offset
        finally:
            self._probe.unassign()
        # What the verdict rests on goes to the log: a stuck worker is killed on it. An error read (a
        # broker moving a leader, say) is no record: the next sample looks again.
        for message in read:
            log.warning("%s[%d] from committed offset %d: %s", partition[0], partition[1], offset,
                        f"error {message.error()}" if message.error() else f"a record at {message.offset()}")
        found = next((message.offset() for message in read if message.error() is None), None)
        if found is None and position <= offset:  # nothing read, not even markers skipped: no answer
            log.warning("%s[%d] from committed offset %d: no answer in 3s; the probe is made anew",
                        partition[0], partition[1], offset)
            self._probe.close()
            self._probe = None
            raise ProbeInconclusive(f"{partition[0]}[{partition[1]}] from {offset}")
        return found

    def _renew_clients(self) -> None:
        """Made anew at the next look, at most once per ``_stale_s`` (a broker down for long is not a
        reason to churn through clients every look)."""
        now = time.monotonic()
        if now - self._renewed_at >= self._stale_s:
            self._renewed_at = now
            self._close_clients()

    def _close_clients(self) -> None:
        for consumer in [*self._readers.values(), *([self._probe] if self._probe else [])]:
            consumer.close()
        self._readers.clear()
        self._probe = self._admin = None
