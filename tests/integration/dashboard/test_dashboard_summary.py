"""GET /v1/dashboard/summary over the real chDB pool: every panel's numbers, on an empty and a seeded pool."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.integration.dashboard.conftest import SECOND, T0


def strict_json(text: str) -> Any:
    """JSON as a browser parses it: NaN or Infinity would fail here (and in JSON.parse)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def summary_of(client: TestClient) -> dict[str, Any]:
    response = client.get("/v1/dashboard/summary")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return strict_json(response.text)


def test_an_empty_pool_answers_every_panel_with_zeros(empty_client: TestClient) -> None:
    body = summary_of(empty_client)
    assert body["totals"] == {
        "steps": 0,
        "ready_steps": 0,
        "failed_steps": 0,
        "trajectories": 0,
        "prompt_groups": 0,
        "dead_letters": 0,
        "savings_ratio": 1.0,
        "consumer_groups": 0,
        "last_step_ms": None,
    }
    collection = body["collection"]
    assert collection["channels"] == [
        {"channel": c, "steps": 0, "failed": 0} for c in ("proxy", "gateway", "service", "otel")
    ]
    assert collection["sources"] == collection["recent_failures"] == collection["engines"] == []
    assert collection["timeline"]["buckets"] == collection["timeline"]["by_kind"] == []
    representation = body["representation"]
    assert representation["trajectories"]["trajectories"] == 0
    assert representation["trajectories"]["mean_steps"] is None  # avg of nothing: NaN in ClickHouse
    assert representation["steps_per_trajectory"] == []
    assert [p["steps"] for p in representation["provenance"]] == [0, 0, 0]
    assert representation["prompt_groups"] == {"groups": 0, "complete": 0, "ungrouped_steps": 0, "latest": []}
    curation = body["curation"]
    assert curation["totals"]["steps"] == 0 and curation["totals"]["mean_quality_score"] is None
    assert curation["reward_by_version"] == curation["quality_labels"] == curation["feedback"] == []
    assert curation["reward_histogram"]["versions"] == [] and curation["reward_histogram"]["low"] is None
    assert curation["dead_letters"] == {"total": 0, "by_reason": []}
    assert body["optimization"]["overall"]["total_tokens"] == 0
    assert body["optimization"]["by_kind"] == body["optimization"]["scopes"] == []
    assert body["consumption"]["groups"] == []


def test_collection_counts_sources_channels_failures_and_the_timeline(client: TestClient) -> None:
    collection = summary_of(client)["collection"]
    assert collection["channels"] == [
        {"channel": "proxy", "steps": 2, "failed": 1},
        {"channel": "gateway", "steps": 5, "failed": 0},
        {"channel": "service", "steps": 1, "failed": 0},
        {"channel": "otel", "steps": 0, "failed": 0},
    ]
    assert [
        (s["source_kind"], s["source_name"], s["channel"], s["steps"], s["failed"], s["mean_latency_ms"])
        for s in collection["sources"]
    ] == [
        ("blackbox_agent", "proxy-1", "proxy", 2, 1, None),
        ("blackbox_service", "svc-chat", "service", 1, 0, None),
        ("whitebox_agent", "trainer-a", "gateway", 5, 0, 200.0),
    ]
    assert collection["first_step_ms"] == T0 and collection["last_step_ms"] == T0 + 125 * SECOND
    assert [(f["step_id"], f["error"]) for f in collection["recent_failures"]] == [("c1", "upstream 502")]
    # The engines that served captured steps (no proxy shares this test's data dir: no state).
    assert [(e["engine"], e["state"], e["steps"], e["failed"], e["calls_per_s"])
            for e in collection["engines"]] == [("http://engine-1", None, 1, 0, 0.0),
                                                ("http://engine-2", None, 1, 1, 0.0)]
    # 125 s of steps: 5 s buckets, 26 of them, from T0.
    timeline = collection["timeline"]
    assert timeline["bucket_ms"] == 5 * SECOND
    assert timeline["buckets"] == [T0 + i * 5 * SECOND for i in range(26)]

    def at(*indexes: int) -> list[int]:
        return [indexes.count(i) for i in range(26)]

    assert timeline["by_kind"] == [
        {"source_kind": "blackbox_agent", "channel": "proxy", "steps": at(12, 14), "failed": at(14)},
        {"source_kind": "blackbox_service", "channel": "service", "steps": at(25), "failed": at()},
        {"source_kind": "whitebox_agent", "channel": "gateway", "steps": at(0, 2, 4, 6, 8), "failed": at()},
    ]
    assert [(s["source_name"], sum(s["steps"])) for s in timeline["by_source"]] == [
        ("proxy-1", 2),
        ("svc-chat", 1),
        ("trainer-a", 5),
    ]


