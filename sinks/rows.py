"""Decoded Avro records -> pool row tuples, one pure function per table.

Avro decoding already guarantees the field types; what is checked here is what Avro cannot express but
ClickHouse would reject or silently distort (negative token ids for ``UInt32``, timestamps outside
``DateTime64``'s range, unknown reward states). A failed check raises ``RowError`` and the message goes
to the dead letters with that reason instead of blocking the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawr1.core.epoch import is_epoch_ms
from clawr1.core.topics import DLQ, PREFIX_NODES, RAW_FEEDBACK, STEPS
from clawr1.pool.migrations import STEP_FIELDS

REWARD_STATES = frozenset({"pending", "final"})
_MAX_TOKEN_ID = 2**32 - 1


class RowError(ValueError):
    """A decoded record that cannot become a pool row; the message is the dead-letter reason."""


@dataclass(frozen=True)
class Origin:
    """Where a message came from: the offset coordinates the sink records and deduplicates on."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    index: int | None = None  # the record's place in an envelope
    cite: Callable[[], bytes] | None = field(default=None, compare=False)  # that record alone, encoded

    def original(self) -> bytes | None:
        """The bytes a dead letter keeps: the message, or the envelope's record re-encoded alone."""
        return self.cite() if self.value is None and self.cite is not None else self.value

    @property
    def position(self) -> str:
        place = f"{self.topic}:{self.partition}:{self.offset}"
        return place if self.index is None else f"{place}#{self.index}"


SOURCE_COLUMNS: tuple[str, ...] = ("ingested_at", "source_topic", "source_partition", "source_offset")
STEP_COLUMNS: tuple[str, ...] = (*STEP_FIELDS, *SOURCE_COLUMNS)
FEEDBACK_COLUMNS: tuple[str, ...] = (
    "feedback_id", "target_kind", "target_id", "reward", "components", "final", "source", "source_name",
    "label", "comment", "correction", "received_at_ms", "terminal", *SOURCE_COLUMNS,
)
PREFIX_NODE_COLUMNS: tuple[str, ...] = (
    "scope_id", "scope_kind", "node_id", "parent_node_id", "depth_start", "token_ids", "step_ids",
    "version", "total_tokens", "tree_tokens", "forks", "updated_at_ms", *SOURCE_COLUMNS,
)
DEAD_LETTER_COLUMNS: tuple[str, ...] = (
    "dlq_id", "reason", "stage", "source_topic", "source_partition", "source_offset", "original_key",
    "original_value", "failed_at_ms", "ingested_at", "dlq_topic", "dlq_partition", "dlq_offset",
)

_BOOL_STEP_FIELDS = frozenset({"terminal", "ready", "prompt_group_inferred"})
_TIME_STEP_FIELDS = frozenset({"created_at_ms", "updated_at_ms"})
_OPTIONAL_TIME_STEP_FIELDS = frozenset({"prompt_group_closes_at_ms"})
STEP_STATES = ("reward_status", "trajectory_reward_status")


def _epoch_ms(record: dict[str, Any], name: str) -> int:
    value = record[name]
    if not is_epoch_ms(value):
        raise RowError(f"{name}={value} is not an epoch time in milliseconds")
    return int(value)


def _token_ids(record: dict[str, Any], name: str) -> list[int]:
    ids: list[int] = record[name]
    if ids and (min(ids) < 0 or max(ids) > _MAX_TOKEN_ID):
        raise RowError(f"{name} holds ids outside 0..2^32-1")
    return ids


def _source(origin: Origin, now_ms: int) -> tuple[Any, ...]:
    return (now_ms, origin.topic, origin.partition, origin.offset)


