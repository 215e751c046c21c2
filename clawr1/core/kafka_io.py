"""confluent-kafka clients configured the one way Claw-R1 needs them.

Producers are idempotent with acks=all and hash keys with murmur2 (Java's partitioner), so a key
lands on the partition Java's partitioner would choose (``clawr1.core.routing.partition_of``).

Also the one place that creates topics and sets how long Kafka keeps them (``ensure_topics``,
``topic_config``), says what a produce error means (``classify``) and applies the one policy for fatal
producer errors (``RebuildingProducer``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from clawr1.core import registry, topics
from clawr1.core.settings import config_from, setting_field
from clawr1.core.topics import ALL_TOPICS

log = logging.getLogger("clawr1.kafka")

# What every producer compresses with, and every topic of the stack keeps on disk (the broker recompresses
# a batch that arrives otherwise, from anyone else's producer). Measured against lz4 and none on step
# envelopes: docs/scale.md, "Kafka's disk".
COMPRESSION = "zstd"


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": COMPRESSION,
        "message.max.bytes": 16 * 1024 * 1024,
    }
    config.update(overrides)
    return config


def make_producer(bootstrap: str, **overrides: Any) -> Producer:
    return Producer(producer_config(bootstrap, **overrides))


def make_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    """Offsets are committed by the caller only after its work is durable (at-least-once)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": 64 * 1024 * 1024,
    }
    config.update(overrides)
    return Consumer(config)


def make_admin(bootstrap: str, **overrides: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **overrides})


