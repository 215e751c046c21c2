"""Where the worker's records are kept in state, read once per checkpoint and written back at its end.

A trajectory's record is kept in its home record (``Namespace.HOME``) while that record's link state
names it alone, else under the hash of its own id (``Namespace.TRAJECTORY``); its step facts in chunks
(``Namespace.CHUNK``). ``write_back`` puts each changed record where it belongs now, moving a
trajectory out of its home record the checkpoint its link state names a second one
(``clawr1.streams.home_record`` says why), and indexes the routable step ids a scan under their hash
would miss (``Namespace.STEP_INDEX``). Link state lives in home records, target ids that are not
routable in ``Namespace.TARGET``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from clawr1.core.routing import (
    home_hash,
    id_tag,
    key_hash,
    partition_of,
    trajectory_named_after,
)
from clawr1.streams import expiry, home_record
from clawr1.streams.expiring import Expiring
from clawr1.streams.home_record import Home, HomeRecord
from clawr1.streams.linking import LinkState
from clawr1.streams.namespaces import Namespace, chunk_name
from clawr1.streams.store import Store
from clawr1.streams.targets import TargetState
from clawr1.streams.trajectory_record import Chunk, Trajectory, TrajectoryRecord


class KeptAt(NamedTuple):
    """Where a trajectory's record was read from: its namespace (``HOME`` or ``TRAJECTORY``) and hash."""

    namespace: Namespace
    hash: str


# The ``TRAJECTORY`` values a write-back read, by (partition, hash); each is written back.
KeptRecords = dict[tuple[int, str], dict[str, Any]]


