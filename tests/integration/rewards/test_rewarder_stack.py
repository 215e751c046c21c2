"""`clawr1 up` with CLAWR1_REWARD_FN: the rewarder role scores white-box trajectories as they complete,
the reward joins the steps in the pool under its source, and a failing call lands in dead_letters."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.live_stack import clawr1_up, pool_sql
from tests.support.metrics import scrape, total
from tests.support.ports import free_port
from tests.support.waiting import wait_until

SPEC = "clawr1.rewards.rules:math_answer"


@pytest.fixture(scope="module")
def rewarder_metrics() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, rewarder_metrics: str) -> Iterator[str]:
    data = tmp_path_factory.mktemp("reward-stack") / "data"
    env = {"CLAWR1_REWARD_FN": SPEC,
           "CLAWR1_REWARDER_METRICS_PORT": rewarder_metrics.split(":")[2].split("/")[0]}
    with clawr1_up(data, env=env, reverse=False) as live:
        api = live.url("api")
        assert httpx.get(f"{api}/healthz").json()["parts"]["rewarder"] is True
        yield api


def _rows(api: str, query: str, want: int, timeout: float = 120.0) -> list[dict[str, object]]:
    def enough() -> list[dict[str, object]]:
        rows = pool_sql(api, query)
        return rows if len(rows) >= want else []

    return wait_until(enough, timeout, interval=1, message=f"{query!r} gave fewer than {want} rows")


def test_rewarder_scores_completed_trajectories_into_the_pool(stack: str, rewarder_metrics: str) -> None:
    before = scrape(rewarder_metrics)
    steps = [
        {"trajectory_id": "rw-right", "step_index": 0, "prompt_token_ids": [1, 2], "response_token_ids": [3],
         "response_text": "let me think", "metadata": {"ground_truth": "12"}},
        {"trajectory_id": "rw-right", "step_index": 1, "prompt_token_ids": [1, 2, 3, 4],
         "response_token_ids": [5],
         "response_text": r"so \boxed{12}", "terminal": True, "metadata": {"ground_truth": "12"}},
        {"trajectory_id": "rw-wrong", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [6],
         "response_text": "13", "terminal": True, "metadata": {"ground_truth": "12"}},
        {"trajectory_id": "rw-broken", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [7],
         "response_text": "12", "terminal": True},
    ]
    reply = httpx.post(f"{stack}/v1/steps", json=steps)
    assert reply.status_code == 202, reply.text

    rewarded = _rows(
        stack,
        "SELECT trajectory_id, step_index, trajectory_reward, trajectory_reward_status FROM steps "
        "WHERE trajectory_id IN ('rw-right', 'rw-wrong') AND trajectory_reward IS NOT NULL "
        "ORDER BY trajectory_id, step_index",
        3,
    )
    assert [(r["trajectory_id"], r["step_index"], r["trajectory_reward"]) for r in rewarded] == [
        ("rw-right", 0, 1.0), ("rw-right", 1, 1.0), ("rw-wrong", 0, 0.0)]
    assert {r["trajectory_reward_status"] for r in rewarded} == {"final"}
    feedback = pool_sql(stack, "SELECT target_id, source, source_name FROM feedback "
                           "WHERE target_id IN ('rw-right', 'rw-wrong', 'rw-broken') ORDER BY target_id")
    assert [(r["target_id"], r["source"], r["source_name"]) for r in feedback] == [
        ("rw-right", "reward_fn", SPEC), ("rw-wrong", "reward_fn", SPEC)]

    letters = _rows(stack, "SELECT stage, reason FROM dead_letters WHERE stage = 'reward'", 1)
    assert len(letters) == 1 and "rw-broken" in str(letters[0]["reason"])
    assert "no ground truth" in str(letters[0]["reason"])
    after = scrape(rewarder_metrics)  # counted before the rewarder produced: the pool saw them later

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("clawr1_rewarder_steps_total") >= 4
    assert grew("clawr1_rewarder_feedback_total") == 2
    assert grew("clawr1_rewarder_dead_letters_total", stage="reward") == 1
    lag = 'clawr1_consumer_lag{group="clawr1-rewarder",topic="clawr1.steps"}'
    if lag not in after:  # sampled every few seconds; a failed sample is retried in 1 s
        wait_until(lambda: lag in scrape(rewarder_metrics), 30, interval=0.5, message=f"{lag} never sampled")
