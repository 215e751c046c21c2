"""The export over the pool API (guarded SQL) on steps written the sink's way: several versions of a
step, one landing during the export; pages, shards, counts and both groupings, without a stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawr1.consumer_sdk import PoolConsumer, export_dataset
from clawr1.consumer_sdk.errors import UsageError
from tests.support.pool import Pool, step


def test_export_writes_the_snapshot_at_the_watermark_in_shards(pool: Pool, api_url: str,
                                                                tmp_path: Path) -> None:
    tokens = {"prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5], "response_logprobs": [-0.1, -0.2]}
    pool.write(*(step(f"s{t}-{i}", trajectory_id=f"t{t}", step_index=i, reward=float(i), **tokens)
                 for t in range(6) for i in range(3)), ingested_at_ms=1_000)
    pool.write(step("s0-0", trajectory_id="t0", version=2, reward=9.0), ingested_at_ms=2_000)
    out = tmp_path / "steps"
    late = []

    def meanwhile(_manifest: object) -> None:  # a new version lands while the export runs
        if not late:
            late.append(pool.write(step("s5-2", trajectory_id="t5", step_index=2, version=3, reward=5.0)))

    manifest = export_dataset(api_url, out, format="parquet", where="reward >= 1", shard_bytes=1, page_rows=4,
                              on_shard=meanwhile)
    assert late and manifest.complete and len(manifest.shards) > 2
    assert manifest.rows == manifest.total_rows == 13
    import pyarrow.parquet as pq

    rows = {r["step_id"]: r for r in pq.read_table([str(out / n) for n in manifest.files]).to_pylist()}
    assert rows["s5-2"]["reward"] == 5.0  # a page holds each step's newest version when it is read
    table = pq.read_table([str(out / name) for name in manifest.files])
    assert sorted(table.column("step_id").to_pylist())[:2] == ["s0-0", "s0-1"]
    row = table.to_pylist()[0]
    assert row["input_ids"] == [1, 2, 3, 4, 5] and row["loss_mask"] == [0, 0, 0, 1, 1]
    assert row["messages"][-1]["role"] == "assistant"
    assert json.loads((out / "manifest.json").read_text())["count_sql"]
    with PoolConsumer(api_url, "export-check", ready=None) as consumer:
        grouped = consumer.export(tmp_path / "trajectories", group_by="trajectory", format="jsonl")
    assert grouped.rows == 6


def test_export_never_writes_through_a_planted_link(pool: Pool, tmp_path: Path) -> None:
    """Links planted in ``--out`` under the temporaries' names made the export overwrite their targets."""
    pool.write(*(step(f"s{i}", trajectory_id=f"t{i}") for i in range(3)))
    victim = tmp_path / "victim"
    for planted in (".data-00000.jsonl.tmp", ".manifest.json.tmp", "manifest.json", "data-00000.jsonl"):
        victim.write_text("precious")
        out = tmp_path / planted.strip(".")
        out.mkdir()
        (out / planted).symlink_to(victim)
        with pytest.raises(UsageError, match="symbolic link"):
            export_dataset(pool.direct_source, out, format="jsonl")
        assert victim.read_text() == "precious", planted

    def plant_the_next(_manifest: object) -> None:  # after the export looked at its folder
        (tmp_path / "late" / ".data-00001.jsonl.tmp").symlink_to(victim)

    with pytest.raises(UsageError, match="symbolic link"):
        export_dataset(pool.direct_source, tmp_path / "late", format="jsonl", shard_bytes=1, page_rows=1,
                       on_shard=plant_the_next)
    assert victim.read_text() == "precious"


def test_a_temporary_left_by_an_interrupted_export_is_replaced(pool: Pool, tmp_path: Path) -> None:
    pool.write(step("s0", trajectory_id="t0"))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".data-00000.jsonl.tmp").write_text("half a shard")
    (out / ".manifest.json.tmp").write_text("{")
    manifest = export_dataset(pool.direct_source, out, format="jsonl")
    assert manifest.complete and manifest.rows == 1
    assert sorted(p.name for p in out.iterdir()) == ["data-00000.jsonl", "manifest.json"]