class Placement:
    """The trajectories, link states and targets one checkpoint read, decoded; ``write_back`` stores
    the changed ones."""

    def __init__(self, store: Store, partitions: int, expiring: Expiring) -> None:
        self.store = store
        self.partitions = partitions
        self.expiring = expiring
        self._trajectories: dict[str, Trajectory] = {}
        self._found_at: dict[str, KeptAt | None] = {}  # where each trajectory was read from (None: new)
        self._arrivals: dict[str, list[str]] = {}  # trajectory -> steps first seen (routable ids)
        self._legacy_links: set[str] = set()  # link states read from ``LEGACY_LINK``, before home records
        self._links: dict[str, LinkState] = {}
        self._targets: dict[str, TargetState] = {}
        self._changed_trajectories: set[str] = set()
        self._changed_links: set[str] = set()
        self._changed_targets: set[str] = set()

    # ------------------------------------------------------------------ reading
    def trajectory(self, trajectory_id: str) -> Trajectory:
        cached = self._trajectories.get(trajectory_id)
        if cached is not None:
            return cached
        home = Home.of_trajectory(trajectory_id, self.partitions)
        part = home.partition
        found_at: KeptAt | None = KeptAt(Namespace.HOME, home.hash)
        record = self._home(home)
        data = None if record is None else record["t"].get(trajectory_id)
        if data is None:
            found_at = KeptAt(Namespace.TRAJECTORY, key_hash(trajectory_id))
            data = (self.store.get(part, Namespace.TRAJECTORY, found_at.hash) or {}).get(trajectory_id)
            if data is None:
                found_at = None
        self._found_at[trajectory_id] = found_at
        trajectory_record = TrajectoryRecord.from_json(data)
        if found_at is None and self.expiring.expired_here(part, trajectory_id):
            trajectory_record.after_expiry = True

        def load(n: int) -> Chunk | None:
            chunk: Chunk | None = self.store.get(part, Namespace.CHUNK, chunk_name(trajectory_id, n))
            return chunk

        def new(n: int) -> Chunk:
            chunk: Chunk = {}
            self.store.put(part, Namespace.CHUNK, chunk_name(trajectory_id, n), chunk)
            return chunk

        trajectory = Trajectory(trajectory_id, trajectory_record, load, new)
        self._trajectories[trajectory_id] = trajectory
        return trajectory

    def link_state(self, key: str) -> LinkState:
        state = self._links.get(key)
        if state is None:
            home = Home.of_raw_key(key, self.partitions)
            record = self._home(home)
            data = None if record is None else record["l"].get(key)
            if data is None:
                data = self.store.get(home.partition, Namespace.LEGACY_LINK, key)
                if data is not None:
                    self._legacy_links.add(key)
            state = LinkState.from_json(data)
            self._links[key] = state
        return state

    def target_state(self, key: str) -> TargetState:
        state = self._targets.get(key)
        if state is None:
            data = self.store.get(partition_of(key, self.partitions), Namespace.TARGET, key)
            state = TargetState.from_json(data)
            self._targets[key] = state
        return state

    def locate(self, partition: int, step_id: str) -> str | None:
        """The trajectory holding a routable step id, in ``partition``: the trajectory named after it (a
        call that started one), else from ``STEP_INDEX`` for ids named after their call, else among the
        trajectories whose hash the id carries."""
        namesake = trajectory_named_after(step_id)
        if step_id in self.trajectory(namesake).record.steps:
            return namesake
        mapped = self.store.get(partition, Namespace.STEP_INDEX, step_id)
        if mapped is not None:
            return str(mapped)
        tag = id_tag(step_id) or ""
        home = self._home(Home(partition, tag))
        kept = self.store.get(partition, Namespace.TRAJECTORY, tag) or {}
        for tid in sorted([*(home["t"] if home else ()), *kept]):
            if step_id in self.trajectory(tid).record.steps:
                return tid
        for tid, trajectory in self._trajectories.items():  # arrived in this checkpoint, not yet indexed
            if tag in (key_hash(tid), home_hash(tid)) and step_id in trajectory.record.steps:
                return tid
        return None

    # ------------------------------------------------------------------ changes
    def trajectory_changed(self, trajectory_id: str) -> None:
        self._changed_trajectories.add(trajectory_id)

    def link_changed(self, key: str) -> None:
        self._changed_links.add(key)

    def target_changed(self, key: str) -> None:
        self._changed_targets.add(key)

    def step_arrived(self, trajectory_id: str, step_id: str) -> None:
        """A routable step id seen for the first time: indexed by the write-back if a scan would miss it."""
        self._arrivals.setdefault(trajectory_id, []).append(step_id)

    # ------------------------------------------------------------------ write-back
    def write_back(self, now: int) -> expiry.Checks:
        """Put every record this checkpoint changed back into the store, stamped ``now``; the checks the
        expiry wheel is to schedule for them."""
        for tid in self._changed_trajectories:
            self._trajectories[tid].record.touched_ms = now
        homes: set[Home] = set()  # home records changed
        for key in self._changed_links:
            home = Home.of_raw_key(key, self.partitions)
            record = self._home(home)
            if record is None:
                record = home_record.empty()
                self.store.put(home.partition, Namespace.HOME, home.hash, record)
            record["l"][key] = self._links[key].to_json()
            if key in self._legacy_links:
                self.store.delete(home.partition, Namespace.LEGACY_LINK, key)
            homes.add(home)
        records: KeptRecords = {}  # TRAJECTORY keys read, all written back
        soles: dict[Home, str | None] = {}  # the one trajectory each home's link state names
        for home in list(homes):
            record = self._home(home)
            assert record is not None
            sole = self._sole(soles, home, record)
            for tid in [t for t in record["t"] if t != sole and t not in self._changed_trajectories]:
                self._move_out(home, record, tid, record["t"][tid], records)
        for tid in self._changed_trajectories:
            self._keep(tid, records, homes, soles)
        checks: expiry.Checks = []
        for (part, name), value in records.items():
            if value:
                self.store.put(part, Namespace.TRAJECTORY, name, value)
                checks += [(part, (expiry.TRAJECTORY, tid)) for tid in value]
            else:
                self.store.delete(part, Namespace.TRAJECTORY, name)
        for home in homes:
            record = self._home(home)
            assert record is not None
            record["touched_ms"] = now
            self.store.put(home.partition, Namespace.HOME, home.hash, record)
            checks.append((home.partition, (expiry.HOME, home.hash)))
        for key in self._changed_targets:
            part = partition_of(key, self.partitions)
            self.store.put(part, Namespace.TARGET, key, {**self._targets[key].to_json(), "touched_ms": now})
            checks.append((part, (expiry.TARGET, key)))
        return checks

    def discard(self) -> None:
        """Forget the checkpoint's records (after its write-back, or when it is thrown away)."""
        for cache in (self._trajectories, self._found_at, self._arrivals, self._links, self._targets):
            cache.clear()
        for changed in (self._changed_trajectories, self._changed_links, self._changed_targets,
                        self._legacy_links):
            changed.clear()

    def _home(self, home: Home) -> HomeRecord | None:
        record: HomeRecord | None = self.store.get(home.partition, Namespace.HOME, home.hash)
        return record

    def _kept_record(self, records: KeptRecords, part: int, trajectory_id: str) -> dict[str, Any]:
        """The ``TRAJECTORY`` value a trajectory is kept in under its own hash, read once per write-back."""
        slot = (part, key_hash(trajectory_id))
        if slot not in records:
            records[slot] = self.store.get(part, Namespace.TRAJECTORY, slot[1]) or {}
        return records[slot]

    def _keep(self, trajectory_id: str, records: KeptRecords, homes: set[Home],
              soles: dict[Home, str | None]) -> None:
        """Write a trajectory's record where it is kept now: in its home record while that record's link
        state names it alone, else under its own hash; index the steps a move hides from a scan."""
        home = Home.of_trajectory(trajectory_id, self.partitions)
        record = self._home(home)
        data = self._trajectories[trajectory_id].record.to_json()
        found_at = self._found_at.get(trajectory_id)
        if record is not None and self._sole(soles, home, record) == trajectory_id:
            record["t"][trajectory_id] = data
            homes.add(home)
            kept_under = home.hash
            if found_at is not None and found_at.namespace == Namespace.TRAJECTORY:  # moved in
                del self._kept_record(records, home.partition, trajectory_id)[trajectory_id]
                self._index(home.partition, trajectory_id, data["steps"], kept_under, found_at.hash)
        elif record is not None and found_at is not None and found_at.namespace == Namespace.HOME:
            self._move_out(home, record, trajectory_id, data, records)
            homes.add(home)
            kept_under = key_hash(trajectory_id)
        else:
            self._kept_record(records, home.partition, trajectory_id)[trajectory_id] = data
            kept_under = key_hash(trajectory_id)
        self._index(home.partition, trajectory_id, self._arrivals.get(trajectory_id, ()), kept_under, None)

    @staticmethod
    def _sole(soles: dict[Home, str | None], home: Home, record: HomeRecord) -> str | None:
        """The one trajectory the home's link state names, worked out once per write-back."""
        if home not in soles:
            soles[home] = home_record.sole_trajectory(record)
        return soles[home]

    def _move_out(self, home: Home, record: HomeRecord, trajectory_id: str, data: dict[str, Any],
                  records: KeptRecords) -> None:
        """A trajectory leaves its home record (its link state named a second one): kept under its own
        hash, with ``STEP_INDEX`` entries for the steps a scan of the home record found."""
        del record["t"][trajectory_id]
        self._kept_record(records, home.partition, trajectory_id)[trajectory_id] = data
        self._index(home.partition, trajectory_id, data["steps"], key_hash(trajectory_id), home.hash)

    def _index(self, part: int, trajectory_id: str, step_ids: Any, kept_under: str,
               found_under: str | None) -> None:
        for step_id in home_record.index_entries(trajectory_id, step_ids, kept_under, found_under):
            self.store.put(part, Namespace.STEP_INDEX, step_id, trajectory_id)
