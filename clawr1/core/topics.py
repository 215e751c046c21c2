"""Kafka topic names, their keys and the Avro schema each one carries.

Keys are chosen so that what must be joined is co-partitioned: every topic that feeds a join on
trajectories is keyed by trajectory id (or by the conversation root a trajectory grows from), and
every producer hashes keys with Java's murmur2 (``clawr1.core.routing``), so any role can tell where a
key lands.

Each topic has a role, which decides how long Kafka keeps it (``clawr1.core.kafka_io.topic_config``):
``input`` topics are read by the worker (and the sink) within seconds of their writing, ``output``
topics by the sink and the rewarder, ``dead letters`` by people, and the worker's ``changelog`` is its
state, compacted.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT = "input"
OUTPUT = "output"
DEAD_LETTERS = "dead letters"
CHANGELOG = "changelog"

# The worker's messages to its own partitions (clawr1.streams.messages): read within seconds, an input.
INTERNAL_PREFIX = "clawr1.internal."
WORK = f"{INTERNAL_PREFIX}work"  # no Avro schema, so not in ALL_TOPICS: the worker creates it (StreamTopics)
# How Quix names a state store's changelog (clawr1.streams.quix_compat.changelog_topic).
CHANGELOG_PREFIX = "changelog__"


@dataclass(frozen=True)
class Topic:
    name: str
    schema: str
    key: str
    doc: str
    role: str = INPUT


RAW_LLM = Topic(
    "clawr1.raw.llm",
    "raw_llm_call",
    "trajectory hint (X-Claw-Trajectory-Id) when given, else the conversation root hash",
    "one captured LLM call from the proxy: request and response as sent, timings, tokens",
)
RAW_STEPS = Topic("clawr1.raw.steps", "whitebox_step", "trajectory_id", "steps submitted by white-box agents")
RAW_EVENTS = Topic(
    "clawr1.raw.events", "service_event", "trajectory_id", "live events from black-box services"
)
RAW_FEEDBACK = Topic(
    "clawr1.raw.feedback",
    "feedback",
    "the id the feedback targets (step, response or trajectory id)",
    "rewards, labels, comments and corrections from reward models and humans",
)
STEPS = Topic(
    "clawr1.steps",
    "step",
    "step_id",
    "curated, normalized step versions; the newest version of a step wins",
    OUTPUT,
)
PREFIX_NODES = Topic(
    "clawr1.prefix_nodes",
    "prefix_node",
    "scope_id",
    "prefix-tree nodes of each merge scope (prompt group or trajectory)",
    OUTPUT,
)
DLQ = Topic(
    "clawr1.dlq",
    "dead_letter",
    "source topic",
    "events that could not be decoded or validated, with the reason and the original bytes",
    DEAD_LETTERS,
)

ALL_TOPICS: tuple[Topic, ...] = (RAW_LLM, RAW_STEPS, RAW_EVENTS, RAW_FEEDBACK, STEPS, PREFIX_NODES, DLQ)


def role_of(name: str) -> str | None:
    """The role of one of the stack's topics, also under a suffix (``CLAWR1_TOPIC_SUFFIX``: tests,
    side-by-side stacks); None for a topic of anyone else, which Kafka's defaults govern."""
    if name.startswith(CHANGELOG_PREFIX):
        return CHANGELOG
    if name.startswith(INTERNAL_PREFIX):
        return INPUT
    return next((t.role for t in ALL_TOPICS if name.startswith(t.name)), None)
