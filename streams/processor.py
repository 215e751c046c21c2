"""The stream logic per event, between the state of one checkpoint (``store``) and what it publishes
(``outbox``); Kafka and Quix stay in ``clawr1.streams.app``.

Flow (``raw.*`` are the ingest topics, ``work`` is ``clawr1.internal.work``)::

    raw.llm, raw.events --link [L: per raw key]--> step facts --+
    raw.steps -------------------------------------> step facts --+--> join [T, C] --> steps
                                                                  |        +--> trajectory prefix tree [T]
                                                                  |        +--> group prefix tree [G, GC]
    raw.feedback --> by target: routable id -> [S, T, H] / index [X] --> join

Each arrow is a call when its key lives in the event's partition and a ``work`` message to that
partition otherwise. Where things live (``clawr1.core.routing``): a trajectory in ``home_partition`` of
its id, so a black-box call's trajectory sits beside its link state and a white-box one where its steps
arrive; a target id that is not routable in the partition its id hashes to.

State namespaces (``clawr1.streams.store``): ``R/<raw key hash>`` home records
(``clawr1.streams.home_record``): link state, and the trajectory while it is the link state's only one;
``T/<trajectory hash>`` the records (``clawr1.streams.trajectory_record``) of the other trajectories with
that hash; ``C/<trajectory>\\x1f<n>`` their chunks of step facts; ``S/<step id>`` the trajectory of a
routable step id a scan of ``R`` and ``T`` under its hash misses (a black-box call named by its
conversation, other than the call that started it, when its trajectory is not in the home record);
``L/<raw key>`` link state as workers before home records kept it; ``H/<step id>`` feedback that reached
a routable step id before its step; ``X/<target id>`` index entries and held feedback of other ids
(``clawr1.streams.targets``); ``G/<scope>`` and ``GC/<scope>\\x1f<n>`` prompt-group merge scopes;
``E/...`` the expiry wheel and ``Z/<name>`` what expired (``clawr1.streams.expiring``).

Delivery is exactly-once (outputs, state and input offsets commit in one Kafka transaction), so nothing
here is re-published for a crash's sake; a duplicate *input* (a client that sent the same step twice)
still changes nothing, as every state is a set of facts.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from clawr1.core.conversation import conversation_key
from clawr1.core.routing import (
    home_hash,
    home_partition,
    id_tag,
    key_hash,
    partition_of,
    partition_of_hash,
    trajectory_named_after,
)
from clawr1.prefix_tree import PrefixTree
from clawr1.streams import expiry, home_record, messages
from clawr1.streams.config import StreamConfig
from clawr1.streams.dead_letters import dead_letter
from clawr1.streams.expiring import SEP as _SEP
from clawr1.streams.expiring import Expiring, held_entries
from clawr1.streams.join import (
    StepState,
    apply_feedback,
    apply_step_fact,
    apply_supersede,
    build_step,
    displaced_terminals,
    effective_parent,
    mergeable,
    scope_of,
)
from clawr1.streams.linking import LinkState, after_expiry, link_turn, step_ids_of
from clawr1.streams.normalize import StepFact, step_from_whitebox, steps_from_turn
from clawr1.streams.origin import Origin
from clawr1.streams.outbox import Outbox
from clawr1.streams.prefix_scope import (
    Bounds,
    Merge,
    ScopeState,
    ScopeStep,
    TokensOf,
    entry_tokens,
    merge_step,
    rebuild,
    token_entry,
)
from clawr1.streams.rewards import fact_digest, feedback_fact
from clawr1.streams.store import Store
from clawr1.streams.targets import Refusal, Target, TargetState, add_feedback, add_target
from clawr1.streams.tokenization import Retokenizer
from clawr1.streams.trajectory_record import Chunk, Trajectory, TrajectoryRecord
from clawr1.streams.turns import TokenIds, Turn, turn_from_llm_call, turn_from_service_event

log = logging.getLogger(__name__)


class Processor:
    """Handles the events of one checkpoint; ``flush`` writes its state back before the commit."""

    def __init__(self, config: StreamConfig, partitions: int, store: Store, outbox: Outbox,
                 retokenizer: Retokenizer | None = None) -> None:
        self.config = config
        self.partitions = partitions
        self.store = store
        self.outbox = outbox
        self.retokenizer = retokenizer
        self.bounds = Bounds(config.max_scope_steps, config.max_scope_tokens)
        self.trees: OrderedDict[str, tuple[int, PrefixTree]] = OrderedDict()
        self._partition = 0
        self.origin: Origin | None = None
        self.clock = expiry.Clock(config.state_ttl_s * 1000, config.link_horizon_ms)
        self.expiring = Expiring(store, self.clock, self.dead_letter,
                                 lambda name: self.trees.pop(name, None), config.topics.raw_feedback,
                                 f"CLAWR1_STREAMS_STATE_TTL_S={config.state_ttl_s}")
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)  # the expiry clock (tests set it)
        self._visited: set[int] = set()  # partitions this checkpoint handled events of: they sweep
        # The checkpoint's decoded records; the dirty ones are written back by ``flush``.
        self._trajectories: dict[str, Trajectory] = {}
        # Where each trajectory's record was read from: (namespace, hash) of its R or T key, None if new.
        self._found_at: dict[str, tuple[str, str] | None] = {}
        self._arrivals: dict[str, list[str]] = {}  # trajectory -> steps first seen (routable ids)
        self._legacy_links: set[str] = set()  # link states read from ``L``, before home records
        self._links: dict[str, LinkState] = {}
        self._targets: dict[str, TargetState] = {}
        self._groups: dict[str, dict[str, Any]] = {}  # scope id -> {"scope", "where", "chunks"}
        self._open_groups: dict[str, int] = {}  # scope id -> the chunk this checkpoint adds tokens to
        self._dirty_trajectories: set[str] = set()
        self._dirty_links: set[str] = set()
        self._dirty_targets: set[str] = set()

    @property
    def partition(self) -> int:
        """The partition of the event being handled (where it came from, for dead letters)."""
        return self._partition

    @partition.setter
    def partition(self, value: int) -> None:
        self._partition = value
        self._visited.add(value)

    # ------------------------------------------------------------------ checkpoint
    def flush(self) -> int:
        """Put every record this checkpoint changed back into the store, let go of what expired, then
        write the store."""
        now = self.now_ms()
        for tid in self._dirty_trajectories:
            self._trajectories[tid].settle()
            self._trajectories[tid].record.touched_ms = now
        homes: set[tuple[int, str]] = set()  # home records changed
        for key in self._dirty_links:
            home = (partition_of(key, self.partitions), key_hash(key))
            record = self._home(home)
            if record is None:
                record = home_record.empty()
                self.store.put(home[0], "R", home[1], record)
            record["l"][key] = self._links[key].to_json()
            if key in self._legacy_links:
                self.store.delete(home[0], "L", key)
            homes.add(home)
        records: dict[tuple[int, str], dict[str, Any]] = {}  # T keys read, all written back
        soles: dict[tuple[int, str], str | None] = {}  # the one trajectory each home's link state names
        for home in list(homes):
            record = self._home(home)
            assert record is not None
            sole = self._sole(soles, home, record)
            for tid in [t for t in record["t"] if t != sole and t not in self._dirty_trajectories]:
                self._move_out(home, record, tid, record["t"][tid], records)
        for tid in self._dirty_trajectories:
            self._keep(tid, records, homes, soles)
        checks: list[tuple[int, expiry.Check]] = []
        for (part, name), value in records.items():
            if value:
                self.store.put(part, "T", name, value)
                checks += [(part, (expiry.TRAJECTORY, tid)) for tid in value]
            else:
                self.store.delete(part, "T", name)
        for home in homes:
            record = self._home(home)
            assert record is not None
            record["touched_ms"] = now
            self.store.put(home[0], "R", home[1], record)
            checks.append((home[0], (expiry.HOME, home[1])))
        for key in self._dirty_targets:
            part = self._target_partition(key)
            self.store.put(part, "X", key, {**self._targets[key].to_json(), "touched_ms": now})
            checks.append((part, (expiry.TARGET, key)))
        for scope_id, group in self._groups.items():
            part = home_partition(scope_id, self.partitions)
            group["touched_ms"] = now
            self.store.put(part, "G", scope_id, group)
            checks.append((part, (expiry.GROUP, scope_id)))
        self.expiring.schedule(checks, now)
        self.expiring.sweep(self._visited, now)
        written = self.store.flush()
        self.discard()
        return written

    def _home(self, home: tuple[int, str]) -> home_record.HomeRecord | None:
        record: home_record.HomeRecord | None = self.store.get(home[0], "R", home[1])
        return record

    def _t_record(self, records: dict[tuple[int, str], dict[str, Any]], part: int,
                  trajectory_id: str) -> dict[str, Any]:
        slot = (part, key_hash(trajectory_id))
        if slot not in records:
            records[slot] = self.store.get(part, "T", slot[1]) or {}
        return records[slot]

    def _keep(self, trajectory_id: str, records: dict[tuple[int, str], dict[str, Any]],
              homes: set[tuple[int, str]], soles: dict[tuple[int, str], str | None]) -> None:
        """Write a trajectory's record where it is kept now: in its home record while that record's link
        state names it alone, else under its own hash; index the steps a move hides from a scan."""
        home = (home_partition(trajectory_id, self.partitions), home_hash(trajectory_id))
        record = self._home(home)
        data = self._trajectories[trajectory_id].record.to_json()
        found_at = self._found_at.get(trajectory_id)
        if record is not None and self._sole(soles, home, record) == trajectory_id:
            record["t"][trajectory_id] = data
            homes.add(home)
            kept_under = home[1]
            if found_at is not None and found_at[0] == "T":  # moved in
                del self._t_record(records, home[0], trajectory_id)[trajectory_id]
                self._index(home[0], trajectory_id, data["steps"], kept_under, found_at[1])
        elif record is not None and found_at is not None and found_at[0] == "R":
            self._move_out(home, record, trajectory_id, data, records)
            homes.add(home)
            kept_under = key_hash(trajectory_id)
        else:
            self._t_record(records, home[0], trajectory_id)[trajectory_id] = data
            kept_under = key_hash(trajectory_id)
        self._index(home[0], trajectory_id, self._arrivals.get(trajectory_id, ()), kept_under, None)

    @staticmethod
    def _sole(soles: dict[tuple[int, str], str | None], home: tuple[int, str],
              record: home_record.HomeRecord) -> str | None:
        """The one trajectory the home's link state names, worked out once per flush."""
        if home not in soles:
            soles[home] = home_record.sole_trajectory(record)
        return soles[home]

    def _move_out(self, home: tuple[int, str], record: home_record.HomeRecord, trajectory_id: str,
                  data: dict[str, Any], records: dict[tuple[int, str], dict[str, Any]]) -> None:
        """A trajectory leaves its home record (its link state named a second one): kept under its own
        hash, with ``S`` entries for the steps a scan of the home record found."""
        del record["t"][trajectory_id]
        self._t_record(records, home[0], trajectory_id)[trajectory_id] = data
        self._index(home[0], trajectory_id, data["steps"], key_hash(trajectory_id), home[1])

    def _index(self, part: int, trajectory_id: str, step_ids: Any, kept_under: str,
               found_under: str | None) -> None:
        for step_id in home_record.index_entries(trajectory_id, step_ids, kept_under, found_under):
            self.store.put(part, "S", step_id, trajectory_id)

    def discard(self) -> None:
        """Forget the checkpoint's work (after its flush, or when it is thrown away)."""
        for cache in (self._trajectories, self._found_at, self._arrivals, self._links, self._targets,
                      self._groups, self._open_groups):
            cache.clear()
        for dirty in (self._dirty_trajectories, self._dirty_links, self._dirty_targets, self._legacy_links,
                      self._visited):
            dirty.clear()
        self.expiring.clear()
        self.store.clear()

    # ------------------------------------------------------------------ routing
    def _target_partition(self, target_id: str) -> int:
        return partition_of(target_id, self.partitions)

    def _dispatch(self, partition: int, key: str, message: dict[str, Any]) -> None:
        """Handle ``message`` now when its key lives in this partition, else send it there."""
        if partition == self.partition:
            self.on_work(key, message)
        else:
            self.outbox.send(partition, key, message)

    def to_trajectory(self, trajectory_id: str, message: dict[str, Any]) -> None:
        self._dispatch(home_partition(trajectory_id, self.partitions), trajectory_id, message)

    def to_target(self, target_id: str, message: dict[str, Any]) -> None:
        tag = id_tag(target_id)
        if tag is not None and message["kind"] == messages.FEEDBACK:
            self._dispatch(partition_of_hash(int(tag, 16), self.partitions), target_id,
                           {**message, "kind": messages.ROUTED_FEEDBACK})
        else:
            self._dispatch(self._target_partition(target_id), target_id, message)

    def dead_letter(self, stage: str, reason: str, origin: Origin) -> None:
        record = dead_letter(reason, stage, origin.topic, origin.partition, origin.offset, origin.key,
                             origin.original(), origin.timestamp_ms, origin.index)
        self.outbox.dead_letter(origin.topic.encode(), record)

    # ------------------------------------------------------------------ ingest
    def on_llm_call(self, key: str | None, record: dict[str, Any]) -> None:
        turn = turn_from_llm_call(record)
        link_key = key or turn.trajectory_id or record["conversation_key"] or conversation_key(turn.messages)
        self._link_and_publish(link_key, turn)

    def on_service_event(self, key: str | None, record: dict[str, Any]) -> None:
        turn = turn_from_service_event(record)
        if turn is not None:  # other event kinds are not steps; they stay on the raw topic
            self._link_and_publish(key or record["trajectory_id"], turn)

    def on_whitebox_step(self, record: dict[str, Any]) -> None:
        self._publish_fact(step_from_whitebox(record, self.retokenizer))

    def on_feedback(self, record: dict[str, Any], origin: Origin) -> None:
        fact = feedback_fact(record)
        if fact["target_kind"] == "trajectory":
            self.to_trajectory(fact["target_id"],
                               messages.message(messages.TRAJECTORY_FEEDBACK, feedback=fact))
        else:
            self.to_target(fact["target_id"], messages.message(messages.FEEDBACK, feedback=fact,
                                                               origin=origin.to_json()))

    def _link_state(self, key: str) -> LinkState:
        state = self._links.get(key)
        if state is None:
            part = partition_of(key, self.partitions)
            record = self._home((part, key_hash(key)))
            data = None if record is None else record["l"].get(key)
            if data is None:
                data = self.store.get(part, "L", key)  # kept by a worker before home records
                if data is not None:
                    self._legacy_links.add(key)
            state = LinkState.from_json(data)
            self._links[key] = state
        return state

    def _link_and_publish(self, key: str, turn: Turn) -> None:
        self._dirty_links.add(key)
        state = self._link_state(key)
        fresh = not state.assigned
        linked = link_turn(state, turn, self.config.link_horizon_ms, self.config.max_links_per_key,
                           self.config.group_window_ms)
        if fresh and self.expiring.expired_here(partition_of(key, self.partitions), key):
            linked = after_expiry(state, turn, linked)
        for fact in steps_from_turn(turn, linked.assignments, self.retokenizer):
            self._publish_fact(fact)
        if len(turn.replies) > 1 and turn.engine_response_id:  # the bare id names every choice
            for step_id, assignment in zip(step_ids_of(turn), linked.assignments, strict=True):
                self._publish_target(turn.engine_response_id, step_id,
                                     Target(assignment.trajectory_id, turn.created_at_ms, choice=True))
        for kind, decided in ((messages.SUPERSEDE, linked.superseded),
                              (messages.UNSUPERSEDE, linked.unsuperseded)):
            for step_id, trajectory_id in decided:
                self.to_trajectory(trajectory_id, messages.message(kind, step_id=step_id))
        if linked.continued is not None:
            c = linked.continued
            self._publish_target(c.response_id, c.step_id,
                                 Target(c.trajectory_id, c.created_at_ms, choice=True, continued=True))

    def _publish_fact(self, fact: StepFact) -> None:
        self.to_trajectory(fact.step["trajectory_id"], messages.message(messages.STEP, fact=fact.to_json()))
        step = fact.step
        target = Target(step["trajectory_id"], step["created_at_ms"])
        home = home_partition(step["trajectory_id"], self.partitions)
        for target_id in sorted({step["step_id"], step["response_id"]}):
            tag = id_tag(target_id)
            if tag is None or partition_of_hash(int(tag, 16), self.partitions) != home:
                self._publish_target(target_id, step["step_id"], target)

    def _publish_target(self, target_id: str, step_id: str, target: Target) -> None:
        self._dispatch(self._target_partition(target_id), target_id,
                       messages.message(messages.TARGET, step_id=step_id, target=target.__dict__))

    # ------------------------------------------------------------------ the worker's own messages
    def on_work(self, key: str, message: dict[str, Any]) -> None:
        kind = message["kind"]
        if kind in messages.TRAJECTORY_KINDS:
            self._on_trajectory_message(key, message)
        elif kind in (messages.TARGET, messages.FEEDBACK):
            self._resolve(key, message)
        elif kind == messages.ROUTED_FEEDBACK:
            self._resolve_routed(key, message)
        elif kind == messages.SCOPE_STEP:
            self._merge_group(ScopeStep.from_message({k: v for k, v in message.items() if k != "kind"}))
        elif kind == expiry.TICK:
            return  # it opened the checkpoint; its flush sweeps this partition
        else:
            raise ValueError(f"unknown internal message kind {kind!r}")

    # ------------------------------------------------------------------ targets
    def _target_state(self, key: str) -> TargetState:
        state = self._targets.get(key)
        if state is None:
            state = TargetState.from_json(self.store.get(self._target_partition(key), "X", key))
            self._targets[key] = state
        return state

    def _resolve(self, key: str, message: dict[str, Any]) -> None:
        state = self._target_state(key)
        window = self.config.feedback_window_ms
        if message["kind"] == messages.TARGET:
            target = Target(**message["target"])
            changed, forwards, refusals = add_target(state, key, message["step_id"], target, window)
        else:
            changed, forwards, refusals = add_feedback(state, key, message["feedback"], message["origin"],
                                                       window)
        if changed:
            self._dirty_targets.add(key)
        for forward in forwards:
            self.to_trajectory(forward.trajectory_id, messages.message(
                messages.STEP_FEEDBACK, step_id=forward.step_id, feedback=forward.feedback))
        for refusal in refusals:
            self._refuse(refusal)

    def _refuse(self, refusal: Refusal) -> None:
        """Feedback that names no single step: a dead letter citing the raw feedback event."""
        self.dead_letter("join", refusal.reason, Origin.from_json(refusal.origin))

    def _locate(self, step_id: str) -> str | None:
        """The trajectory holding a routable step id, in this partition: the trajectory named after it (a
        call that started one), else from ``S`` for ids named after their call, else among the trajectories
        whose hash the id carries."""
        namesake = trajectory_named_after(step_id)
        if step_id in self._trajectory(namesake).record.steps:
            return namesake
        mapped = self.store.get(self.partition, "S", step_id)
        if mapped is not None:
            return str(mapped)
        tag = id_tag(step_id) or ""
        home = self._home((self.partition, tag))
        for tid in sorted([*(home["t"] if home else ()), *(self.store.get(self.partition, "T", tag) or {})]):
            if step_id in self._trajectory(tid).record.steps:
                return tid
        for tid, trajectory in self._trajectories.items():  # arrived in this checkpoint, not yet indexed
            if tag in (key_hash(tid), home_hash(tid)) and step_id in trajectory.record.steps:
                return tid
        return None

    def _resolve_routed(self, step_id: str, message: dict[str, Any]) -> None:
        trajectory_id = self._locate(step_id)
        if trajectory_id is not None:
            self.to_trajectory(trajectory_id, messages.message(
                messages.STEP_FEEDBACK, step_id=step_id, feedback=message["feedback"]))
            return
        held = held_entries(self.store.get(self.partition, "H", step_id))
        digest = fact_digest(message["feedback"])
        if all(fact_digest(h["feedback"]) != digest for h in held):
            held.append({"feedback": message["feedback"], "origin": message["origin"]})
            self.store.put(self.partition, "H", step_id, {"held": held, "touched_ms": self.now_ms()})
            self.expiring.held.add((self.partition, step_id))

    # ------------------------------------------------------------------ join
    def _trajectory(self, trajectory_id: str) -> Trajectory:
        cached = self._trajectories.get(trajectory_id)
        if cached is not None:
            return cached
        part = home_partition(trajectory_id, self.partitions)
        found_at: tuple[str, str] | None = ("R", home_hash(trajectory_id))
        home = self._home((part, home_hash(trajectory_id)))
        data = None if home is None else home["t"].get(trajectory_id)
        if data is None:
            found_at = ("T", key_hash(trajectory_id))
            data = (self.store.get(part, "T", found_at[1]) or {}).get(trajectory_id)
            if data is None:
                found_at = None
        self._found_at[trajectory_id] = found_at
        record = TrajectoryRecord.from_json(data)
        if found_at is None and self.expiring.expired_here(part, trajectory_id):
            record.after_expiry = True

        def load(n: int) -> Chunk | None:
            chunk: Chunk | None = self.store.get(part, "C", f"{trajectory_id}{_SEP}{n}")
            return chunk

        def new(n: int) -> Chunk:
            chunk: Chunk = {}
            self.store.put(part, "C", f"{trajectory_id}{_SEP}{n}", chunk)
            return chunk

        trajectory = Trajectory(trajectory_id, record, load, new)
        self._trajectories[trajectory_id] = trajectory
        return trajectory

    def _on_trajectory_message(self, trajectory_id: str, message: dict[str, Any]) -> None:
        trajectory = self._trajectory(trajectory_id)
        kind = message["kind"]
        if trajectory.record.after_expiry and self._late_feedback(trajectory, message):
            return
        self._dirty_trajectories.add(trajectory_id)
        if kind == messages.STEP:
            self._on_step_fact(trajectory, StepFact.from_json(message["fact"]))
        elif kind == messages.TRAJECTORY_FEEDBACK:
            apply_feedback(trajectory.state.feedback, message["feedback"])
            for step_id in trajectory.state.step_ids():
                self._emit(trajectory, trajectory.step_state(step_id), to_scope=False)
        else:
            step_id = message["step_id"]
            state = trajectory.step_state(step_id)
            if kind in (messages.SUPERSEDE, messages.UNSUPERSEDE):
                changed = apply_supersede(state, revive=kind == messages.UNSUPERSEDE)
            else:
                changed = apply_feedback(state.feedback, message["feedback"])
            if changed:
                trajectory.store(step_id, state, base_changed=False)
            self._emit(trajectory, state, to_scope=False)

    def _late_feedback(self, trajectory: Trajectory, message: dict[str, Any]) -> bool:
        """Feedback for a trajectory whose state expired, naming a step this worker no longer holds: a
        dead letter saying so (the step's last version in the pool stays as it was)."""
        kind = message["kind"]
        if kind == messages.TRAJECTORY_FEEDBACK:
            missing = not any(e.chunk is not None for e in trajectory.record.steps.values())
            target = "the trajectory"
        elif kind == messages.STEP_FEEDBACK:
            entry = trajectory.record.steps.get(message["step_id"])
            missing = entry is None or entry.chunk is None
            target = f"step {message['step_id']}"
        else:
            return False
        if missing:
            self.expiring.dead_letter_fact(self.partition, message["feedback"],
                                           f"feedback for {target} of trajectory {trajectory.id}, whose "
                                           f"state had expired ({self.expiring.ttl()}): not joined")
        return missing

    def _on_step_fact(self, trajectory: Trajectory, fact: StepFact) -> None:
        step_id = fact.step["step_id"]
        state = trajectory.step_state(step_id)
        # Steps at the next index may take this one as their parent (found by index).
        children = [trajectory.step_state(c) for c in trajectory.state.at(fact.step["step_index"] + 1)]
        children = [c for c in children if c.base is not None and c.base["parent_step_id"] is None]
        before = [_scope_signature(c, trajectory) for c in [state, *children]]
        known = step_id in trajectory.record.steps
        new = apply_step_fact(state, trajectory.state, fact)
        if new:
            trajectory.store(step_id, state, base_changed=state.base is fact.step)
        if not known:
            self._arrived(trajectory, step_id, state)
        for displaced in displaced_terminals(trajectory.state, fact.step["step_index"]):  # lost the mark
            self._emit(trajectory, trajectory.step_state(displaced), to_scope=False)
        for step, step_before in zip([state, *children], before, strict=True):
            changed = step_before != _scope_signature(step, trajectory)
            self._emit(trajectory, step, to_scope=changed or not new)

    def _arrived(self, trajectory: Trajectory, step_id: str, state: StepState) -> None:
        """A step seen for the first time: make its routable id findable, take feedback that came first."""
        if id_tag(step_id) is None:
            return
        self._arrivals.setdefault(trajectory.id, []).append(step_id)  # indexed by the flush if need be
        held = held_entries(self.store.get(self.partition, "H", step_id))
        if held:
            for entry in held:
                apply_feedback(state.feedback, entry["feedback"])
            trajectory.store(step_id, state, base_changed=False)
            self.store.delete(self.partition, "H", step_id)

    def _emit(self, trajectory: Trajectory, state: StepState, to_scope: bool) -> None:
        """Publish the step's current version, and its tokens to its merge scope when asked."""
        record = build_step(state, trajectory.state, self.config.readiness)
        if record is None:
            return
        self.outbox.step(record)
        if not (to_scope and mergeable(record)):
            return
        scope_id, scope_kind = scope_of(record)
        scope_step = ScopeStep(scope_id, scope_kind, record["step_id"], record["prompt_token_ids"],
                               record["response_token_ids"], record["parent_step_id"],
                               record["created_at_ms"])
        if scope_kind == "trajectory":
            self._merge_trajectory(trajectory, scope_step)
        else:
            self._dispatch(home_partition(scope_id, self.partitions), scope_id,
                           messages.message(messages.SCOPE_STEP, **scope_step.to_message()))

    # ------------------------------------------------------------------ prefix trees
    def _tree(self, scope_id: str, state: ScopeState, tokens_of: TokensOf) -> PrefixTree:
        """The scope's tree: from the cache when it matches the stored state, else rebuilt from it."""
        cached = self.trees.pop(scope_id, None)  # put back after a successful merge only
        if cached is not None and cached[0] == state.version and len(cached[1]) == len(state.steps):
            return cached[1]
        return rebuild(state, tokens_of)

    def _merged(self, scope_id: str, state: ScopeState, tree: PrefixTree, merge: Merge) -> None:
        self.trees[scope_id] = (state.version, tree)
        while len(self.trees) > self.config.tree_cache_size:
            self.trees.popitem(last=False)
        for row in merge.rows:
            self.outbox.prefix_node(row)

    def _merge_trajectory(self, trajectory: Trajectory, step: ScopeStep) -> None:
        """A trajectory's scope lives in its record; a failed merge is the prefix stage's dead letter."""
        if trajectory.record.after_expiry:
            return  # the pool holds the tree of the state that expired; a new one would contradict it
        try:
            record = trajectory.record
            state = record.scope or ScopeState()
            tree = self._tree(step.scope_id, state, lambda step_id, _tree: trajectory.tokens_of(step_id))
            merge = merge_step(state, tree, step, self.bounds)
            record.scope = state
            self._merged(step.scope_id, state, tree, merge)
        except Exception as exc:  # noqa: BLE001 - the step itself was published; only its merge failed
            log.exception("prefix merge of %s failed", step.step_id)
            if self.origin is not None:
                self.dead_letter("prefix", f"{type(exc).__name__}: {exc}", self.origin)

    def _merge_group(self, step: ScopeStep) -> None:
        part = home_partition(step.scope_id, self.partitions)
        group = self._groups.get(step.scope_id)
        if group is None:
            group = self.store.get(part, "G", step.scope_id)
            if group is None:
                group = {"scope": None, "where": {}, "chunks": 0}
                if self.expiring.expired_here(part, step.scope_id):
                    group["after_expiry"] = True
            self._groups[step.scope_id] = group
        if group.get("after_expiry"):
            return  # as for a trajectory (``_merge_trajectory``)
        state = ScopeState.from_json(group["scope"])

        def chunk_name(n: int) -> str:
            return f"{step.scope_id}{_SEP}{n}"

        def tokens_of(step_id: str, tree: PrefixTree) -> tuple[TokenIds, TokenIds] | None:
            n = group["where"].get(step_id)
            chunk = None if n is None else self.store.get(part, "GC", chunk_name(n))
            entry = None if chunk is None else chunk.get(step_id)
            return None if entry is None else entry_tokens(entry, tree)

        tree = self._tree(step.scope_id, state, tokens_of)
        merge = merge_step(state, tree, step, self.bounds)
        if merge.outcome == "added":
            n = self._open_groups.get(step.scope_id)
            if n is None:
                n = self._open_groups[step.scope_id] = group["chunks"]
                group["chunks"] += 1
                self.store.put(part, "GC", chunk_name(n), {})
            base = step.parent_step_id if step.parent_step_id in tree else state.steps[0]
            self.store.get(part, "GC", chunk_name(n))[step.step_id] = token_entry(tree, step, base)
            group["where"][step.step_id] = n
        group["scope"] = state.to_json()
        self._merged(step.scope_id, state, tree, merge)


def _scope_signature(state: StepState, trajectory: Trajectory) -> tuple[str, str | None] | None:
    """What a step's prefix-tree entry depends on (its fact and its parent); a change means re-merge."""
    if state.base is None:
        return None
    return state.base_digest, effective_parent(state.base, trajectory.state)