def test_representation_counts_trajectories_provenance_and_prompt_groups(client: TestClient) -> None:
    representation = summary_of(client)["representation"]
    assert representation["trajectories"] == {
        "trajectories": 4,
        "steps": 8,
        "mean_steps": 2.0,
        "max_steps": 3,
        "terminal_trajectories": 3,
        "ready_trajectories": 2,
    }
    assert representation["steps_per_trajectory"] == [
        {"num_steps": 1, "trajectories": 1},
        {"num_steps": 2, "trajectories": 2},
        {"num_steps": 3, "trajectories": 1},
    ]
    assert representation["provenance"] == [
        {"token_provenance": "engine", "steps": 5, "prompt_tokens": 15, "response_tokens": 10},
        {"token_provenance": "retokenized", "steps": 2, "prompt_tokens": 6, "response_tokens": 4},
        {"token_provenance": "none", "steps": 1, "prompt_tokens": 0, "response_tokens": 0},
    ]
    groups = representation["prompt_groups"]
    assert (groups["groups"], groups["complete"], groups["ungrouped_steps"]) == (1, 1, 3)
    [g1] = groups["latest"]
    assert {
        k: g1[k]
        for k in (
            "prompt_group_id",
            "group_size",
            "num_trajectories",
            "num_steps",
            "distinct_prompts",
            "final_rewards",
            "all_ready",
            "started_at_ms",
        )
    } == {
        "prompt_group_id": "g1",
        "group_size": 2,
        "num_trajectories": 2,
        "num_steps": 5,
        "distinct_prompts": 5,
        "final_rewards": 4,
        "all_ready": 0,
        "started_at_ms": T0,
    }
    assert g1["mean_reward"] == pytest.approx(0.625)  # 0, 0.5, 1, 1 (b0 has none)
    assert g1["reward_std"] == pytest.approx(0.171875**0.5)


