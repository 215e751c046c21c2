"""The Faust app: thin agents that move bytes between topics and tables around the pure logic.

Flow (every arrow a Kafka topic, every box one agent; tables in brackets)::

    raw.llm ----> ingest_llm    [links: per raw key] --+--> internal.trajectories (key trajectory)
    raw.events -> ingest_events [links]               -+--> internal.targets (packed per partition of
                                                                                step / response id)
    raw.steps --> ingest_steps (joins in place when keyed by its trajectory) -+
    raw.feedback -> ingest_feedback --> internal.targets, or internal.trajectories (trajectory rewards)
    internal.targets --> resolve_targets [targets: per target id] --> internal.trajectories
    internal.trajectories --> join [join_steps, join_trajectories] --> steps, and trajectory scopes
                              merged in place [scopes, scope_steps]; prompt groups --> internal.scopes
    internal.scopes --> merge_prefixes [scopes, scope_steps] --> prefix_nodes
    any agent --> dlq (events it cannot use, with the reason; feedback no single step takes)

The ingest agents take events in batches (``CLAWR1_STREAMS_BATCH``), and Faust acks a batch only once it
is handled; its index entries for the targets table leave as one message per partition, before the acks.

Co-partitioning: all topics and changelogs have ``config.partitions`` partitions and every key is
hashed with murmur2, so a table key always lives in the partition of the events that touch it.
That is also what lets a hop be skipped: a white-box step keyed by its trajectory is already in its
join's partition, and a trajectory's merge scope (keyed by the trajectory id) is in the join's.
Delivery is at-least-once: outputs are deterministic (ids, versions, dead letters), and every
agent re-publishes what a re-delivered event produced, so a crash between a table write and an
output loses nothing and duplicates nothing the pool keeps.
"""

from __future__ import annotations

import base64
import logging
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, cast

import faust
from faust.streams import _current_event

from clawr1.core import topics
from clawr1.core.conversation import conversation_key
from clawr1.core.metrics import (
    STREAM_DEAD_LETTERS,
    STREAM_EVENTS_IN,
    STREAM_EVENTS_OUT,
    STREAM_SKIPS_RECOVERED,
    STREAM_TAILS_REFETCHED,
)
from clawr1.prefix_tree import PrefixTree
from clawr1.schemas.codec import DecodeError, codec_for
from clawr1.streams import messages
from clawr1.streams.config import StreamConfig
from clawr1.streams.dead_letters import dead_letter
from clawr1.streams.gaps import EventLike, GapGuard, KafkaReader
from clawr1.streams.held_tables import HOLDING, HeldTable
from clawr1.streams.join import (
    StepState,
    TrajectoryState,
    apply_feedback,
    apply_step_fact,
    apply_supersede,
    build_step,
    displaced_terminals,
    effective_parent,
    mergeable,
    scope_of,
)
from clawr1.streams.linking import LinkState, link_turn, step_ids_of
from clawr1.streams.normalize import StepFact, step_from_whitebox, steps_from_turn
from clawr1.streams.prefix_scope import Bounds, ScopeState, ScopeStep, merge_step, rebuild
from clawr1.streams.rewards import feedback_fact
from clawr1.streams.targets import Refusal, Target, TargetState, add_feedback, add_target
from clawr1.streams.tokenization import Retokenizer
from clawr1.streams.turns import InvalidEvent, Turn, turn_from_llm_call, turn_from_service_event

log = logging.getLogger(__name__)

# How often, and after how long idle, an agent's partitions are checked for a dropped tail.
TAIL_CHECK_S = 1.0
TAIL_IDLE_S = 2.0
# The event a handler is working on (a dead letter cites it), and its agent's batch of index entries.
_HANDLING: ContextVar[EventLike] = ContextVar("clawr1_handling")
_OUTBOX: ContextVar[list[tuple[str, dict[str, Any]]]] = ContextVar("clawr1_outbox")
_SEP = "\x1f"  # joins a scope / trajectory id and a step id into one table key


