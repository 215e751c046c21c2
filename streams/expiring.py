"""The worker's state letting go: which values a checkpoint schedules for a check, and what a due check
deletes with them (the wheel itself, and why it works as it does, is ``clawr1.streams.expiry``).

A home record goes with the trajectory it holds and leaves a marker for each conversation in its link
state; a trajectory kept under its own hash goes with its chunks and index entries; a prompt group with
its token chunks and its owner; index entries and held feedback alone. Feedback that never met its step
is a dead letter (stage ``expire``), with the reason, when its state goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from clawr1.core.routing import id_tag, key_hash
from clawr1.streams import expiry
from clawr1.streams.group_record import GroupRecord
from clawr1.streams.namespaces import Namespace, chunk_name
from clawr1.streams.origin import Origin
from clawr1.streams.rewards import fact_digest
from clawr1.streams.store import Store
from clawr1.streams.targets import TargetState
from clawr1.streams.trajectory_record import TrajectoryRecord

DeadLetter = Callable[[str, str, Origin], None]  # (stage, reason, origin)


class Expiring:
    """Schedules the values a checkpoint wrote and sweeps what is due, through the checkpoint's store."""

    def __init__(self, store: Store, clock: expiry.Clock, dead_letter: DeadLetter,
                 forget_tree: Callable[[str], object], feedback_topic: str, ttl_setting: str) -> None:
        self.store = store
        self.clock = clock
        self.wheel = expiry.Wheel(store, clock)
        self._dead_letter = dead_letter
        self._forget_tree = forget_tree
        self._feedback_topic = feedback_topic
        self._ttl = ttl_setting  # named in dead letters
        self.held: set[tuple[int, str]] = set()  # HELD keys written this checkpoint
        self._markers: set[tuple[int, str]] = set()  # EXPIRED markers written this checkpoint
        # Checks already in the wheel for the bucket ``_scheduled_in``: a value written by every
        # checkpoint is scheduled once per bucket, not once per checkpoint.
        self._scheduled: set[tuple[int, str, str]] = set()
        self._scheduled_in = -1

    def clear(self) -> None:
        self.held.clear()
        self._markers.clear()

    def schedule(self, checks: expiry.Checks, now: int) -> None:
        bucket = self.clock.due_bucket(now, expiry.HOME)
        if bucket != self._scheduled_in:
            self._scheduled.clear()
            self._scheduled_in = bucket
        checks = checks + [(part, (expiry.HELD, step_id)) for part, step_id in self.held]
        by_partition: dict[int, list[expiry.Check]] = {}
        for part, check in checks:
            if (part, *check) not in self._scheduled:
                by_partition.setdefault(part, []).append(check)
                self._scheduled.add((part, *check))
        for part, due in by_partition.items():
            self.wheel.schedule(part, due, now)

    def sweep(self, partitions: set[int], now: int) -> None:
        """Let go of what in ``partitions`` has not been written for the TTL; schedule the markers."""
        for part in sorted(partitions):
            for kind, name in self.wheel.take(part, now):
                if kind == expiry.HOME:
                    self._expire_home(part, name, now)
                elif kind == expiry.TRAJECTORY:
                    self._expire_kept(part, name, now)
                elif kind == expiry.TARGET:
                    self._expire_target(part, name, now)
                elif kind == expiry.HELD:
                    self._expire_held(part, name, now)
                elif kind == expiry.GROUP:
                    self._expire_group(part, name, now)
                elif kind == expiry.MARKER:
                    self._expire_marker(part, name, now)
        by_partition: dict[int, list[expiry.Check]] = {}
        for part, name in self._markers:
            by_partition.setdefault(part, []).append((expiry.MARKER, name))
        for part, markers in by_partition.items():
            self.wheel.schedule(part, markers, now)

    def expired_here(self, part: int, name: str) -> bool:
        """Whether ``name`` (a trajectory, a conversation, a scope) expired in ``part`` not long ago."""
        return self.store.get(part, Namespace.EXPIRED, name) is not None

    def dead_letter_fact(self, part: int, fact: dict[str, Any], reason: str) -> None:
        """A dead letter for a feedback fact whose raw event is no longer at hand: it cites the fact."""
        # No position to cite: the fact's digest tells its dead letters apart (and the same one again).
        origin = Origin(self._feedback_topic, part, -1, str(fact.get("target_id", "")).encode(),
                        orjson.dumps(fact), int(fact.get("received_at_ms") or 0),
                        index=int(fact_digest(fact)[:12], 16))
        self._dead_letter("expire", reason, origin)

    def ttl(self) -> str:
        return self._ttl

    # ------------------------------------------------------------------ by kind
    def _mark(self, part: int, name: str, now: int) -> None:
        self.store.put(part, Namespace.EXPIRED, name, now)
        self._markers.add((part, name))

    def _expire_marker(self, part: int, name: str, now: int) -> None:
        if self.clock.expired(self.store.get(part, Namespace.EXPIRED, name), now, expiry.MARKER):
            self.store.delete(part, Namespace.EXPIRED, name)

    def _expire_home(self, part: int, name: str, now: int) -> None:
        record = self.store.get(part, Namespace.HOME, name)
        if record is None or not self.clock.expired(record.get("touched_ms"), now, expiry.HOME):
            return
        for trajectory_id, data in record["t"].items():
            self._expire_trajectory(part, trajectory_id, TrajectoryRecord.from_json(data), now)
        for key in record["l"]:
            self._mark(part, key, now)
        self.store.delete(part, Namespace.HOME, name)

    def _expire_kept(self, part: int, trajectory_id: str, now: int) -> None:
        """A trajectory kept under its own hash (``T``); one in its home record goes with the home."""
        name = key_hash(trajectory_id)
        kept = self.store.get(part, Namespace.TRAJECTORY, name) or {}
        data = kept.get(trajectory_id)
        if data is None or not self.clock.expired(data.get("touched_ms"), now, expiry.TRAJECTORY):
            return
        self._expire_trajectory(part, trajectory_id, TrajectoryRecord.from_json(data), now)
        del kept[trajectory_id]
        if kept:
            self.store.put(part, Namespace.TRAJECTORY, name, kept)
        else:
            self.store.delete(part, Namespace.TRAJECTORY, name)

    def _expire_trajectory(self, part: int, trajectory_id: str, record: TrajectoryRecord, now: int) -> None:
        for n in range(record.chunks):
            self.store.delete(part, Namespace.CHUNK, chunk_name(trajectory_id, n))
        for step_id in record.steps:
            routable = id_tag(step_id) is not None
            if routable and self.store.get(part, Namespace.STEP_INDEX, step_id) == trajectory_id:
                self.store.delete(part, Namespace.STEP_INDEX, step_id)
        for waiting, fact in record.waiting_feedback():
            target = f"step {waiting}" if waiting is not None else "any of its steps"
            self.dead_letter_fact(part, fact, f"feedback for {target} of trajectory {trajectory_id}: the "
                                  f"step never arrived before the trajectory's state expired ({self._ttl})")
        self._forget_tree(trajectory_id)
        self._mark(part, trajectory_id, now)

    def _expire_target(self, part: int, target_id: str, now: int) -> None:
        data = self.store.get(part, Namespace.TARGET, target_id)
        if data is None or not self.clock.expired(data.get("touched_ms"), now, expiry.TARGET):
            return
        for held in TargetState.from_json(data).feedback:
            if held.step_id is None and held.refused is None:
                self._dead_letter("expire", f"feedback for {target_id}: no step with that id arrived before "
                                  f"its state expired ({self._ttl})", Origin.from_json(held.origin))
        self.store.delete(part, Namespace.TARGET, target_id)

    def _expire_held(self, part: int, step_id: str, now: int) -> None:
        data = self.store.get(part, Namespace.HELD, step_id)
        if data is None or isinstance(data, dict) and not self.clock.expired(data["touched_ms"], now,
                                                                             expiry.HELD):
            return
        for entry in held_entries(data):
            self._dead_letter("expire", f"feedback for step {step_id}: the step never arrived, or its "
                              f"trajectory's state had expired ({self._ttl})",
                              Origin.from_json(entry["origin"]))
        self.store.delete(part, Namespace.HELD, step_id)

    def _expire_group(self, part: int, scope_id: str, now: int) -> None:
        data = self.store.get(part, Namespace.GROUP, scope_id)
        if data is None or not self.clock.expired(data.get("touched_ms"), now, expiry.GROUP):
            return
        for n in range(GroupRecord.from_json(data).chunks):
            self.store.delete(part, Namespace.GROUP_CHUNK, chunk_name(scope_id, n))
        self.store.delete(part, Namespace.GROUP, scope_id)
        self._forget_tree(scope_id)
        self._mark(part, scope_id, now)


def held_entries(data: Any) -> list[dict[str, Any]]:
    """Held feedback of a step id: ``{"held": [...], "touched_ms": ...}``, or the bare list workers
    wrote before state expired."""
    if data is None:
        return []
    return list(data["held"]) if isinstance(data, dict) else list(data)
