"""The sink's columnar path against the row path, in the real pool: the same records stored as Arrow
blocks and as row tuples read back the same, and what the row path refuses is never built."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from clawr1.pool.store import PoolStore
from clawr1.schemas.codec import pack_record
from clawr1.sinks.columns import ColumnPlan
from clawr1.sinks.rows import PREFIX_NODES_ROUTE, STEPS_ROUTE, Origin, RowError, TableRoute
from tests.support.records import record, step

AT = Origin("clawr1.steps", 3, 70, None, None)
STAMP = 1_760_000_009_000


def varied_steps() -> list[dict[str, Any]]:
    """Steps that use every kind of column: nulls and values, maps, labels, logprobs, wide ids, text."""
    return [
        step("s-plain", 1),
        step("s-full", 7, trajectory_id="t-ü", step_index=3, parent_step_id="s-plain", prompt_group_id="g",
             prompt_group_size=4, agent="coder", model="m-1", policy_version=12, latency_ms=250,
             usage_prompt_tokens=3, usage_completion_tokens=2, prompt_messages='[{"role":"user"}]',
             response_text="done ✓", prompt_token_ids=[0, 1, 2**31 - 1], response_token_ids=[151_935],
             response_logprobs=[-0.5, -1.25], tokenizer="tok", reward=0.75,
             reward_components={"pass": 1.0, "style": -0.5}, reward_source="judge", reward_status="final",
             trajectory_reward=1.5, terminal=True, quality_labels=["good", "long"], quality_score=0.9,
             status="ok", error="none", ready=True, trajectory_reward_status="final", channel="eval",
             link_status="inferred", link_candidate_step_id="s-x", prompt_group_inferred=True,
             prompt_group_closes_at_ms=1_760_000_001_000),
        step("s-empty", 2, prompt_token_ids=[], response_token_ids=[], response_logprobs=None),
    ]


def nodes() -> list[dict[str, Any]]:
    return [record("prefix_node", scope_id="g", scope_kind="prompt_group", node_id=f"n{i}",
                   parent_node_id=None if i == 0 else f"n{i - 1}", depth_start=i * 3,
                   token_ids=list(range(i * 3, i * 3 + 3)), step_ids=[f"s{i}", "s9"], version=i + 1,
                   total_tokens=30, tree_tokens=12, forks=i, updated_at_ms=1_760_000_000_000 + i)
            for i in range(3)]


def stored_both_ways(store: PoolStore, route: TableRoute, records: list[dict[str, Any]]) -> list[list[Any]]:
    """The records inserted by the row path and by the columnar path into two copies of the table."""
    for name in ("by_rows", "by_columns"):
        store.command(f"CREATE TABLE {name} AS {route.table}")
    store.insert("by_rows", [route.to_row(r, AT, STAMP) for r in records], route.columns)
    block = ColumnPlan.of(route).build([([pack_record(route.schema, r) for r in records], AT)], STAMP)
    assert block is not None
    store.insert_arrow("by_columns", block)
    return [store.query(f"SELECT * FROM {name} ORDER BY {route.columns[0]}, {route.columns[2]}")
            for name in ("by_rows", "by_columns")]


def test_steps_stored_as_columns_read_back_as_rows_do(pool_store: PoolStore) -> None:
    by_rows, by_columns = stored_both_ways(pool_store, STEPS_ROUTE, varied_steps())
    assert len(by_rows) == 3
    assert by_columns == by_rows
    full = next(r for r in by_columns if r["step_id"] == "s-full")
    assert full["prompt_token_ids"] == [0, 1, 2**31 - 1] and full["response_logprobs"] == [-0.5, -1.25]
    assert full["reward_components"] == {"pass": 1.0, "style": -0.5} and full["terminal"] == 1


def test_prefix_nodes_stored_as_columns_read_back_as_rows_do(pool_store: PoolStore) -> None:
    by_rows, by_columns = stored_both_ways(pool_store, PREFIX_NODES_ROUTE, nodes())
    assert len(by_rows) == 3
    assert by_columns == by_rows


@pytest.mark.parametrize("fields", [
    {"prompt_token_ids": [5, -1]},
    {"response_token_ids": [-7]},
    {"reward_status": "maybe"},
    {"trajectory_reward_status": ""},
    {"created_at_ms": -1},
    {"updated_at_ms": 10_000_000_000_000},
    {"prompt_group_closes_at_ms": 10_000_000_000_000},
], ids=lambda fields: next(iter(fields)))
def test_a_record_the_row_path_refuses_is_never_built(fields: dict[str, Any]) -> None:
    records = [*varied_steps(), step("s-bad", 1, **fields)]
    with pytest.raises(RowError):
        STEPS_ROUTE.to_row(records[-1], AT, STAMP)
    plan = ColumnPlan.of(STEPS_ROUTE)
    assert plan.build([([pack_record("step", r) for r in records], AT)], STAMP) is None
    assert plan.build([([pack_record("step", r) for r in records[:-1]], AT)], STAMP) is not None


def test_a_packed_array_of_a_size_no_array_has_is_not_built() -> None:
    packed = pack_record("step", step("s-odd", 1))
    packed["prompt_token_ids"] += b"\x01"
    assert ColumnPlan.of(STEPS_ROUTE).build([([packed], AT)], STAMP) is None


def test_one_block_of_several_envelopes_keeps_each_records_source() -> None:
    packed = [pack_record("step", r) for r in varied_steps()]
    later = Origin("clawr1.steps", 1, 12, None, None)
    block = ColumnPlan.of(STEPS_ROUTE).build([(packed[:2], AT), (packed[2:], later)], STAMP)
    assert block is not None
    assert block.column("step_id").to_pylist() == ["s-plain", "s-full", "s-empty"]
    assert block.column("source_partition").to_pylist() == [3, 3, 1]
    assert block.column("source_offset").to_pylist() == [70, 70, 12]
    # 64-bit offsets: a flush's token ids may number more than 2^31.
    assert block.schema.field("prompt_token_ids").type == pa.large_list(pa.uint32())
