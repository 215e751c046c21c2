"""Records -> pool rows: every step field lands in its column; what ClickHouse would reject is refused."""

from __future__ import annotations

import pytest

from clawr1.sinks.rows import (
    DEAD_LETTER_COLUMNS,
    FEEDBACK_COLUMNS,
    PREFIX_NODE_COLUMNS,
    STEP_COLUMNS,
    Origin,
    RowError,
    dead_letter_row,
    feedback_row,
    prefix_node_row,
    sink_dead_letter_row,
    step_row,
)
from tests.support.records import record, step

ORIGIN = Origin("clawr1.steps", 3, 41, b"k", b"v")
NOW = 1_760_000_000_999


def test_step_row_follows_the_columns() -> None:
    row = dict(zip(STEP_COLUMNS, step_row(step("s1", 4, terminal=True, ready=True, reward=0.5), ORIGIN, NOW),
                   strict=True))
    assert row["step_id"] == "s1" and row["version"] == 4
    assert row["terminal"] == 1 and row["ready"] == 1
    assert row["response_logprobs"] == []
    assert row["created_at_ms"] == 1_760_000_000_000
    assert (row["ingested_at"], row["source_topic"], row["source_partition"], row["source_offset"]) == (
        NOW, "clawr1.steps", 3, 41)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids holds ids outside"),
    ({"response_token_ids": [2**32]}, "response_token_ids holds ids outside"),
    ({"reward_status": "done"}, "reward_status 'done'"),
    ({"trajectory_reward_status": "later"}, "trajectory_reward_status 'later'"),
    ({"created_at_ms": -5}, "created_at_ms=-5"),
    ({"updated_at_ms": 10**16}, "updated_at_ms="),
])
def test_step_values_clickhouse_would_reject_are_refused(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(RowError, match=reason):
        step_row(step("s1", **fields), ORIGIN, NOW)


def test_other_tables_rows_follow_their_columns() -> None:
    feedback = feedback_row(record("feedback", feedback_id="f", target_kind="step", target_id="s",
                                   received_at_ms=5), ORIGIN, NOW)
    assert len(feedback) == len(FEEDBACK_COLUMNS) and feedback[5] == 1  # final defaults to true
    node = prefix_node_row(record("prefix_node", scope_id="g", token_ids=[1, 2]), ORIGIN, NOW)
    assert len(node) == len(PREFIX_NODE_COLUMNS)
    dead = dead_letter_row(record("dead_letter", dlq_id="d", reason="bad", failed_at_ms=9), ORIGIN, NOW)
    assert dict(zip(DEAD_LETTER_COLUMNS, dead, strict=True))["dlq_offset"] == 41


def test_sink_dead_letter_keeps_the_message_whole_and_is_keyed_by_offset() -> None:
    row = dict(zip(DEAD_LETTER_COLUMNS, sink_dead_letter_row(ORIGIN, "undecodable", NOW), strict=True))
    assert row["dlq_id"] == "clawr1.steps:3:41"
    assert (row["stage"], row["reason"], row["original_key"], row["original_value"]) == (
        "sink", "undecodable", b"k", b"v")