def step_row(record: dict[str, Any], origin: Origin, now_ms: int) -> tuple[Any, ...]:
    for name in STEP_STATES:
        if record[name] not in REWARD_STATES:
            raise RowError(f"{name} {record[name]!r} is not one of {sorted(REWARD_STATES)}")
    values: list[Any] = []
    for name in STEP_FIELDS:
        if name in _TIME_STEP_FIELDS or name in _OPTIONAL_TIME_STEP_FIELDS and record[name] is not None:
            values.append(_epoch_ms(record, name))
        elif name in _BOOL_STEP_FIELDS:
            values.append(int(bool(record[name])))
        elif name in ("prompt_token_ids", "response_token_ids"):
            values.append(_token_ids(record, name))
        elif name == "response_logprobs":
            values.append(record[name] or [])
        else:
            values.append(record[name])
    return (*values, *_source(origin, now_ms))


def feedback_row(record: dict[str, Any], origin: Origin, now_ms: int) -> tuple[Any, ...]:
    return (
        record["feedback_id"], record["target_kind"], record["target_id"], record["reward"],
        record["components"], int(record["final"]), record["source"], record["source_name"], record["label"],
        record["comment"], record["correction"], _epoch_ms(record, "received_at_ms"), int(record["terminal"]),
        *_source(origin, now_ms),
    )


def prefix_node_row(record: dict[str, Any], origin: Origin, now_ms: int) -> tuple[Any, ...]:
    return (
        record["scope_id"], record["scope_kind"], record["node_id"], record["parent_node_id"],
        record["depth_start"], _token_ids(record, "token_ids"), record["step_ids"], record["version"],
        record["total_tokens"], record["tree_tokens"], record["forks"], _epoch_ms(record, "updated_at_ms"),
        *_source(origin, now_ms),
    )


def dead_letter_row(record: dict[str, Any], origin: Origin, now_ms: int) -> tuple[Any, ...]:
    """A dead letter published by another stage on the DLQ topic; ``origin`` is its place in that topic."""
    return (
        record["dlq_id"], record["reason"], record["stage"], record["source_topic"],
        record["source_partition"], record["source_offset"], record["original_key"], record["original_value"],
        _epoch_ms(record, "failed_at_ms"), now_ms, origin.topic, origin.partition, origin.offset,
    )


def sink_dead_letter_row(origin: Origin, reason: str, now_ms: int) -> tuple[Any, ...]:
    """A message the sink itself could not store: kept whole, with the reason, keyed by its offset."""
    return (
        origin.position, reason, "sink", origin.topic, origin.partition,
        origin.offset, origin.key, origin.original(), now_ms, now_ms, "", -1, -1,
    )


@dataclass(frozen=True)
class TableRoute:
    """Which schema a topic carries and how its records become rows of which table.

    A route with ``columnar`` set takes an envelope's records as Arrow columns (``sinks/columns.py``);
    ``times`` (epoch milliseconds, optional ones may be null) and ``states`` (one of
    ``REWARD_STATES``) are the checks ``to_row`` makes beyond the token ids, which that path makes too.
    """

    schema: str
    table: str
    columns: Sequence[str]
    to_row: Callable[[dict[str, Any], Origin, int], tuple[Any, ...]]
    columnar: bool = False
    times: frozenset[str] = frozenset()
    states: tuple[str, ...] = ()


STEPS_ROUTE = TableRoute(STEPS.schema, "step_versions", STEP_COLUMNS, step_row, columnar=True,
                         times=_TIME_STEP_FIELDS | _OPTIONAL_TIME_STEP_FIELDS,
                         states=STEP_STATES)
FEEDBACK_ROUTE = TableRoute(RAW_FEEDBACK.schema, "feedback_log", FEEDBACK_COLUMNS, feedback_row)
PREFIX_NODES_ROUTE = TableRoute(PREFIX_NODES.schema, "prefix_node_versions", PREFIX_NODE_COLUMNS,
                                prefix_node_row, columnar=True, times=frozenset({"updated_at_ms"}))
DLQ_ROUTE = TableRoute(DLQ.schema, "dead_letter_log", DEAD_LETTER_COLUMNS, dead_letter_row)