def _text(key: bytes | None) -> str | None:
    return None if key is None else key.decode("utf-8", "backslashreplace")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class StreamsApp:
    """One Faust app per ``StreamConfig``; workers with the same ``app_id`` split the partitions."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.codec = codec_for(config.schema_registry_url)
        self.retokenizer = Retokenizer.load(config.tokenizer) if config.tokenizer else None
        self.bounds = Bounds(config.max_scope_steps, config.max_scope_tokens)
        self.trees: OrderedDict[str, tuple[int, PrefixTree]] = OrderedDict()
        # Faust's consumer group is named after the app id: the guard reads that group's offsets.
        self.gaps = GapGuard(lambda: KafkaReader(config.bootstrap, config.app_id))
        self.app = faust.App(
            config.app_id,
            broker=[f"kafka://{host.strip()}" for host in config.bootstrap.split(",")],
            store="memory://",
            datadir=str(config.data_dir / config.app_id),
            autodiscover=False,
            topic_partitions=config.partitions,
            topic_replication_factor=config.replication,
            topic_disable_leader=True,
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            # Gather sends per partition for a while, compressed: a step's outputs go to as many
            # partitions, so a few ms of linger sent requests of one record each; table changelogs and
            # step records repeat field names and token ids, and lz4 costs less CPU than sending them bare.
            producer_linger=config.linger_ms / 1000,
            producer_compression_type="lz4",
            producer_max_batch_size=1 << 20,
            # No standby copies of other workers' tables: with them every worker also reads every
            # changelog it does not own, and in both bench_streams --workers 2 runs made with them
            # the group stalled once the second worker joined; without, it finished (1.18x one).
            # A partition that moves is restored from its changelog, as on any start.
            table_standby_replicas=0,
            broker_session_timeout=config.session_timeout_s,
            # A restarted member with the same instance id takes its partitions back with no rebalance:
            # no wait for the dead one's session to time out, and none of the rebalances during which
            # Faust drops fetched messages (streams/gaps.py).
            consumer_group_instance_id=config.instance_id or None,
            broker_heartbeat_interval=min(3.0, config.session_timeout_s / 3),
            web_enabled=config.web_port > 0,
            web_port=config.web_port or 6066,
        )
        names = config.topics
        self.out_steps = self._topic(names.steps)
        self.out_prefix_nodes = self._topic(names.prefix_nodes)
        self.out_dlq = self._topic(names.dlq)
        self.targets_topic = self._topic(names.targets)
        self.trajectories_topic = self._topic(names.trajectories)
        self.scopes_topic = self._topic(names.scopes)
        self.links = self._table("links")
        self.targets = self._table("targets")
        self.join_steps = self._table("join_steps")
        self.join_trajectories = self._table("join_trajectories")
        self.scopes = self._table("scopes")
        self.scope_steps = self._table("scope_steps")
        self.tables = [self.links, self.targets, self.join_steps, self.join_trajectories, self.scopes,
                       self.scope_steps]
        # (agent, its topic, handler, the stage named in dead letters of unexpected errors, whether it
        # takes batches: the agents that index steps)
        agents: list[tuple[str, faust.TopicT, Callable[[EventLike], Awaitable[None]], str, bool]] = [
            ("ingest_llm", self._topic(names.raw_llm), self._on_llm_call, "normalize", True),
            ("ingest_events", self._topic(names.raw_events), self._on_service_event, "normalize", True),
            ("ingest_steps", self._topic(names.raw_steps), self._on_whitebox_step, "normalize", True),
            ("ingest_feedback", self._topic(names.raw_feedback), self._on_feedback, "normalize", False),
            ("resolve_targets", self.targets_topic, self._on_target_message, "join", False),
            ("join", self.trajectories_topic, self._on_trajectory_message, "join", False),
            ("merge_prefixes", self.scopes_topic, self._on_scope_step, "prefix", False),
        ]
        for name, topic, handler, stage, batched in agents:
            self.app.agent(topic, name=name)(self._agent_body(name, handler, stage, batched))
        self.agent_topics = {topic.get_topic_name() for _, topic, *_ in agents}
        self.app.timer(TAIL_CHECK_S, name="recover_dropped_tails")(self._recover_dropped_tails)

    async def _recover_dropped_tails(self) -> None:
        """Fetch again what Faust dropped at the end of a partition, where no later event reveals it.

        Only while an agent has been idle for a while and no rebalance or recovery holds the flow;
        a needless seek lands where the fetcher would have been anyway (streams/gaps.py).
        """
        app = self.app
        if app.rebalancing or not app.flow_control.is_active():
            return
        consumer = app.consumer
        generation = int(app.consumer_generation_id or 0)
        paused: set[Any] = getattr(consumer, "_paused_partitions", set())
        for tp in sorted(consumer.assignment()):
            if tp.topic not in self.agent_topics or tp in paused or not self.gaps.idle(tp.topic, TAIL_IDLE_S):
                continue
            highwater = consumer.highwater(tp)
            offset = await self.gaps.dropped_tail((tp.topic, tp.partition), generation, highwater)
            if offset is not None:
                log.warning("%s[%s]: offsets %s-%s reached no agent and nothing came after; fetching them "
                            "again", tp.topic, tp.partition, offset, highwater - 1)
                STREAM_TAILS_REFETCHED.inc()
                await _seek_in_consumer_thread(consumer, tp, offset)

    # ------------------------------------------------------------------ plumbing
    def _topic(self, name: str) -> faust.TopicT:
        return self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                              value_serializer="raw", partitions=self.config.partitions, allow_empty=True)

    def _table(self, name: str) -> HeldTable:
        """JSON keys and values (Faust's table default); values are the states' ``to_json`` dicts.

        Batched agents' writes are held until their batch ends (streams/held_tables.py).
        """
        return HeldTable(self.app.Table(name, default=None, partitions=self.config.partitions))

    def _agent_body(self, name: str, handler: Callable[[EventLike], Awaitable[None]], stage: str,
                    batched: bool = False) -> Callable[[faust.StreamT], Awaitable[None]]:
        events_in = STREAM_EVENTS_IN.labels(agent=name)
        recovered = STREAM_SKIPS_RECOVERED.labels(agent=name)

        async def body(stream: faust.StreamT) -> None:
            def arrived(value: Any) -> Any:  # as an event enters the agent: its topic is not idle
                if stream.current_event is not None:
                    self.gaps.handling(stream.current_event)
                return value

            stream.add_processor(arrived)
            async for batch in self._batches(stream, batched):
                outbox: list[tuple[str, dict[str, Any]]] = []
                token = _OUTBOX.set(outbox)
                holding = HOLDING.set(batched)
                try:
                    for event in batch:
                        events_in.inc()
                        # Table writes go to the changelog partition of the event being handled.
                        _current_event.set(weakref.ref(event))
                        for skipped in await self.gaps.skipped_before(event):  # see streams/gaps.py
                            recovered.inc()
                            await self._guarded(skipped, handler, stage)
                        await self._guarded(event, handler, stage)
                        self.gaps.processed(event)
                    for table in self.tables:  # before the batch's acks (streams/held_tables.py)
                        table.flush()
                    await self._send_packed_targets(outbox)
                finally:
                    HOLDING.reset(holding)
                    _OUTBOX.reset(token)

        return body

    async def _batches(self, stream: faust.StreamT, batched: bool) -> AsyncIterator[list[Any]]:
        """Batches of events for the agents that index steps (their entries travel packed), else one by one.

        Faust acks a batch's events only after the body has handled all of them. An agent waiting on
        ``take_events`` wakes every ``within`` even when idle, which costs more than batching saves
        where nothing is packed (seen in a profile: 28k wake-ups of seven idle agents).
        """
        if batched:
            within = self.config.batch_within_ms / 1000
            async for batch in cast(faust.Stream, stream).take_events(self.config.batch, within=within):
                yield list(batch)
        else:
            async for event in stream.events():
                yield [event]

    async def _send_packed_targets(self, entries: list[tuple[str, dict[str, Any]]]) -> None:
        """A batch's index entries: one message per partition of the targets topic, before the acks."""
        if not entries:
            return
        name = self.targets_topic.get_topic_name()
        partitions = self.app.consumer.topic_partitions(name) or self.config.partitions
        sent = STREAM_EVENTS_OUT.labels(topic=name)
        for partition, packed in messages.pack_targets(entries, partitions).items():
            await self.targets_topic.send(key=None, value=packed, partition=partition)
            sent.inc()

    async def _guarded(self, event: EventLike, handler: Callable[[EventLike], Awaitable[None]],
                       stage: str) -> None:
        """Run ``handler``; whatever the event does wrong ends in the dead-letter topic, never a crash."""
        token = _HANDLING.set(event)
        try:
            if event.value is None:
                raise InvalidEvent("empty message (no value)")
            await handler(event)
        except DecodeError as exc:
            await self._dead_letter(event, "decode", str(exc))
        except InvalidEvent as exc:
            await self._dead_letter(event, "validate", str(exc))
        except Exception as exc:  # noqa: BLE001 - any bug on one event must not stop the worker
            log.exception("%s failed on %s[%s]@%s", stage, event.message.topic, event.message.partition,
                          event.message.offset)
            await self._dead_letter(event, stage, f"{type(exc).__name__}: {exc}")
        finally:
            _HANDLING.reset(token)

    async def _dead_letter(self, event: EventLike, stage: str, reason: str) -> None:
        await self._send_dead_letter(stage, reason, self._origin(event))

    @staticmethod
    def _origin(event: EventLike) -> dict[str, object]:
        """An event's position and bytes, as a dead letter cites them (also after re-keying)."""
        msg = event.message
        return {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset, "key": _b64(msg.key),
                "value": _b64(msg.value), "timestamp_ms": round((msg.timestamp or 0) * 1000)}

    async def _send_dead_letter(self, stage: str, reason: str, origin: dict) -> None:
        record = dead_letter(reason, stage, origin["topic"], origin["partition"], origin["offset"],
                             _unb64(origin["key"]), _unb64(origin["value"]), origin["timestamp_ms"])
        await self.out_dlq.send(key=origin["topic"].encode(),
                                value=self.codec.encode(topics.DLQ.schema, record))
        STREAM_DEAD_LETTERS.labels(stage=stage).inc()
        STREAM_EVENTS_OUT.labels(topic=self.out_dlq.get_topic_name()).inc()

    async def _send(self, topic: faust.TopicT, key: str, value: bytes) -> None:
        await topic.send(key=key.encode(), value=value)
        STREAM_EVENTS_OUT.labels(topic=topic.get_topic_name()).inc()

    # ------------------------------------------------------------------ ingest
    async def _on_llm_call(self, event: EventLike) -> None:
        _, record = self.codec.decode(event.value, expect=topics.RAW_LLM.schema)
        turn = turn_from_llm_call(record)
        key = _text(event.key) or turn.trajectory_id or record["conversation_key"] or conversation_key(
            turn.messages)
        await self._link_and_publish(key, turn)

    async def _on_service_event(self, event: EventLike) -> None:
        _, record = self.codec.decode(event.value, expect=topics.RAW_EVENTS.schema)
        turn = turn_from_service_event(record)
        if turn is not None:  # other event kinds are not steps; they stay on the raw topic
            await self._link_and_publish(_text(event.key) or record["trajectory_id"], turn)

    async def _link_and_publish(self, key: str, turn: Turn) -> None:
        state = LinkState.from_json(self.links.get(key))
        replayed = turn.event_id in state.assigned
        linked = link_turn(state, turn, self.config.link_horizon_ms, self.config.max_links_per_key,
                           self.config.group_window_ms)
        if not replayed:
            self.links[key] = state.to_json()
        for fact in steps_from_turn(turn, linked.assignments, self.retokenizer):
            await self._publish_fact(fact)
        if len(turn.replies) > 1 and turn.engine_response_id:  # the bare id names every choice
            for step_id, assignment in zip(step_ids_of(turn), linked.assignments, strict=True):
                self._publish_target(turn.engine_response_id, step_id, Target(
                    assignment.trajectory_id, turn.created_at_ms, choice=True))
        decisions = [(messages.SUPERSEDE, linked.superseded), (messages.UNSUPERSEDE, linked.unsuperseded)]
        for kind, decided in decisions:
            for step_id, trajectory_id in decided:
                await self._send(self.trajectories_topic, trajectory_id,
                                 messages.encode(kind, step_id=step_id))
        if linked.continued is not None:
            c = linked.continued
            self._publish_target(c.response_id, c.step_id,
                                 Target(c.trajectory_id, c.created_at_ms, choice=True, continued=True))

    def _publish_target(self, target_id: str, step_id: str, target: Target) -> None:
        """Index entries leave packed at the end of the agent's batch (``_send_packed_targets``)."""
        _OUTBOX.get().append((target_id, {"kind": messages.TARGET, "step_id": step_id,
                                          "target": target.__dict__}))

    async def _on_whitebox_step(self, event: EventLike) -> None:
        _, record = self.codec.decode(event.value, expect=topics.RAW_STEPS.schema)
        fact = step_from_whitebox(record, self.retokenizer)
        trajectory_id = fact.step["trajectory_id"]
        if _text(event.key) == trajectory_id:
            # Keyed by its trajectory (as the gateway keys them): this partition is the join's own,
            # so the step joins here instead of taking a hop through the trajectories topic.
            trajectory = TrajectoryState.from_json(self.join_trajectories.get(trajectory_id))
            await self._on_step_fact(trajectory_id, trajectory, fact)
            self._publish_targets(fact)
        else:
            await self._publish_fact(fact)

    async def _publish_fact(self, fact: StepFact) -> None:
        await self._send(self.trajectories_topic, fact.step["trajectory_id"], messages.step_message(fact))
        self._publish_targets(fact)

    def _publish_targets(self, fact: StepFact) -> None:
        """Index the step under its step id and response id, where feedback by either meets it."""
        step = fact.step
        target = Target(step["trajectory_id"], step["created_at_ms"])
        for target_id in sorted({step["step_id"], step["response_id"]}):
            self._publish_target(target_id, step["step_id"], target)

    async def _on_feedback(self, event: EventLike) -> None:
        _, record = self.codec.decode(event.value, expect=topics.RAW_FEEDBACK.schema)
        fact = feedback_fact(record)
        if fact["target_kind"] == "trajectory":
            await self._send(self.trajectories_topic, fact["target_id"],
                             messages.encode(messages.TRAJECTORY_FEEDBACK, feedback=fact))
        else:
            await self._send(self.targets_topic, fact["target_id"],
                             messages.encode(messages.FEEDBACK, feedback=fact, origin=self._origin(event)))

    # ------------------------------------------------------------------ resolve
    async def _on_target_message(self, event: EventLike) -> None:
        if event.key is None:  # a batch's index entries for this partition, each keyed by its target id
            for key, message in messages.unpack_targets(event.value):
                try:
                    await self._resolve(key, message)
                except Exception as exc:  # noqa: BLE001 - one bad entry must not cost the others theirs
                    log.exception("resolving target %s failed", key)
                    await self._dead_letter(event, "join", f"target {key}: {type(exc).__name__}: {exc}")
        else:
            await self._resolve(_text(event.key) or "", messages.decode(event.value))

    async def _resolve(self, key: str, message: dict[str, Any]) -> None:
        state = TargetState.from_json(self.targets.get(key))
        window = self.config.feedback_window_ms
        if message["kind"] == messages.TARGET:
            outcome = add_target(state, key, message["step_id"], Target(**message["target"]), window)
        else:
            outcome = add_feedback(state, key, message["feedback"], message["origin"], window)
        changed, forwards, refusals = outcome
        if changed:
            self.targets[key] = state.to_json()
        for forward in forwards:
            await self._send(self.trajectories_topic, forward.trajectory_id, messages.encode(
                messages.STEP_FEEDBACK, step_id=forward.step_id, feedback=forward.feedback))
        for refusal in refusals:
            await self._refuse(refusal)

    async def _refuse(self, refusal: Refusal) -> None:
        """Feedback that names no single step: a dead letter citing the raw feedback event."""
        await self._send_dead_letter("join", refusal.reason, refusal.origin)

    # ------------------------------------------------------------------ join
    def _step_state(self, trajectory_id: str, step_id: str) -> StepState:
        return StepState.from_json(self.join_steps.get(trajectory_id + _SEP + step_id))

    async def _on_trajectory_message(self, event: EventLike) -> None:
        trajectory_id = _text(event.key) or ""
        message = messages.decode(event.value)
        trajectory = TrajectoryState.from_json(self.join_trajectories.get(trajectory_id))
        kind = message["kind"]
        if kind == messages.TRAJECTORY_FEEDBACK:
            if apply_feedback(trajectory.feedback, message["feedback"]):
                self.join_trajectories[trajectory_id] = trajectory.to_json()
            for step_id in trajectory.step_ids():
                await self._emit(self._step_state(trajectory_id, step_id), trajectory, to_scope=False)
        elif kind in (messages.SUPERSEDE, messages.UNSUPERSEDE):
            state = self._step_state(trajectory_id, message["step_id"])
            if apply_supersede(state, revive=kind == messages.UNSUPERSEDE):
                self.join_steps[trajectory_id + _SEP + message["step_id"]] = state.to_json()
            await self._emit(state, trajectory, to_scope=False)
        elif kind == messages.STEP_FEEDBACK:
            state = self._step_state(trajectory_id, message["step_id"])
            if apply_feedback(state.feedback, message["feedback"]):
                self.join_steps[trajectory_id + _SEP + message["step_id"]] = state.to_json()
            await self._emit(state, trajectory, to_scope=False)
        else:
            await self._on_step_fact(trajectory_id, trajectory, StepFact.from_json(message["fact"]))

    async def _on_step_fact(self, trajectory_id: str, trajectory: TrajectoryState, fact: StepFact) -> None:
        step_id = fact.step["step_id"]
        state = self._step_state(trajectory_id, step_id)
        # Steps at the next index may take this one as their parent (found by index).
        children = [self._step_state(trajectory_id, c) for c in trajectory.at(fact.step["step_index"] + 1)]
        children = [c for c in children if c.base is not None and c.base["parent_step_id"] is None]
        before = [_scope_signature(c, trajectory) for c in [state, *children]]
        new = apply_step_fact(state, trajectory, fact)
        if new:
            self.join_steps[trajectory_id + _SEP + step_id] = state.to_json()
            self.join_trajectories[trajectory_id] = trajectory.to_json()
        for displaced in displaced_terminals(trajectory, fact.step["step_index"]):  # they lost the mark
            await self._emit(self._step_state(trajectory_id, displaced), trajectory, to_scope=False)
        # A re-delivered fact publishes again all it produced: a crash may have lost that, not the state.
        for step, step_before in zip([state, *children], before, strict=True):
            changed = step_before != _scope_signature(step, trajectory)
            await self._emit(step, trajectory, to_scope=changed or not new)

    async def _emit(self, state: StepState, trajectory: TrajectoryState, to_scope: bool) -> None:
        """Publish the step's current version, and its tokens to its merge scope when asked."""
        record = build_step(state, trajectory, self.config.readiness)
        if record is None:
            return
        await self._send(self.out_steps, record["step_id"], self.codec.encode(topics.STEPS.schema, record))
        if to_scope and mergeable(record):
            scope_id, scope_kind = scope_of(record)
            scope_step = ScopeStep(scope_id, scope_kind, record["step_id"], record["prompt_token_ids"],
                                   record["response_token_ids"], record["parent_step_id"],
                                   record["created_at_ms"])
            if scope_id == record["trajectory_id"]:
                # A trajectory's scope lives in the trajectory's partition, this one: merge here.
                await self._merge_here(scope_step)
            else:
                await self._send(self.scopes_topic, scope_id, scope_step.encode())

    async def _merge_here(self, step: ScopeStep) -> None:
        """Merge without a hop; a failure is the prefix stage's dead letter, as on the scopes topic."""
        try:
            await self._merge(step)
        except Exception as exc:  # noqa: BLE001 - the step itself was published; only its merge failed
            event = _HANDLING.get()
            log.exception("prefix merge of %s failed", step.step_id)
            await self._dead_letter(event, "prefix", f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ prefix trees
    def _scope_tree(self, scope_id: str, state: ScopeState) -> PrefixTree:
        """The scope's tree: from the cache when it matches the table's state, else rebuilt from it."""
        cached = self.trees.pop(scope_id, None)  # re-inserted after a successful merge only
        if cached is not None and cached[0] == state.version and len(cached[1]) == len(state.steps):
            return cached[1]

        def tokens_of(step_id: str) -> tuple[list[int], list[int]] | None:
            entry = self.scope_steps.get(scope_id + _SEP + step_id)
            return None if entry is None else (entry["prompt"], entry["response"])

        return rebuild(state, tokens_of)

    async def _on_scope_step(self, event: EventLike) -> None:
        await self._merge(ScopeStep.decode(event.value))

    async def _merge(self, step: ScopeStep) -> None:
        state = ScopeState.from_json(self.scopes.get(step.scope_id))
        tree = self._scope_tree(step.scope_id, state)
        merge = merge_step(state, tree, step, self.bounds)
        if merge.outcome == "added":
            self.scope_steps[step.scope_id + _SEP + step.step_id] = {"prompt": step.prompt_ids,
                                                                      "response": step.response_ids}
        if merge.state_changed:
            self.scopes[step.scope_id] = state.to_json()
        self.trees[step.scope_id] = (state.version, tree)
        while len(self.trees) > self.config.tree_cache_size:
            self.trees.popitem(last=False)
        for row in merge.rows:
            await self._send(self.out_prefix_nodes, step.scope_id,
                             self.codec.encode(topics.PREFIX_NODES.schema, row))


async def _seek_in_consumer_thread(consumer: Any, tp: Any, offset: int) -> None:
    """Seek on the thread that runs aiokafka's consumer, as Faust's own seeks do.

    ``consumer.seek`` would call aiokafka from this loop's thread while its fetcher iterates the same
    partition's records on the other (seen: the fetcher crashed with a KeyError and the worker hung).
    """
    thread = consumer._thread

    async def seek() -> None:
        thread._ensure_consumer().seek(tp, offset)

    await thread.call_thread(seek)
    consumer._read_offset[tp] = offset  # so Faust takes the records again (it drops those below it)


def _scope_signature(state: StepState, trajectory: TrajectoryState) -> tuple[str, str | None] | None:
    """What a step's prefix-tree entry depends on (its fact and its parent); a change means re-merge."""
    if state.base is None:
        return None
    return state.base_digest, effective_parent(state.base, trajectory)
