"""The latest-steps table and one step's detail over the real chDB pool."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from clawr1.dashboard.api import dashboard_router
from clawr1.gateway.errors import install_error_handlers
from clawr1.pool.store import PoolStore
from tests.integration.dashboard.conftest import MESSAGES, SECOND, T0

NEWEST_FIRST = ["svc/turn-0", "c1", "c0", "b1", "b0", "a2", "a1", "a0"]


def step_ids(client: TestClient, **params: object) -> tuple[int, list[str]]:
    response = client.get("/v1/dashboard/steps", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    return body["total"], [s["step_id"] for s in body["steps"]]


def test_pages_list_the_newest_steps_first_once_each(client: TestClient) -> None:
    assert step_ids(client) == (8, NEWEST_FIRST)
    assert step_ids(client, limit=3) == (8, NEWEST_FIRST[:3])
    assert step_ids(client, limit=3, offset=6) == (8, NEWEST_FIRST[6:])
    assert step_ids(client, offset=8) == (8, [])
    row = client.get("/v1/dashboard/steps", params={"limit": 1, "offset": 6}).json()["steps"][0]
    assert {
        k: row[k]
        for k in (
            "step_id",
            "version",
            "reward",
            "reward_status",
            "ready",
            "prompt_tokens",
            "response_tokens",
            "created_ms",
            "ingested_ms",
            "policy_version",
        )
    } == {
        "step_id": "a1",
        "version": 2,
        "reward": 0.5,
        "reward_status": "final",
        "ready": 1,
        "prompt_tokens": 3,
        "response_tokens": 2,
        "created_ms": T0 + 10 * SECOND,
        "ingested_ms": T0 + 50 * SECOND,
        "policy_version": 1,
    }


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"source_kind": "whitebox_agent"}, ["b1", "b0", "a2", "a1", "a0"]),
        ({"source_kind": "blackbox_agent", "source_name": "proxy-1"}, ["c1", "c0"]),
        ({"trajectory_id": "b"}, ["b1", "b0"]),
        ({"prompt_group_id": "g1", "ready": "true"}, ["b1", "a2", "a1", "a0"]),
        ({"ready": "false"}, ["c1", "c0", "b0"]),
        ({"policy_version": 2}, ["svc/turn-0", "b1", "b0"]),
        ({"status": "failed"}, ["c1"]),
        ({"reward_status": "pending"}, ["c1", "c0", "b0"]),
        ({"token_provenance": "none"}, ["svc/turn-0"]),
        ({"source_name": "x' OR 1=1 --"}, []),  # bound as a value, never spliced into the SQL
    ],
)
def test_filters_narrow_the_table_and_its_total(
    client: TestClient, params: dict[str, object], expected: list[str]
) -> None:
    assert step_ids(client, **params) == (len(expected), expected)


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 501},
        {"offset": -1},
        {"colour": "red"},
        {"policy_version": "latest"},
        {"policy_version": 2**63},
    ],
)
def test_bad_page_parameters_are_refused_with_the_reason(
    client: TestClient, params: dict[str, object]
) -> None:
    response = client.get("/v1/dashboard/steps", params=params)
    assert response.status_code == 422
    assert next(iter(params)) in response.text


def test_a_step_detail_holds_its_text_tokens_reward_feedback_trajectory_and_merge(client: TestClient) -> None:
    response = client.get("/v1/dashboard/steps/a1")
    assert response.status_code == 200, response.text
    detail = response.json()
    step = detail["step"]
    assert step["prompt_messages"] == json.loads(MESSAGES)
    assert (step["response_text"], step["version"], step["reward"], step["reward_status"]) == (
        "4",
        2,
        0.5,
        "final",
    )
    assert (step["prompt_tokens"], step["response_tokens"], step["token_provenance"]) == (3, 2, "engine")
    assert (step["policy_version"], step["source_kind"], step["latency_ms"]) == (1, "whitebox_agent", 200)
    assert step["tool_calls"] == [] and step["feedback"] == [] and step["metadata"] == {}
    assert [(f["feedback_id"], f["target_kind"], f["reward"]) for f in detail["feedback_records"]] == [
        ("f2", "response", 0.5),
    ]
    assert [(t["step_id"], t["step_index"]) for t in detail["trajectory_steps"]] == [
        ("a0", 0),
        ("a1", 1),
        ("a2", 2),
    ]
    assert [(p["scope_kind"], p["scope_id"], p["saved_tokens"]) for p in detail["prefix_scopes"]] == [
        ("prompt_group", "g1", 25),
    ]


def test_a_step_detail_shows_trajectory_feedback_and_failures(client: TestClient) -> None:
    detail = client.get("/v1/dashboard/steps/c1").json()
    assert (detail["step"]["status"], detail["step"]["error"], detail["step"]["tokenizer"]) == (
        "failed",
        "upstream 502",
        "tok@abc",
    )
    assert [(f["feedback_id"], f["correction"]) for f in detail["feedback_records"]] == [
        ("f3", "use the cache")
    ]
    assert [(p["scope_kind"], p["scope_id"]) for p in detail["prefix_scopes"]] == [("trajectory", "c")]


def test_a_step_id_with_a_slash_reaches_its_detail(client: TestClient) -> None:
    response = client.get(f"/v1/dashboard/steps/{quote('svc/turn-0', safe='')}")
    assert response.status_code == 200, response.text
    assert response.json()["step"]["source_kind"] == "blackbox_service"


def test_an_unknown_step_is_a_404_naming_it(client: TestClient) -> None:
    response = client.get("/v1/dashboard/steps/nope")
    assert response.status_code == 404
    assert "nope" in response.text


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("body", [
    b'{"filters": {"trajectory_id": "a\\ud800"}, "exclude": true}',  # a lone surrogate reached the pool: 503
    b'{"filters": {"trajectory_id": "a"}, "note": "\\udc00"}',
    b'{"filters": {"trajectory_id": "a"}, "exclude": true, "x": ' + b"[" * 300 + b"]" * 300 + b"}",
])
def test_a_curation_the_api_cannot_read_is_a_400_naming_why(pool_store: PoolStore, body: bytes) -> None:
    """The curate route reads JSON as every route of the API does, before the pool or Kafka sees it."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(dashboard_router(pool_store))
    with TestClient(app) as client:
        reply = client.post("/v1/dashboard/curate", content=body, headers=JSON)
    assert reply.status_code == 400, reply.text
    answer = reply.json()
    assert answer["error"] == "malformed_json"
    assert any(why in answer["message"] for why in ("hex escape", "surrogate", "deeper than 200 levels"))
