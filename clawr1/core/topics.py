"""Kafka topic names, their keys and the Avro schema each one carries.

Keys are chosen so that what must be joined is co-partitioned: every topic that feeds a join on
trajectories is keyed by trajectory id (or by the conversation root a trajectory grows from), and
every producer hashes keys with Java's murmur2 (``clawr1.core.routing``), so any role can tell where a
key lands.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str
    schema: str
    key: str
    doc: str


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
)
PREFIX_NODES = Topic(
    "clawr1.prefix_nodes",
    "prefix_node",
    "scope_id",
    "prefix-tree nodes of each merge scope (prompt group or trajectory)",
)
DLQ = Topic(
    "clawr1.dlq",
    "dead_letter",
    "source topic",
    "events that could not be decoded or validated, with the reason and the original bytes",
)

ALL_TOPICS: tuple[Topic, ...] = (RAW_LLM, RAW_STEPS, RAW_EVENTS, RAW_FEEDBACK, STEPS, PREFIX_NODES, DLQ)
