"""Curation over the real pool: each filter, policy freshness, token budgets and saved presets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from clawr1.consumer_sdk import (
    InvalidFilter,
    PoolConsumer,
    PresetNotFound,
    list_presets,
    load_preset,
    save_preset,
)
from tests.support.pool import Pool, step

T0 = 1_760_000_000_000

STEPS = [
    step("engine-final", token_provenance="engine", reward_status="final", reward=1.0,
         quality_labels=["good"], quality_score=0.9, source_kind="whitebox_agent", source_name="team-a",
         created_at_ms=T0, policy_version=5),
    step("retok-pending", token_provenance="retokenized", reward_status="pending", reward=None,
         source_kind="blackbox_agent", source_name="proxy", created_at_ms=T0 + 1_000, policy_version=3),
    step("none-low", token_provenance="none", reward_status="final", reward=-1.0,
         quality_labels=["toxic", "good"], quality_score=0.2, source_kind="blackbox_service",
         source_name="svc", created_at_ms=T0 + 2_000, policy_version=None),
    step("not-ready", ready=False, token_provenance="engine", reward_status="final", reward=0.5,
         created_at_ms=T0 + 3_000, policy_version=6),
]

CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({}, {"engine-final", "retok-pending", "none-low"}),
    ({"ready": None}, {"engine-final", "retok-pending", "none-low", "not-ready"}),
    ({"ready": False}, {"not-ready"}),
    ({"reward_status": "final"}, {"engine-final", "none-low"}),
    ({"reward_status": ["pending", "final"]}, {"engine-final", "retok-pending", "none-low"}),
    ({"min_reward": 0.0}, {"engine-final"}),
    ({"max_reward": 0.0}, {"none-low"}),
    ({"min_reward": -2, "max_reward": 2}, {"engine-final", "none-low"}),
    ({"quality_labels": "good"}, {"engine-final", "none-low"}),
    ({"quality_labels": ["good", "toxic"]}, {"none-low"}),
    ({"exclude_quality_labels": "toxic"}, {"engine-final", "retok-pending"}),
    ({"min_quality_score": 0.5}, {"engine-final"}),
    ({"source_kind": "blackbox_agent"}, {"retok-pending"}),
    ({"source_kind": ["whitebox_agent", "blackbox_service"]}, {"engine-final", "none-low"}),
    ({"source_name": "svc"}, {"none-low"}),
    ({"token_provenance": "engine"}, {"engine-final"}),
    ({"since": T0 + 1_000}, {"retok-pending", "none-low"}),
    ({"until": datetime.fromtimestamp((T0 + 1_000) / 1000, tz=UTC)}, {"engine-final"}),
    ({"since": T0 + 500, "until": T0 + 1_500}, {"retok-pending"}),
    ({"min_policy_version": 4}, {"engine-final"}),
    ({"token_provenance": "engine", "ready": None, "min_policy_version": 6}, {"not-ready"}),
]


def delivered(source: str, group: str, **filters: Any) -> set[str]:
    with PoolConsumer(source, group, **filters) as consumer:
        return set(consumer.poll(max_steps=100).step_ids)


def test_each_filter_selects_its_steps(pool: Pool) -> None:
    pool.write(*STEPS)
    for filters, expected in CASES:
        assert delivered(pool.direct_source, "curate", **filters) == expected, filters


def test_filters_bind_hostile_values_as_data(pool: Pool, source: str) -> None:
    pool.write(*STEPS)
    assert delivered(source, "hostile", source_name="svc' OR 1=1 --") == set()
    assert delivered(source, "hostile2", quality_labels=["good') OR ('1'='1"]) == set()


def test_max_staleness_follows_the_reported_policy_version(pool: Pool, source: str) -> None:
    pool.write(*(step(f"v{v}", policy_version=v) for v in range(1, 7)))
    with PoolConsumer(source, "fresh", max_staleness=1) as consumer:
        consumer.report_policy_version(6)
        assert set(consumer.poll().step_ids) == {"v5", "v6"}
        consumer.commit()
        consumer.report_policy_version(3)  # e.g. a trainer restarted from an older checkpoint
        assert set(consumer.poll().step_ids) == {"v2", "v3", "v4"}


def test_max_tokens_bounds_a_batch_but_never_starves(pool: Pool, source: str) -> None:
    # Each step holds 3 prompt + 2 response tokens.
    pool.write(*(step(f"t{i}") for i in range(5)))
    with PoolConsumer(source, "budget") as consumer:
        first = consumer.poll(max_steps=10, max_tokens=12)
        assert list(first.step_ids) == ["t0", "t1"] and first.num_tokens == 10
        single = consumer.poll(max_steps=10, max_tokens=1)  # one step even when it alone is over budget
        assert list(single.step_ids) == ["t2"]
        assert list(consumer.poll(max_steps=10).step_ids) == ["t3", "t4"]


def test_presets_are_saved_in_the_pool_and_used_by_name(pool: Pool, source: str) -> None:
    pool.write(*STEPS)
    saved = save_preset(source, "engine-final", token_provenance="engine", reward_status="final")
    assert load_preset(source, "engine-final") == saved
    save_preset(source, "good", quality_labels=["good"])
    assert set(list_presets(source)) == {"engine-final", "good"}
    assert delivered(source, "p1", preset="engine-final") == {"engine-final"}
    # Keyword filters refine a preset; saving a name again replaces it.
    assert delivered(source, "p2", preset="good", exclude_quality_labels="toxic") == {"engine-final"}
    save_preset(source, "good", quality_labels=["toxic"])
    assert delivered(source, "p3", preset="good") == {"none-low"}
    with pytest.raises(PresetNotFound, match="no-such"):
        PoolConsumer(source, "p4", preset="no-such")
    with pytest.raises(InvalidFilter):
        save_preset(source, "bad", reward_status="maybe")