def error_code(exc: BaseException) -> int | None:
    """The ``KafkaError`` code a ``KafkaException`` carries (None for anything else)."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


def consumed_at(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a message a consumer returned without error. The client types
    them optional (a message being produced has no offset yet); a consumed one always has them."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"not a consumed message: topic {topic}, partition {partition}, offset {offset}")
    return topic, partition, offset


HOUR_MS = 3_600_000
# Retention deletes closed segments only, and Kafka closes one after 7 days (or 256 MB here): segments
# close every hour (sooner for a shorter retention), so data lives its retention plus an hour at most
# (plus the broker's retention check, every 5 minutes).
SEGMENT_MS = HOUR_MS
# Compaction too reaches closed segments only: the changelog's close every 10 minutes, so the values a
# checkpoint overwrote and the state that ended (the TTL's 10 minutes by default) give their disk back
# within minutes, not after an hour of writes that the stream rewrites as it goes.
CHANGELOG_SEGMENT_MS = HOUR_MS // 6
# A deleted key's tombstone stays this long in a compacted changelog: a worker restoring a partition reads
# it through in far less.
TOMBSTONE_MS = HOUR_MS


def _ms(hours: float) -> int:
    return -1 if hours == -1 else round(hours * HOUR_MS)


@dataclass(frozen=True)
class TopicPolicy:
    """How long Kafka keeps each role's topics, in ms (-1: forever); ``from_env`` reads the
    ``CLAWR1_KAFKA_*_RETENTION_H`` settings, which every role that creates topics applies alike."""

    input_ms: int = setting_field(registry.KAFKA_INPUT_RETENTION_H, _ms)
    output_ms: int = setting_field(registry.KAFKA_OUTPUT_RETENTION_H, _ms)
    dead_letters_ms: int = setting_field(registry.KAFKA_DLQ_RETENTION_H, _ms)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TopicPolicy:
        return config_from(cls, env)


def topic_config(name: str, policy: TopicPolicy) -> dict[str, str]:
    """The configs topic ``name`` gets from its role (``topics.role_of``); none for a topic the stack
    does not own. The changelog is compacted (Quix's requirement): it keeps each live key of the worker's
    state; the others are deleted by age."""
    role = topics.role_of(name)
    if role is None:
        return {}
    if role == topics.CHANGELOG:
        return {"cleanup.policy": "compact", "compression.type": COMPRESSION,
                "segment.ms": str(CHANGELOG_SEGMENT_MS), "delete.retention.ms": str(TOMBSTONE_MS)}
    retention = {topics.INPUT: policy.input_ms, topics.OUTPUT: policy.output_ms,
                 topics.DEAD_LETTERS: policy.dead_letters_ms}[role]
    segment = SEGMENT_MS if retention == -1 else max(1, min(SEGMENT_MS, retention))
    return {"cleanup.policy": "delete", "compression.type": COMPRESSION, "retention.ms": str(retention),
            "segment.ms": str(segment)}


# NewTopic's "the broker's default.replication.factor" (and the topic then follows min.insync.replicas).
CLUSTER_DEFAULT = -1


def ensure_topics(
    bootstrap: str, names: Iterable[str] | None = None, partitions: int = 4, timeout: float = 30.0, *,
    replication: int = CLUSTER_DEFAULT, policy: TopicPolicy | None = None,
) -> dict[str, int]:
    """Create missing topics and return once the broker serves every one, with each one's partition
    count as the broker has it. Every topic of the stack gets its role's configs (``topic_config``, from
    ``policy``, by default the settings in the environment), at creation and, for one that exists with
    others (a stack upgraded, a setting changed), by altering it; its partitions are left as they are.
    Raises KafkaException when the broker is unreachable, RuntimeError when it refuses a topic.

    Replication is the cluster's by default: its ``default.replication.factor`` and
    ``min.insync.replicas``, which the project's brokers set from their node count
    (``broker/launcher.py`` ``replication_for``: 1 copy alone, 3 copies with 2 in sync from 3 nodes on).
    So every caller creates its topics as the cluster it runs on wants them, without knowing its size,
    and a cluster one broker short refuses a topic it cannot replicate instead of making a weaker one."""
    policy = policy or TopicPolicy.from_env(os.environ)
    admin = make_admin(bootstrap)
    wanted = list(names) if names is not None else [t.name for t in ALL_TOPICS]
    deadline = time.monotonic() + timeout
    existing = set(admin.list_topics(timeout=timeout).topics)
    pending = [n for n in dict.fromkeys(wanted) if n not in existing]
    while pending:
        new = [NewTopic(n, num_partitions=partitions, replication_factor=replication,
                        config=topic_config(n, policy)) for n in pending]
        refused = {name: exc for name, future in admin.create_topics(new, operation_timeout=timeout).items()
                   if (exc := _creation_error(future, timeout)) is not None}
        for name, exc in refused.items():
            if error_code(exc) not in CREATION_RETRIABLE or time.monotonic() > deadline:
                raise RuntimeError(f"could not create topic {name}: {exc}") from exc
        pending = list(refused)
        if pending:
            log.info("retrying the creation of %s: %s", pending, next(iter(refused.values())))
            time.sleep(0.5)
    counts = wait_until_served(admin, wanted, max(1.0, deadline - time.monotonic()))
    align_topic_configs(admin, [n for n in wanted if n in existing], policy,
                        max(1.0, deadline - time.monotonic()))
    return counts


def align_topic_configs(admin: AdminClient, names: Iterable[str], policy: TopicPolicy,
                        timeout: float = 30.0) -> dict[str, dict[str, str]]:
    """Alter each existing topic whose configs differ from its role's; returns what changed, by topic.
    A cluster that refuses (no permission to alter configs) or does not answer within ``timeout`` leaves
    them as they are, with a warning: the role starts all the same."""
    wanted = {name: config for name in dict.fromkeys(names) if (config := topic_config(name, policy))}
    if not wanted:
        return {}
    try:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in wanted],
                                           request_timeout=timeout)
        changes = {}
        for resource, future in described.items():
            current = future.result(timeout)
            diff = {key: value for key, value in wanted[resource.name].items()
                    if key not in current or current[key].value != value}
            if diff:
                changes[resource.name] = diff
        if changes:
            altered = admin.incremental_alter_configs(
                [ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
                    ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                    for key, value in diff.items()]) for name, diff in changes.items()],
                request_timeout=timeout)
            for future in altered.values():
                future.result(timeout)
            log.info("topic configs set: %s", changes)
        return changes
    except (KafkaException, TimeoutError) as exc:  # no answer in time: the next start tries again
        log.warning("could not set the topic configs of %s (%r); Kafka keeps them as they are",
                    sorted(wanted), exc)
        return {}


# A cluster still forming or electing its controller answers a creation with these; asked again a moment
# later it creates the topic. (Seen once on a loaded 2-core machine: UNKNOWN_TOPIC_OR_PART from a
# 3-broker cluster that had just started.) A refusal on the topic itself (a replication factor the
# cluster cannot meet, a bad config) is final.
CREATION_RETRIABLE = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_CONTROLLER, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.BROKER_NOT_AVAILABLE, KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
})


def _creation_error(future: Any, timeout: float) -> KafkaException | None:
    """Why the broker refused one topic's creation; None when it was created, or already existed
    (another client created it first)."""
    try:
        future.result(timeout)
    except KafkaException as exc:
        return None if error_code(exc) == KafkaError.TOPIC_ALREADY_EXISTS else exc
    return None


def wait_until_served(admin: AdminClient, names: Iterable[str], timeout: float = 30.0) -> dict[str, int]:
    """Return once the broker's metadata shows every partition of ``names`` with a leader, with the
    partition count of each (what a producer choosing partitions itself must hash keys into).

    A created topic reaches the broker's metadata a moment after CreateTopics answers; a client that
    reads metadata in between sees it with no partitions and may keep that view (seen on a loaded
    2-core machine).
    """
    wanted = set(names)
    pending = set(wanted)
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        pending = {name for name in pending if not _served(topics.get(name))}
        if not pending:
            return {name: len(topics[name].partitions) for name in wanted}
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics without partition leaders after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(0.1)


def _served(topic: Any) -> bool:
    return (topic is not None and topic.error is None and bool(topic.partitions)
            and all(p.error is None and p.leader >= 0 for p in topic.partitions.values()))


# What a produce error means for the message (``classify``) ----------------------------------------

# The broker refuses these messages whatever the retry: too big, malformed, or not allowed on the topic.
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
_UNDELIVERABLE = _TOO_LARGE | {KafkaError.INVALID_RECORD, KafkaError.TOPIC_AUTHORIZATION_FAILED}


@dataclass(frozen=True)
class Retriable:
    """Kafka may take the message later (broker down or slow, timed out, purged): send it again."""

    reason: str
    code: int


@dataclass(frozen=True)
class Undeliverable:
    """Kafka refuses this message for good; ``too_large`` when splitting it (or a batch) might help."""

    reason: str
    code: int

    @property
    def too_large(self) -> bool:
        return self.code in _TOO_LARGE


@dataclass(frozen=True)
class Fatal:
    """The producer itself is broken (e.g. the idempotent producer lost its sequence): only a new
    producer can send anything; the message is still owed (see ``RebuildingProducer``)."""

    reason: str
    code: int


ProduceOutcome = Retriable | Undeliverable | Fatal


def classify(error: KafkaError) -> ProduceOutcome:
    """What a produce or delivery error means for its message, from the error's code and flags.

    A fatal error (``error.fatal()``, or a delivery report with ``_FATAL``: the message failed because
    its producer is fatal) is Fatal; one the client marks ``retriable()`` is Retriable even if its code
    is usually final; the codes in ``_UNDELIVERABLE`` are Undeliverable; anything else is Retriable,
    the safe default for a message someone still owes (the proxy's spool, a gateway client's retry).
    """
    reason = f"{error.name()}: {error.str()}"
    code = error.code()
    if error.fatal() or code == KafkaError._FATAL:
        return Fatal(reason, code)
    if not error.retriable() and code in _UNDELIVERABLE:
        return Undeliverable(reason, code)
    return Retriable(reason, code)


# The one policy for fatal producer errors -----------------------------------------------------------

# How long the replaced producer gets to hand back the delivery reports of what it still held.
FATAL_DRAIN_S = 5.0


class RebuildingProducer:
    """A role's producer, replaced by a new instance after a fatal error (the proxy and the gateway).

    An idempotent producer that hit a fatal error refuses every message from then on; it is not
    restarted but replaced (a new instance gets a new producer id). ``rebuild_if_fatal``, called by
    the one thread that polls, swaps in the new producer (``producer`` returns it to every later
    ``produce``), then purges the old one and serves its delivery reports: every message it still
    held fails back to its owner's ``on_delivery`` (the proxy keeps it in its spool and sends it again;
    the gateway answers its request 503 with Retry-After), classified Fatal or Retriable.
    ``generation`` (bumped at each replacement) tells an owner which producer a message went to.
    """

    def __init__(self, bootstrap: str, *, on_error: Callable[[KafkaError], None] | None = None,
                 factory: Callable[..., Producer] | None = None, **overrides: Any) -> None:
        self._bootstrap = bootstrap
        self._overrides = overrides
        self._on_error = on_error
        self._factory = factory
        self.generation = 0
        self.fatal: KafkaError | None = None
        self.last_fatal: KafkaError | None = None
        self.producer = self._build()

    def _build(self) -> Producer:
        factory = self._factory or make_producer
        return factory(self._bootstrap, error_cb=partial(self._error, self.generation), **self._overrides)

    def _error(self, generation: int, error: KafkaError) -> None:
        # A replaced producer may still report its fatal error while it drains: not the current one's.
        if error.fatal() and generation == self.generation and self.fatal is None:
            self.fatal = error
        if self._on_error is not None:
            self._on_error(error)

    def rebuild_if_fatal(self, drain_s: float = FATAL_DRAIN_S) -> KafkaError | None:
        """After a fatal error: a new producer, the old one's messages failed back; returns the error."""
        error = self.fatal
        if error is None:
            return None
        old = self.producer
        new = self._build_next()
        self.last_fatal = error
        self.producer = new
        self.fatal = None
        log.error("Kafka producer fatal error (%s): replaced by a new producer", error.str())
        try:
            old.purge()
        except KafkaException as exc:  # a fatal producer may refuse even this; its flush still reports
            log.warning("could not purge the failed producer: %s", exc)
        left = old.flush(drain_s)
        if left:
            log.warning("%d message(s) of the failed producer gave no delivery report", left)
        return error

    def _build_next(self) -> Producer:
        self.generation += 1
        try:
            return self._build()
        except BaseException:
            self.generation -= 1
            raise
