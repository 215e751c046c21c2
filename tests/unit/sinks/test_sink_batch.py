"""Sink batches: offsets to commit, deterministic dedup tokens, flush triggers, lost partitions."""

from __future__ import annotations

import pyarrow as pa
import pytest

from clawr1.core.settings import load_settings
from clawr1.core.thin_batch import NEVER, ThinWait
from clawr1.sinks.batch import Batch, ColumnPart, Envelope, RowPart, TableRows
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.rows import Origin


def origin(partition: int, offset: int, topic: str = "steps") -> Origin:
    return Origin(topic, partition, offset, None, None)


def filled(offsets: list[tuple[int, int]]) -> Batch:
    batch = Batch(started=0.0)
    for partition, offset in offsets:
        o = origin(partition, offset)
        batch.add("step_versions", ("step_id",), (f"{partition}:{offset}",), o)
        batch.consumed(o)
    return batch


def test_commit_offsets_are_one_past_the_last_message_per_partition() -> None:
    batch = filled([(0, 5), (1, 9), (0, 6), (0, 7)])
    assert batch.commit_offsets() == [("steps", 0, 8), ("steps", 1, 10)]


def test_dedup_token_depends_on_the_ranges_not_on_arrival_order() -> None:
    a = filled([(0, 5), (1, 9), (0, 6)])
    b = filled([(1, 9), (0, 6), (0, 5)])
    assert a.dedup_token("step_versions") == b.dedup_token("step_versions")
    assert a.dedup_token("step_versions") != a.dedup_token("dead_letter_log")
    assert a.dedup_token("step_versions") != filled([(0, 5), (1, 9)]).dedup_token("step_versions")


def test_due_by_size_or_age() -> None:
    batch = filled([(0, 1), (0, 2)])
    assert not Batch().is_due(1, 0.0, NEVER)
    assert batch.is_due(2, 100.0, NEVER, now=1.0)
    assert not batch.is_due(3, 100.0, NEVER, now=1.0)
    assert batch.is_due(3, 100.0, NEVER, now=100.0)


def test_an_open_batch_says_how_long_it_may_still_wait() -> None:
    batch = filled([(0, 1)])
    batch.started = 10.0
    assert Batch().seconds_until_due(0.25, NEVER) is None
    assert batch.seconds_until_due(0.25, NEVER, now=10.1) == pytest.approx(0.15)
    assert batch.seconds_until_due(0.25, NEVER, now=11.0) == 0.0
    assert batch.is_due(100, 0.25, NEVER, now=10.25)


def test_a_thin_batch_waits_longer_since_the_previous_flush_and_a_filled_one_does_not() -> None:
    thin = ThinWait(1.0, fill=3)
    batch = filled([(0, 1), (0, 2)])
    batch.started = 10.0  # the previous flush
    assert batch.seconds_until_due(0.25, thin, now=10.25) == pytest.approx(0.75)
    assert not batch.is_due(100, 0.25, thin, now=10.5)
    assert batch.is_due(100, 0.25, thin, now=11.0)
    batch.add("step_versions", ("step_id",), ("0:3",), origin(0, 3))  # a third row: filled
    assert batch.is_due(100, 0.25, thin, now=10.25)


def test_rows_are_stamped_when_written() -> None:
    batch = Batch()
    batch.add("feedback", ("feedback_id", "ingested_at", "source_offset"), ("f1", 1, 7), origin(0, 7))
    batch.add("feedback", ("feedback_id", "ingested_at", "source_offset"), ("f2", 2, 8), origin(0, 8))
    batch.tables["feedback"].restamp("ingested_at", 99)
    assert batch.tables["feedback"].rows == [("f1", 99, 7), ("f2", 99, 8)]


def test_lost_partitions_are_forgotten() -> None:
    batch = filled([(0, 1), (1, 1), (1, 2)])
    batch.drop_partitions({("steps", 1)})
    assert batch.commit_offsets() == [("steps", 0, 2)]
    assert batch.tables["step_versions"].rows == [("0:1",)]
    assert batch.messages == 1


def envelope_of(partition: int, offset: int, ids: list[str]) -> Envelope:
    """An envelope whose record ``i`` cites itself as ``(partition, offset, i)``."""
    return Envelope([{"step_id": i} for i in ids], origin(partition, offset),
                    lambda i: Origin("steps", partition, offset, None, None, index=i))


def with_envelopes() -> Batch:
    batch = Batch()
    for partition, offset, ids in ((0, 4, ["a", "b"]), (1, 9, ["c", "d", "e"])):
        batch.add_envelope("step_versions", ("step_id",), envelope_of(partition, offset, ids))
        batch.consumed(origin(partition, offset))
    return batch


def built(rows: TableRows) -> TableRows:
    """As the sink's flush leaves a table: its envelopes' records as one block."""
    rows.columns_data = pa.table({"step_id": [r["step_id"] for e in rows.envelopes for r in e.records]})
    return rows


def test_envelopes_are_one_insert_that_splits_and_cites_each_record() -> None:
    batch = with_envelopes()
    assert batch.rows == 5 and len(batch.tables["step_versions"]) == 5
    with pytest.raises(RuntimeError, match="not built"):
        batch.tables["step_versions"].parts("tok")
    [(token, part)] = built(batch.tables["step_versions"]).parts("tok")
    assert token == "tok" and isinstance(part, ColumnPart)
    middle = part.slice(1, 4)
    assert middle.data.column("step_id").to_pylist() == ["b", "c", "d"]
    assert [middle.origin(i).position for i in range(3)] == ["steps:0:4#1", "steps:1:9#0", "steps:1:9#1"]


def test_rows_and_envelopes_of_one_table_are_two_inserts_with_their_own_tokens() -> None:
    batch = with_envelopes()
    batch.add("step_versions", ("step_id",), ("r",), origin(2, 1))
    parts = built(batch.tables["step_versions"]).parts("tok")
    assert [(token, type(part)) for token, part in parts] == [("tok", RowPart), ("tok/columns", ColumnPart)]
    assert [len(part) for _, part in parts] == [1, 5]


def test_lost_partitions_take_their_envelopes_along() -> None:
    batch = with_envelopes()
    batch.drop_partitions({("steps", 1)})
    assert batch.rows == 2 and batch.messages == 1
    [(_, part)] = built(batch.tables["step_versions"]).parts("tok")
    assert part.data.column("step_id").to_pylist() == ["a", "b"]


def test_sink_config_reads_overrides_from_the_environment() -> None:
    settings = load_settings({"CLAWR1_SINK_STEPS_TOPIC": "s.x", "CLAWR1_SINK_GROUP": "g",
                              "CLAWR1_SINK_BATCH_ROWS": "7", "CLAWR1_SINK_EXIT_AFTER_INSERT": "1"})
    config = SinkConfig.from_settings(settings)
    assert (config.steps_topic, config.group_id, config.batch_rows, config.exit_after_insert) == (
        "s.x", "g", 7, True)
    assert config.dlq_topic == "clawr1.dlq" and config.feedback_topic == "clawr1.raw.feedback"
    assert SinkConfig.from_settings(load_settings({})) == SinkConfig()
