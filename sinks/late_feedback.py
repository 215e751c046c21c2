"""Feedback that came after the worker let its step's state go, joined in the pool.

The worker keeps a trajectory's state for ``CLAWR1_STREAMS_STATE_TTL_S`` after its last event; feedback
for a step it no longer holds (a human curating yesterday's steps, a slow reward model) leaves it as a
dead letter of stage ``expire`` that carries the feedback. The sink stores that dead letter as any
other and, in the same flush, before its offsets are committed, finds the targeted steps in the pool,
folds the feedback into their last version as the worker would have (``clawr1.streams.join.rejoin``)
and inserts the next version. A replay finds the feedback already in the row and writes nothing.
Feedback that names no step in the pool (it never arrived, or a response id several steps share),
or a step of another source without being privileged (``clawr1.streams.ownership``), stays a dead
letter only.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from clawr1.pool.store import PoolStore
from clawr1.schemas.codec import AvroCodec, DecodeError
from clawr1.streams.join import rejoin
from clawr1.streams.ownership import counts
from clawr1.streams.readiness import ReadinessRule
from clawr1.streams.rewards import feedback_fact
from clawr1.streams.turns import InvalidEvent

log = logging.getLogger("clawr1.sink")

EXPIRED_STAGE = "expire"

# The step's last version, times as epoch milliseconds as the step record has them.
_STEPS_SQL = """
SELECT * EXCEPT (ingested_at) REPLACE (
    toUnixTimestamp64Milli(created_at_ms) AS created_at_ms,
    toUnixTimestamp64Milli(updated_at_ms) AS updated_at_ms,
    if(prompt_group_closes_at_ms IS NULL, NULL,
       toUnixTimestamp64Milli(assumeNotNull(prompt_group_closes_at_ms))) AS prompt_group_closes_at_ms)
FROM steps
WHERE {column} = {{target:String}}
"""
_COLUMN = {"trajectory": "trajectory_id", "step": "step_id", "response": "response_id"}


def expired_feedback(letter: dict[str, Any], codec: AvroCodec) -> dict[str, Any] | None:
    """The feedback fact an ``expire`` dead letter carries: the fact itself (JSON), or the raw feedback
    event it was held as; None for any other dead letter."""
    value = letter.get("original_value")
    if letter.get("stage") != EXPIRED_STAGE or not value:
        return None
    try:
        if value[:1] == b"{":
            fact: dict[str, Any] = orjson.loads(value)
            return fact
        return feedback_fact(codec.decode(value, expect="feedback")[1])
    except (DecodeError, InvalidEvent, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        log.warning("dead letter %s carries no readable feedback: %s", letter.get("dlq_id"), exc)
        return None


def rejoined_steps(store: PoolStore, facts: list[dict[str, Any]], rule: ReadinessRule
                   ) -> list[dict[str, Any]]:
    """The next version of every step the facts name, each fact folded in order."""
    latest: dict[str, dict[str, Any]] = {}
    for fact in facts:
        rows = store.query(_STEPS_SQL.format(column=_COLUMN[fact["target_kind"]]),
                           parameters={"target": fact["target_id"]})
        if fact["target_kind"] == "response" and len(rows) != 1:
            continue  # names several steps, or none: the dead letter says so
        for row in rows:
            if not counts(row["source_name"], fact):  # the worker's rule (clawr1.streams.ownership)
                log.warning("late feedback %s of %r not joined to step %s of %r: not its source's",
                            fact["feedback_id"], fact["source_name"], row["step_id"], row["source_name"])
                continue
            record = rejoin(latest.get(row["step_id"], row), fact, rule)
            if record is not None:
                latest[row["step_id"]] = record
    return list(latest.values())
