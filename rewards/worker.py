"""``clawr1 rewarder``: score steps or whole trajectories from the curated step stream, once.

The role reads ``clawr1.steps`` (a consumer group, so several rewarders split the partitions), calls the
reward function named in ``CLAWR1_REWARD_FN`` on each target as it becomes complete, and posts the
score to ``clawr1.raw.feedback`` exactly as the gateway would, so the streams join it like any other
reward (its source reads ``reward_fn:<name>`` in the pool).

* Target: a trajectory when its terminal step arrives (default; ``CLAWR1_REWARD_TARGET=step`` scores
  every step instead). Failed and superseded steps are not scored.
* Once: the feedback id is a hash of (name, target), never of the step version or the time, and the
  record's ``received_at_ms`` is the step's ``created_at_ms``, so a replay re-posts the byte-identical
  record and the streams fold it as the same fact. A step version that already carries that id (the
  reward was joined) is skipped, and so is a target already rewarded by someone else (an agent's own
  reward) unless ``CLAWR1_REWARD_SKIP_REWARDED=false``: rewards from several sources add up.
* Failures (the function raising or returning a non-reward, an undecodable message) go to
  ``clawr1.dlq`` with the reason and the original bytes; the rewarder never stops for them.
* Offsets are committed only after the broker acknowledged every feedback and dead letter of a batch.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from cachetools import FIFOCache
from confluent_kafka import Consumer, KafkaError, Message, Producer

from clawr1.core import registry, topics
from clawr1.core.backoff import Backoff
from clawr1.core.kafka_io import consumed_at, ensure_topics, make_consumer, make_producer
from clawr1.core.metrics import REWARDER_DEAD_LETTERS, REWARDER_FEEDBACK, REWARDER_STEPS
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.gateway.records import deterministic_id
from clawr1.rewards.loader import RewardFn, RewardFnError, compute_reward, load_reward_fn
from clawr1.schemas.codec import AvroCodec, CodecError, codec_for
from clawr1.streams.dead_letters import dead_letter

log = logging.getLogger(__name__)

Target = Literal["trajectory", "step"]
TARGETS: tuple[Target, ...] = ("trajectory", "step")
SOURCE = "reward_fn"
_REMEMBERED = 100_000
# Waits before feedback the broker did not take is produced again: from 0.1 s doubling, at most 1 s.
_REDELIVERY_BACKOFF = Backoff(0.1, 1.0)


def _target(value: str) -> Target:
    if value not in TARGETS:
        raise ValueError(f"CLAWR1_REWARD_TARGET must be 'trajectory' or 'step', got {value!r}")
    return value


def _suffixed(topic: str) -> Callable[[str], str]:
    """``topic`` with ``CLAWR1_TOPIC_SUFFIX`` (a test's own set of topics)."""
    return lambda suffix: topic + suffix


@dataclass(frozen=True)
class RewarderConfig:
    bootstrap: str
    spec: str
    """``module:function`` of the reward function."""
    name: str
    """The source name in the pool (``reward_fn:<name>``); defaults to the spec."""
    target: Target = setting_field(registry.REWARD_TARGET, _target)
    group_id: str = setting_field(registry.REWARD_GROUP)
    steps_topic: str = setting_field(registry.TOPIC_SUFFIX, _suffixed(topics.STEPS.name))
    feedback_topic: str = setting_field(registry.TOPIC_SUFFIX, _suffixed(topics.RAW_FEEDBACK.name))
    dlq_topic: str = setting_field(registry.TOPIC_SUFFIX, _suffixed(topics.DLQ.name))
    skip_rewarded: bool = setting_field(registry.REWARD_SKIP_REWARDED)
    concurrency: int = setting_field(registry.REWARD_CONCURRENCY)
    batch_size: int = 64
    partitions: int = setting_field(registry.TOPIC_PARTITIONS)
    registry_url: str = setting_field(registry.SCHEMA_REGISTRY_URL)

    @classmethod
    def from_settings(cls, settings: Settings) -> RewarderConfig:
        spec = settings.role_setting(registry.REWARD_FN)
        if not spec:
            raise RewardFnError("the rewarder needs CLAWR1_REWARD_FN=module:function")
        return config_from(cls, settings, bootstrap=settings.bootstrap_servers, spec=spec,
                           name=settings.role_setting(registry.REWARD_NAME) or spec)


# -- what to score, and how (pure) -------------------------------------------------------------------


def target_of(step: Mapping[str, Any], target: Target) -> tuple[str, str] | None:
    """``(target_kind, target_id)`` to score for this step version, or None when it is not a target."""
    if step["status"] != "ok" or step.get("link_status") == "superseded":
        return None
    if target == "step":
        return "step", step["step_id"]
    return ("trajectory", step["trajectory_id"]) if step["terminal"] else None


def feedback_id_of(name: str, kind: str, target_id: str) -> str:
    """One id per (reward function, target): a replay or a newer step version names the same fact."""
    return deterministic_id(SOURCE, name, kind, target_id)


def already_scored(step: Mapping[str, Any], kind: str, feedback_id: str, skip_rewarded: bool) -> bool:
    """The step version already holds this function's reward, or (``skip_rewarded``) any reward."""
    try:
        facts = json.loads(step["feedback_json"] or "[]")
    except ValueError:
        facts = []
    if any(isinstance(f, Mapping) and f.get("feedback_id") == feedback_id for f in facts):
        return True
    existing = step["trajectory_reward"] if kind == "trajectory" else step["reward"]
    return skip_rewarded and existing is not None


def _json_or(text: str, default: Any) -> Any:
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default


def reward_fields(step: Mapping[str, Any]) -> dict[str, Any]:
    """The seed system's ``/compute_reward`` arguments for a step: its ids, its turn count, the step
    (text included) in ``extra_fields`` and its metadata as ``dataset_fields`` (where ``ground_truth``
    lives)."""
    metadata = _json_or(step["metadata_json"], {})
    return {
        "prompt_ids": list(step["prompt_token_ids"]),
        "response_ids": list(step["response_token_ids"]),
        "num_turns": int(step["step_index"]) + 1,
        "extra_fields": {
            "step_id": step["step_id"],
            "trajectory_id": step["trajectory_id"],
            "step_index": step["step_index"],
            "prompt_group_id": step["prompt_group_id"],
            "channel": step.get("channel", "train"),
            "response_text": step["response_text"],
            "prompt_messages": _json_or(step["prompt_messages"], []),
            "tool_calls": _json_or(step["tool_calls_json"], []),
            "model": step["model"],
            "agent": step["agent"],
            "policy_version": step["policy_version"],
            "source_kind": step["source_kind"],
            "source_name": step["source_name"],
        },
        "dataset_fields": metadata if isinstance(metadata, dict) else {},
    }


def _components(extra: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in extra.items():
        if isinstance(value, int | float) and math.isfinite(float(value)):
            out[str(key)] = float(value)
    return out


def feedback_of(name: str, kind: str, target_id: str, feedback_id: str, score: float,
                extra: Mapping[str, Any], scored_at_ms: int) -> dict[str, Any]:
    """A feedback.avsc record as the gateway writes one for a key of kind reward: numeric extras become
    components, the whole extra info is kept as JSON in ``comment``."""
    comment = json.dumps(dict(extra), ensure_ascii=False, sort_keys=True, default=str) if extra else None
    return {
        "feedback_id": feedback_id,
        "target_kind": kind,
        "target_id": target_id,
        "reward": score,
        "components": _components(extra),
        "final": True,
        "source": SOURCE,
        "source_name": name,
        "label": None,
        "comment": comment,
        "correction": None,
        "received_at_ms": scored_at_ms,
        "terminal": False,  # a score completes nothing: the agent or the compat port says when it ends
        # The stack's own reward producer scores every trajectory, whoever created it.
        "privileged": True,
    }


# -- the role ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Out:
    topic: str
    key: str
    value: bytes


class Rewarder:
    """One rewarder process: poll a batch, score it on a thread pool, produce, flush, commit."""

    def __init__(self, config: RewarderConfig, fn: RewardFn | None = None,
                 codec: AvroCodec | None = None) -> None:
        self.config = config
        self.fn = fn if fn is not None else load_reward_fn(config.spec)
        self.codec = codec or codec_for(config.registry_url)
        self._attempted: FIFOCache[str, None] = FIFOCache(maxsize=_REMEMBERED)
        self._lock = threading.Lock()
        self.scored = 0
        self.dead_letters = 0

    def _first_attempt(self, feedback_id: str) -> bool:
        """True once per target per process: later versions of a target in flight are not rescored."""
        with self._lock:
            if feedback_id in self._attempted:
                return False
            self._attempted[feedback_id] = None
            return True

    def _dead_letter(self, message: Message, reason: str, stage: str, index: int | None = None,
                     value: bytes | None = None) -> _Out:
        """A dead letter citing the message, or (``index``) one step of an envelope with its own bytes."""
        timestamp = message.timestamp()[1]
        topic, partition, offset = consumed_at(message)
        record = dead_letter(reason, stage, topic, partition, offset, message.key(),
                             message.value() if value is None else value, timestamp, index)
        # The streams or the sink may dead-letter the same message for their own reason: a separate id.
        record["dlq_id"] = f"{SOURCE}:{self.config.name}@{record['dlq_id']}"
        self.dead_letters += 1
        REWARDER_DEAD_LETTERS.labels(stage=stage).inc()
        return _Out(self.config.dlq_topic, topic, self.codec.encode(topics.DLQ.schema, record))

    def handle(self, message: Message) -> list[_Out]:
        """What one message of steps (a record or an envelope) produces: feedback and dead letters."""
        try:
            envelope = self.codec.writer_of(message.value() or b"").name != topics.STEPS.schema
            steps = self.codec.decode_records(message.value(), expect=topics.STEPS.schema)
        except CodecError as exc:
            REWARDER_STEPS.inc()
            return [self._dead_letter(message, f"not a step record: {exc}", "decode")]
        outs = []
        for index, step in enumerate(steps):
            REWARDER_STEPS.inc()
            try:
                out = self._score(step)
            except RewardFnError as exc:
                cited = self.codec.encode(topics.STEPS.schema, step) if envelope else None
                out = self._dead_letter(message, str(exc), "reward", index if envelope else None, cited)
            if out is not None:
                outs.append(out)
        return outs

    def _score(self, step: dict[str, Any]) -> _Out | None:
        """The step's feedback, or None when it is not to be scored (now); ``RewardFnError`` names it."""
        target = target_of(step, self.config.target)
        if target is None:
            return None
        kind, target_id = target
        feedback_id = feedback_id_of(self.config.name, kind, target_id)
        if already_scored(step, kind, feedback_id, self.config.skip_rewarded):
            return None
        if not self._first_attempt(feedback_id):
            return None
        try:
            result = compute_reward(self.fn, **reward_fields(step))
        except RewardFnError as exc:
            raise RewardFnError(f"reward function {self.config.name} failed on {kind} {target_id}: {exc}") \
                from exc
        record = feedback_of(self.config.name, kind, target_id, feedback_id, result.score, result.extra,
                             int(step["created_at_ms"]))
        self.scored += 1
        REWARDER_FEEDBACK.inc()
        return _Out(self.config.feedback_topic, target_id,
                    self.codec.encode(topics.RAW_FEEDBACK.schema, record))

    def process(self, messages: Iterable[Message], pool: ThreadPoolExecutor) -> list[_Out]:
        usable = []
        for message in messages:
            error = message.error()
            if error is None:
                usable.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("rewarder consumer error: %s", error.str())
        return [out for outs in pool.map(self.handle, usable) for out in outs]

    def run(self, consumer: Consumer, producer: Producer, stop: threading.Event,
            ready: Callable[[], None] | None = None, poll_s: float = 0.5) -> None:
        consumer.subscribe([self.config.steps_topic])
        with ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="reward") as pool:
            while not stop.is_set():
                messages = consumer.consume(self.config.batch_size, poll_s)
                if ready is not None:
                    ready()
                    ready = None
                if not messages:
                    continue
                outgoing = self.process(messages, pool)
                if not _deliver(producer, outgoing, stop):
                    return  # stopping: the batch is not committed and comes again
                consumer.commit(asynchronous=False)


def _deliver(producer: Producer, outgoing: list[_Out], stop: threading.Event) -> bool:
    """Produce until the broker acknowledged every message (retrying the failed ones); False if
    stopped first."""
    pending = outgoing
    waits = _REDELIVERY_BACKOFF.delays()
    while pending:
        failed: list[_Out] = []

        def report(out: _Out, error: KafkaError | None, _msg: Message, failed: list[_Out] = failed) -> None:
            if error is not None:
                log.warning("feedback not delivered, retrying: %s", error.str())
                failed.append(out)

        for out in pending:
            while True:
                try:
                    producer.produce(out.topic, out.value, out.key, on_delivery=partial(report, out))
                    break
                except BufferError:
                    producer.poll(0.1)
        while producer.flush(1.0) > 0:
            if stop.is_set():
                return False
        pending = failed
        if pending and stop.wait(next(waits)):
            return False
    return True


def run_rewarder(settings: Settings, ready: Callable[[], None] | None = None,
                 stop: threading.Event | None = None) -> int:
    """Block until ``stop`` (SIGINT/SIGTERM in the CLI); returns the exit status."""
    from clawr1.core.signals import stop_on_signals

    config = RewarderConfig.from_settings(settings)
    rewarder = Rewarder(config)  # a bad CLAWR1_REWARD_FN fails here, at start, not per message
    stop = stop or stop_on_signals()
    ensure_topics(config.bootstrap, [config.steps_topic, config.feedback_topic, config.dlq_topic],
                  config.partitions)
    consumer = make_consumer(config.bootstrap, config.group_id)
    producer = make_producer(config.bootstrap)
    try:
        rewarder.run(consumer, producer, stop, ready)
    finally:
        consumer.close()
        producer.flush(10.0)
    return 0
