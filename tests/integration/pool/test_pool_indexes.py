"""Id lookups on a million steps read a few granules, not the table (EXPLAIN indexes = 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clawr1.pool.store import PoolStore
from tests.support.pool import fresh_pool_store, granules

STEPS = 1_000_000
GENERATE = f"""
INSERT INTO step_versions (step_id, version, trajectory_id, step_index, prompt_group_id, prompt_id,
    response_id, source_kind, source_name, policy_version, created_at_ms, updated_at_ms, prompt_token_ids,
    response_token_ids, token_provenance, reward, reward_status, ready, status, trajectory_reward_status)
SELECT concat('step-', toString(number)), 1, concat('traj-', toString(intDiv(number, 8))), number % 8,
       concat('group-', toString(intDiv(number, 64))), hex(sipHash64(number, 'prompt')),
       hex(sipHash64(number, 'response')), 'whitebox_agent', 'bench', intDiv(number, 250000),
       fromUnixTimestamp64Milli(toInt64(1760000000000 + number)),
       fromUnixTimestamp64Milli(toInt64(1760000000000 + number)), range(number % 5, number % 5 + 6), [1, 2],
       'engine', (number % 100) / 100, if(number = 777777, 'pending', 'final'), 1, 'ok', 'pending'
FROM numbers({STEPS})
"""


@pytest.fixture(scope="module")
def million_steps(pool_dsn: str) -> Iterator[PoolStore]:
    """Shared by this module's read-only tests: generating a million steps takes seconds."""
    with fresh_pool_store(pool_dsn) as store:
        store.command(GENERATE)
        yield store


def test_lookups_by_id_and_flags_skip_almost_all_granules(million_steps: PoolStore) -> None:
    store = million_steps
    total = store.query("SELECT count() AS n FROM steps")[0]["n"]
    assert total == STEPS
    prompt_id = store.query("SELECT hex(sipHash64(toUInt64(123456), 'prompt')) AS p")[0]["p"]
    response_id = store.query("SELECT hex(sipHash64(toUInt64(654321), 'response')) AS r")[0]["r"]
    cases = {
        f"SELECT step_id FROM steps WHERE prompt_id = '{prompt_id}'": ("idx_prompt_id", "step-123456"),
        f"SELECT step_id FROM steps WHERE response_id = '{response_id}'": ("idx_response_id", "step-654321"),
        "SELECT step_id FROM steps WHERE step_id = 'step-424242'": ("idx_step_id", "step-424242"),
        "SELECT step_id FROM steps WHERE reward_status = 'pending'": ("idx_reward_status", "step-777777"),
        "SELECT step_id FROM steps WHERE trajectory_id = 'traj-99999' AND step_index = 3":
            ("PrimaryKey", "step-799995"),
    }
    for sql, (index, expected) in cases.items():
        assert [r["step_id"] for r in store.query(sql)] == [expected], sql
        kept, before = granules(store, sql)[index]
        assert before >= 100, f"{sql}: only {before} granules in the table"
        assert kept <= before // 20, f"{sql}: {index} kept {kept}/{before} granules"


def test_flag_and_version_indexes_prune_ranges(million_steps: PoolStore) -> None:
    found = granules(million_steps, "SELECT count() FROM steps WHERE prompt_group_id = 'group-1234'")
    assert found["idx_prompt_group_id"][0] <= found["idx_prompt_group_id"][1] // 20
    found = granules(million_steps, "SELECT count() FROM steps WHERE reward > 2")
    assert found["idx_reward"][0] == 0