def test_curation_counts_readiness_rewards_labels_feedback_and_dead_letters(client: TestClient) -> None:
    curation = summary_of(client)["curation"]
    assert curation["totals"] == {
        "steps": 8,
        "ready_steps": 5,
        "reward_final": 5,
        "reward_pending": 3,
        "rewarded": 5,
        "failed": 1,
        "scored": 2,
        "mean_quality_score": 0.5,
    }
    assert curation["reward_by_version"] == [
        {
            "policy_version": 1,
            "steps": 3,
            "rewarded": 3,
            "final_rewards": 3,
            "ready_steps": 3,
            "mean_reward": 0.5,
            "min_reward": 0.0,
            "max_reward": 1.0,
        },
        {
            "policy_version": 2,
            "steps": 3,
            "rewarded": 2,
            "final_rewards": 2,
            "ready_steps": 2,
            "mean_reward": 0.0,
            "min_reward": -1.0,
            "max_reward": 1.0,
        },
        {
            "policy_version": None,
            "steps": 2,
            "rewarded": 0,
            "final_rewards": 0,
            "ready_steps": 0,
            "mean_reward": None,
            "min_reward": None,
            "max_reward": None,
        },
    ]
    histogram = curation["reward_histogram"]
    assert (histogram["low"], histogram["high"], histogram["bins"]) == (-1.0, 1.0, 10)
    assert histogram["edges"] == pytest.approx([-1 + 0.2 * i for i in range(11)])
    # v1: 0 -> bin 5, 0.5 -> bin 7, 1 -> the last bin; v2: -1 -> bin 0, 1 -> the last bin.
    assert histogram["versions"] == [
        {"policy_version": 1, "counts": [0, 0, 0, 0, 0, 1, 0, 1, 0, 1]},
        {"policy_version": 2, "counts": [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]},
    ]
    assert curation["quality_labels"] == [{"label": "good", "steps": 2}, {"label": "long", "steps": 1}]
    assert curation["feedback"] == [
        {
            "source": "human",
            "target_kind": "step",
            "items": 1,
            "rewards": 0,
            "final_items": 0,
            "labelled": 1,
            "corrections": 0,
        },
        {
            "source": "human",
            "target_kind": "trajectory",
            "items": 1,
            "rewards": 0,
            "final_items": 0,
            "labelled": 0,
            "corrections": 1,
        },
        {
            "source": "reward_model",
            "target_kind": "response",
            "items": 1,
            "rewards": 1,
            "final_items": 1,
            "labelled": 0,
            "corrections": 0,
        },
    ]
    assert curation["dead_letters"] == {
        "total": 3,
        "by_reason": [
            {"stage": "decode", "reason": "not avro", "letters": 2, "last_failed_ms": T0 + 2 * SECOND},
            {
                "stage": "validate",
                "reason": "missing trajectory_id",
                "letters": 1,
                "last_failed_ms": T0 + 3 * SECOND,
            },
        ],
    }


def test_optimization_reads_the_newest_merge_of_each_scope(client: TestClient) -> None:
    optimization = summary_of(client)["optimization"]
    assert optimization["overall"] == {
        "scope_kind": "all",
        "scopes": 2,
        "total_tokens": 80,
        "tree_tokens": 49,
        "saved_tokens": 31,
        "savings_ratio": pytest.approx(80 / 49),
        "forks": 2,
    }
    assert [
        (k["scope_kind"], k["scopes"], k["total_tokens"], k["tree_tokens"], k["forks"])
        for k in optimization["by_kind"]
    ] == [("prompt_group", 1, 60, 35, 2), ("trajectory", 1, 20, 14, 0)]
    assert [
        (s["scope_id"], s["saved_tokens"], s["num_nodes"], s["version"]) for s in optimization["scopes"]
    ] == [
        ("g1", 25, 3, 2),
        ("c", 6, 2, 1),
    ]


def test_consumption_counts_each_groups_commits_in_its_current_epoch_and_what_it_has_not_taken(
    client: TestClient,
) -> None:
    groups = summary_of(client)["consumption"]["groups"]
    for group in groups:
        assert group.pop("last_commit_ms") > T0  # commits are stamped by the pool's clock
    assert groups == [
        # eval: floor between c0 and c1; e1 committed svc/turn-0, its e0 commit of c0 is forgotten.
        {
            "group_name": "eval",
            "epoch": "e1",
            "floor_ms": T0 + 65 * SECOND,
            "seeks": 2,
            "committed": 1,
            "consumers": 1,
            "behind": 1,
            "behind_ready": 0,
        },
        # trainer: never sought; a0..a2 committed; b0, b1, c0, c1, svc/turn-0 left, of them b1 and svc ready.
        {
            "group_name": "trainer",
            "epoch": "",
            "floor_ms": 0,
            "seeks": 0,
            "committed": 3,
            "consumers": 2,
            "behind": 5,
            "behind_ready": 2,
        },
    ]


def test_headline_totals_agree_with_the_panels(client: TestClient) -> None:
    assert summary_of(client)["totals"] == {
        "steps": 8,
        "ready_steps": 5,
        "failed_steps": 1,
        "trajectories": 4,
        "prompt_groups": 1,
        "dead_letters": 3,
        "savings_ratio": pytest.approx(80 / 49),
        "consumer_groups": 2,
        "last_step_ms": T0 + 125 * SECOND,
    }
