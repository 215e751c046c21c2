"""The stream logic per event, between the state of one checkpoint (``store``) and what it publishes
(``outbox``); Kafka and Quix stay in ``clawr1.streams.app``.

Flow (``raw.*`` are the ingest topics, ``work`` is ``clawr1.internal.work``; in brackets the state
namespaces each stage keeps, ``clawr1.streams.namespaces``)::

    raw.llm, raw.events --link [HOME]--> step facts --+
    raw.steps -------------------------> step facts --+--> join [HOME/TRAJECTORY, CHUNK] --> steps
                                                      |  ^ a step naming a prompt group: its owner [GROUP]
                                                      |        +--> trajectory prefix tree [its record]
                                                      |        +--> group prefix tree [GROUP, GROUP_CHUNK]
    raw.feedback --> by target: routable id -> [STEP_INDEX, HELD] / index [TARGET] --> join

A step naming a prompt group passes the group's owner first, in the group's partition (when its source
is a named one: keyless steps go straight on), so that the owner decides which group it joins before
the step is published (``clawr1.streams.ownership``).

Each arrow is a call when its key lives in the event's partition and a ``work`` message to that
partition otherwise. Where things live (``clawr1.core.routing``): a trajectory in ``home_partition`` of
its id, so a black-box call's trajectory sits beside its link state and a white-box one where its steps
arrive; a target id that is not routable in the partition its id hashes to. This module handles the
events; ``clawr1.streams.placement`` reads the records and writes back the changed ones, and
``clawr1.streams.scope_merger`` keeps the prefix trees.

Delivery is exactly-once (outputs, state and input offsets commit in one Kafka transaction), so nothing
here is re-published for a crash's sake; a duplicate *input* (a client that sent the same step twice)
still changes nothing, as every state is a set of facts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from clawr1.core.conversation import conversation_key
from clawr1.core.routing import home_partition, id_tag, partition_of, partition_of_hash
from clawr1.gateway.auth import ANONYMOUS
from clawr1.streams import expiry, messages, ownership
from clawr1.streams.config import StreamConfig
from clawr1.streams.dead_letters import dead_letter
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
from clawr1.streams.linking import after_expiry, link_turn, step_ids_of
from clawr1.streams.namespaces import Namespace
from clawr1.streams.normalize import StepFact, step_from_whitebox, steps_from_turn, wire_fact
from clawr1.streams.origin import Origin
from clawr1.streams.outbox import Outbox
from clawr1.streams.placement import Placement
from clawr1.streams.prefix_scope import Bounds, ScopeStep
from clawr1.streams.rewards import fact_digest, feedback_fact
from clawr1.streams.scope_merger import ScopeMerger
from clawr1.streams.store import Store
from clawr1.streams.targets import Refusal, Target, add_feedback, add_target
from clawr1.streams.tokenization import Retokenizer
from clawr1.streams.trajectory_record import Trajectory
from clawr1.streams.tree_cache import TreeCache
from clawr1.streams.turns import Turn, turn_from_llm_call, turn_from_service_event

log = logging.getLogger(__name__)


class Processor:
    """Handles the events of one checkpoint; ``flush`` writes its state back before the commit.

    Each handler is given its event's ``Origin``: the event's partition (where the keys it touches
    live, unless routed elsewhere) and what a dead letter about it cites."""

    def __init__(self, config: StreamConfig, partitions: int, store: Store, outbox: Outbox,
                 retokenizer: Retokenizer | None = None) -> None:
        self.config = config
        self.partitions = partitions
        self.store = store
        self.outbox = outbox
        self.retokenizer = retokenizer
        self.clock = expiry.Clock(config.state_ttl_s * 1000, config.link_horizon_ms)
        trees = TreeCache(config.tree_cache_size)
        ttl_setting = f"CLAWR1_STREAMS_STATE_TTL_S={config.state_ttl_s}"  # named in dead letters
        self.expiring = Expiring(store, self.clock, self.dead_letter, trees.forget,
                                 config.topics.raw_feedback, ttl_setting)
        self.records = Placement(store, partitions, self.expiring)
        self.merges = ScopeMerger(store, partitions, outbox, self.expiring, trees,
                                  Bounds(config.max_scope_steps, config.max_scope_tokens), self.dead_letter)
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)  # the expiry clock (tests set it)
        self._event: Origin  # the event being handled (``_begin``)
        self._visited: set[int] = set()  # partitions this checkpoint handled events of: they sweep

    def _begin(self, event: Origin) -> None:
        self._event = event
        self._visited.add(event.partition)

    @property
    def _partition(self) -> int:
        """The partition of the event being handled."""
        return self._event.partition

    # ------------------------------------------------------------------ checkpoint
    def flush(self) -> int:
        """Put every record this checkpoint changed back into the store, let go of what expired, then
        write the store."""
        now = self.now_ms()
        checks = self.records.write_back(now) + self.merges.write_back(now)
        self.expiring.schedule(checks, now)
        self.expiring.sweep(self._visited, now)
        written = self.store.flush()
        self.discard()
        return written

    def discard(self) -> None:
        """Forget the checkpoint's work (after its flush, or when it is thrown away)."""
        self.records.discard()
        self.merges.discard()
        self._visited.clear()
        self.expiring.clear()
        self.store.clear()

    # ------------------------------------------------------------------ routing
    def _target_partition(self, target_id: str) -> int:
        return partition_of(target_id, self.partitions)

    def _dispatch(self, partition: int, key: str, message: dict[str, Any]) -> None:
        """Handle ``message`` now when its key lives in the event's partition, else send it there."""
        if partition == self._partition:
            self._on_work(key, message)
        else:
            if "fact" in message:  # a step or group step: its arrays packed for the way
                message = {**message, "fact": wire_fact(message["fact"])}
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
    def on_llm_call(self, key: str | None, record: dict[str, Any], origin: Origin) -> None:
        self._begin(origin)
        turn = turn_from_llm_call(record)
        link_key = key or turn.trajectory_id or record["conversation_key"] or conversation_key(turn.messages)
        self._link_and_publish(link_key, turn)

    def on_service_event(self, key: str | None, record: dict[str, Any], origin: Origin) -> None:
        self._begin(origin)
        turn = turn_from_service_event(record)
        if turn is not None:  # other event kinds are not steps; they stay on the raw topic
            self._link_and_publish(key or record["trajectory_id"], turn)

    def on_whitebox_step(self, record: dict[str, Any], origin: Origin) -> None:
        self._begin(origin)
        self._publish_fact(step_from_whitebox(record, self.retokenizer))

    def on_feedback(self, record: dict[str, Any], origin: Origin) -> None:
        self._begin(origin)
        fact = feedback_fact(record)
        if fact["target_kind"] == "trajectory":
            self.to_trajectory(fact["target_id"],
                               messages.message(messages.TRAJECTORY_FEEDBACK, feedback=fact))
        else:
            self.to_target(fact["target_id"], messages.message(messages.FEEDBACK, feedback=fact,
                                                               origin=origin.to_json()))

    def _link_and_publish(self, key: str, turn: Turn) -> None:
        self.records.link_changed(key)
        state = self.records.link_state(key)
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
                self.to_trajectory(trajectory_id, messages.message(kind, step_id=step_id,
                                                                   source=turn.source_name))
        if linked.continued is not None:
            c = linked.continued
            self._publish_target(c.response_id, c.step_id,
                                 Target(c.trajectory_id, c.created_at_ms, choice=True, continued=True))

    def _publish_fact(self, fact: StepFact) -> None:
        step = fact.step
        group_id = step["prompt_group_id"]
        if group_id and step["source_name"] != ANONYMOUS:  # its group's owner decides first (keyless: none)
            self._dispatch(home_partition(group_id, self.partitions), group_id,
                           messages.message(messages.GROUP_STEP, fact=fact.to_json()))
        else:
            self.to_trajectory(step["trajectory_id"], messages.message(messages.STEP, fact=fact.to_json()))
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
    def on_work(self, key: str, message: dict[str, Any], origin: Origin) -> None:
        self._begin(origin)
        self._on_work(key, message)

    def _on_work(self, key: str, message: dict[str, Any]) -> None:
        kind = message["kind"]
        if kind in messages.TRAJECTORY_KINDS:
            self._on_trajectory_message(key, message)
        elif kind in (messages.TARGET, messages.FEEDBACK):
            self._resolve(key, message)
        elif kind == messages.ROUTED_FEEDBACK:
            self._resolve_routed(key, message)
        elif kind == messages.GROUP_STEP:
            self._on_group_step(key, message)
        elif kind == messages.SCOPE_STEP:
            self.merges.merge_group(ScopeStep.from_message({k: v for k, v in message.items() if k != "kind"}))
        elif kind == expiry.TICK:
            return  # it opened the checkpoint; its flush sweeps this partition
        else:
            raise ValueError(f"unknown internal message kind {kind!r}")

    # ------------------------------------------------------------------ targets
    def _resolve(self, key: str, message: dict[str, Any]) -> None:
        state = self.records.target_state(key)
        window = self.config.feedback_window_ms
        if message["kind"] == messages.TARGET:
            target = Target(**message["target"])
            changed, forwards, refusals = add_target(state, key, message["step_id"], target, window)
        else:
            changed, forwards, refusals = add_feedback(state, key, message["feedback"], message["origin"],
                                                       window)
        if changed:
            self.records.target_changed(key)
        for forward in forwards:
            self.to_trajectory(forward.trajectory_id, messages.message(
                messages.STEP_FEEDBACK, step_id=forward.step_id, feedback=forward.feedback))
        for refusal in refusals:
            self._refuse(refusal)

    def _refuse(self, refusal: Refusal) -> None:
        """Feedback that names no single step: a dead letter citing the raw feedback event."""
        self.dead_letter("join", refusal.reason, Origin.from_json(refusal.origin))

    def _resolve_routed(self, step_id: str, message: dict[str, Any]) -> None:
        trajectory_id = self.records.locate(self._partition, step_id)
        if trajectory_id is not None:
            self.to_trajectory(trajectory_id, messages.message(
                messages.STEP_FEEDBACK, step_id=step_id, feedback=message["feedback"]))
            return
        held = held_entries(self.store.get(self._partition, Namespace.HELD, step_id))
        digest = fact_digest(message["feedback"])
        if all(fact_digest(h["feedback"]) != digest for h in held):
            held.append({"feedback": message["feedback"], "origin": message["origin"]})
            entry = {"held": held, "touched_ms": self.now_ms()}
            self.store.put(self._partition, Namespace.HELD, step_id, entry)
            self.expiring.held.add((self._partition, step_id))

    # ------------------------------------------------------------------ prompt groups
    def _on_group_step(self, group_id: str, message: dict[str, Any]) -> None:
        """A step naming a prompt group, in the group's partition: to its trajectory when the group is its
        source's (the first step naming it names the owner), else to the group of its own
        (``clawr1.streams.ownership``); a dead letter when that too is another's."""
        fact = message["fact"]
        step = fact["step"]
        source = step["source_name"]
        owner = self.merges.claim(group_id, source, self.now_ms())
        if ownership.may_write(owner, source):
            self.to_trajectory(step["trajectory_id"], messages.message(messages.STEP, fact=fact))
            return
        named = message.get("named")
        if named is None:
            own = ownership.own_group(group_id, source)
            moved = {**fact, "step": {**step, "prompt_group_id": own}}
            self._dispatch(home_partition(own, self.partitions), own,
                           messages.message(messages.GROUP_STEP, fact=moved, named=[group_id, owner]))
            return
        topic = getattr(self.config.topics, _RAW_TOPIC.get(step["source_kind"], "raw_events"))
        reason = ownership.group_refusal(step["step_id"], source, (named[0], named[1]), (group_id, owner))
        original = StepFact.from_json({**fact, "step": {**step, "prompt_group_id": named[0]}})  # as it came
        self._not_joined(topic, step["trajectory_id"], original.to_json(), int(step["updated_at_ms"]), reason)

    # ------------------------------------------------------------------ join
    def _on_trajectory_message(self, trajectory_id: str, message: dict[str, Any]) -> None:
        trajectory = self.records.trajectory(trajectory_id)
        kind = message["kind"]
        if trajectory.record.after_expiry and self._late_feedback(trajectory, message):
            return
        self.records.trajectory_changed(trajectory_id)
        if kind == messages.STEP:
            fact = StepFact.from_json(message["fact"])
            if self._may_join(trajectory, fact):
                self._on_step_fact(trajectory, fact)
        elif kind == messages.TRAJECTORY_FEEDBACK:
            if not self._counts(trajectory, message["feedback"]):
                return
            apply_feedback(trajectory.state.feedback, message["feedback"])
            for step_id in trajectory.state.step_ids():
                self._emit(trajectory, trajectory.step_state(step_id), to_scope=False)
        else:
            step_id = message["step_id"]
            state = trajectory.step_state(step_id)
            if kind in (messages.SUPERSEDE, messages.UNSUPERSEDE):
                source = message.get("source")  # absent in messages of workers before owners
                if source is not None and not ownership.may_write(trajectory.record.owner, source):
                    log.warning("%s of step %s ignored: a call of %r decided it, trajectory %s belongs to %r",
                                kind, step_id, source, trajectory_id, trajectory.record.owner)
                    return
                changed = apply_supersede(state, revive=kind == messages.UNSUPERSEDE)
            elif self._counts(trajectory, message["feedback"]):
                changed = apply_feedback(state.feedback, message["feedback"])
            else:
                return
            if changed:
                trajectory.store(step_id, state, base_changed=False)
            self._emit(trajectory, state, to_scope=False)

    # ------------------------------------------------------------------ ownership
    def _may_join(self, trajectory: Trajectory, fact: StepFact) -> bool:
        """Whether the step may join (``clawr1.streams.ownership``): the first step names the owner and
        holds the feedback that came before it to the rule; a step of another source is a dead letter."""
        record, source = trajectory.record, fact.step["source_name"]
        if record.owner is None:
            record.owner = source
            if not any(entry.chunk is not None for entry in record.steps.values()):
                self._hold_to_owner(trajectory)
            return True
        if ownership.may_write(record.owner, source):
            return True
        topic = getattr(self.config.topics, _RAW_TOPIC.get(fact.step["source_kind"], "raw_events"))
        reason = ownership.refusal(record.owner, source, f"step {fact.step['step_id']}", trajectory.id)
        self._not_joined(topic, trajectory.id, fact.to_json(), int(fact.step["updated_at_ms"]), reason)
        return False

    def _counts(self, trajectory: Trajectory, feedback: dict[str, Any]) -> bool:
        """Whether feedback may join; a dead letter when not. Before the first step it waits."""
        owner = trajectory.record.owner
        if ownership.counts(owner, feedback):
            return True
        assert owner is not None  # counts() holds without an owner
        self._refuse_feedback(trajectory, feedback)
        return False

    def _refuse_feedback(self, trajectory: Trajectory, feedback: dict[str, Any]) -> None:
        owner = trajectory.record.owner
        assert owner is not None
        what = f"feedback {feedback['feedback_id']} ({feedback['target_kind']} {feedback['target_id']})"
        self._not_joined(self.config.topics.raw_feedback, feedback["target_id"], feedback,
                         int(feedback["received_at_ms"]),
                         ownership.refusal(owner, feedback["source_name"], what, trajectory.id))

    def _hold_to_owner(self, trajectory: Trajectory) -> None:
        """Feedback that came before the trajectory's first step, now that it has an owner: what does not
        count leaves (as dead letters)."""
        trajectory.state.feedback[:] = self._kept(trajectory, trajectory.state.feedback)
        for entry in trajectory.record.steps.values():
            entry.feedback = self._kept(trajectory, entry.feedback)

    def _kept(self, trajectory: Trajectory, facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The facts that count; the others become dead letters."""
        kept = []
        for fact in facts:
            if ownership.counts(trajectory.record.owner, fact):
                kept.append(fact)
            else:
                self._refuse_feedback(trajectory, fact)
        return kept

    def _not_joined(self, topic: str, key: str, fact: dict[str, Any], at_ms: int, reason: str) -> None:
        """A dead letter citing the fact itself (the raw event may be a whole envelope, or gone)."""
        origin = Origin(topic, self._partition, -1, key.encode(),
                        orjson.dumps(fact, option=orjson.OPT_SERIALIZE_NUMPY), at_ms,
                        index=int(fact_digest(fact)[:12], 16))
        self.dead_letter("join", reason, origin)

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
            self.expiring.dead_letter_fact(self._partition, message["feedback"],
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
        self.records.step_arrived(trajectory.id, step_id)
        held = held_entries(self.store.get(self._partition, Namespace.HELD, step_id))
        if held:
            for entry in held:
                if self._counts(trajectory, entry["feedback"]):
                    apply_feedback(state.feedback, entry["feedback"])
            trajectory.store(step_id, state, base_changed=False)
            self.store.delete(self._partition, Namespace.HELD, step_id)

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
            self.merges.merge_trajectory(trajectory, scope_step, self._event)
        else:
            self._dispatch(home_partition(scope_id, self.partitions), scope_id,
                           messages.message(messages.SCOPE_STEP, **scope_step.to_message()))


# Where a step fact's raw event came from, by its source kind (for a dead letter citing the fact).
_RAW_TOPIC = {"whitebox_agent": "raw_steps", "blackbox_agent": "raw_llm"}


def _scope_signature(state: StepState, trajectory: Trajectory) -> tuple[str, str | None] | None:
    """What a step's prefix-tree entry depends on (its fact and its parent); a change means re-merge."""
    if state.base is None:
        return None
    return state.base_digest, effective_parent(state.base, trajectory.state)
