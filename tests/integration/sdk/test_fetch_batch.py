"""Channels and the seed system's ``fetch_batch`` over the real pool, both transports."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from clawr1.consumer_sdk import PoolConsumer, save_preset
from tests.support.pool import Pool, step
from tests.support.waiting import holds_for


def rollout(group: str, trajectory: str, index: int, *, created: int, **fields: Any) -> dict[str, Any]:
    fields.setdefault("terminal", True)
    return step(f"{group}-{trajectory}-{index}", trajectory_id=f"{group}-{trajectory}", step_index=index,
                prompt_group_id=group, prompt_group_size=2, created_at_ms=1_760_000_000_000 + created,
                **fields)


def test_consumers_read_one_channel_train_by_default(pool: Pool, source: str) -> None:
    pool.write(step("t1"), step("t2", channel="train"), step("v1", channel="val"),
               step("x1", channel="other"))
    with PoolConsumer(source, "default") as c:
        assert sorted(c.poll().step_ids) == ["t1", "t2"]
    with PoolConsumer(source, "val", channel="val") as c:
        assert list(c.poll().step_ids) == ["v1"]
        assert all(s.metadata["channel"] == "val" for s in c.poll())
    with PoolConsumer(source, "all", channel=None) as c:
        assert sorted(c.poll().step_ids) == ["t1", "t2", "v1", "x1"]
    save_preset(source, "validation", channel=["val", "other"])
    with PoolConsumer(source, "preset", preset="validation") as c:
        assert sorted(c.poll().step_ids) == ["v1", "x1"]


def test_fetch_batch_blocks_until_groups_complete_then_returns_them_fifo(pool: Pool, source: str) -> None:
    # Group A started first (created earlier) but completes last; B completes first.
    pool.write(rollout("A", "a", 0, created=1, terminal=False), rollout("B", "a", 0, created=5),
               rollout("B", "b", 0, created=6))
    got: dict[str, Any] = {}
    with PoolConsumer(source, "trainer") as c:
        assert not c.fetch_batch(2, n_rollouts=2, timeout=0.3)  # only B is complete
        fetching = threading.Thread(target=lambda: got.setdefault("batch", c.fetch_batch(2, n_rollouts=2)))
        fetching.start()
        holds_for(fetching.is_alive, 1.0, message="fetch_batch returned before two groups were complete")
        pool.write(rollout("A", "a", 1, created=2), rollout("A", "b", 0, created=3))
        fetching.join(30)
        assert not fetching.is_alive()
        batch = got["batch"]
        # FIFO by group: A (first created) before B, whatever order they completed in.
        assert list(batch.step_ids) == ["A-a-0", "A-a-1", "A-b-0", "B-a-0", "B-b-0"]
        assert c.uncommitted == 5
        arrays = batch.to_verl(as_dataproto=False)
        assert arrays["non_tensor_batch"]["uid"].tolist() == ["A", "A", "A", "B", "B"]
        assert arrays["responses"].shape[0] == 5
        c.commit()
        assert not c.fetch_batch(1, n_rollouts=2, timeout=0.2), "committed groups are not delivered again"


def test_fetch_batch_takes_n_rollouts_per_group_and_skips_a_group_that_never_completes(
    pool: Pool, source: str
) -> None:
    pool.write(
        rollout("stuck", "a", 0, created=0, terminal=False),  # a crashed rollout: never completes
        rollout("stuck", "b", 0, created=0),
        *(rollout("wide", t, 0, created=1) for t in "abc"),  # three rollouts, n_rollouts=2 takes two
        rollout("late", "a", 0, created=2), rollout("late", "b", 0, created=2, ready=False),
        rollout("other", "a", 0, created=3, channel="val"),
        rollout("other", "b", 0, created=3, channel="val"),
    )
    with PoolConsumer(source, "n-rollouts") as c:
        batch = c.fetch_batch(1, n_rollouts=2, timeout=5)
        assert list(batch.step_ids) == ["wide-a-0", "wide-b-0"]
        assert not c.fetch_batch(1, n_rollouts=2, timeout=0.2)  # "wide" has one left, "late" waits
        val = c.fetch_batch(1, n_rollouts=2, channel="val", timeout=5)
        assert list(val.step_ids) == ["other-a-0", "other-b-0"]
        pool.write(rollout("late", "b", 0, version=2, created=2))
        assert list(c.fetch_batch(1, n_rollouts=None, timeout=5).step_ids) == ["late-a-0", "late-b-0"]


def test_fetch_batch_to_verl_scores_the_outcome(pool: Pool, source: str) -> None:
    pool.write(
        rollout("R", "a", 0, created=0, terminal=False, response_logprobs=[-0.5, -0.5]),
        rollout("R", "a", 1, created=1, trajectory_reward=1.0, response_logprobs=[-0.1, -0.2]),
        rollout("R", "b", 0, created=2, trajectory_reward=0.0, response_logprobs=[-0.3, -0.4],
                metadata_json='{"ground_truth": "7"}'),
    )
    with PoolConsumer(source, "verl") as c:
        out = c.fetch_batch(1, n_rollouts=2, timeout=5).to_verl(as_dataproto=False)
    assert out["token_level_scores"].tolist() == [[0, 0], [0, 1.0], [0, 0]]
    assert out["rollout_log_probs"].dtype == np.float32
    assert out["non_tensor_batch"]["trajectory_uids"].tolist() == ["R-a", "R-a", "R-b"]
    assert out["non_tensor_batch"]["ground_truth"].tolist() == [None, None, "7"]
