"""Each seed route's contract on the live stack: shapes, status codes, keys, and what reaches the pool."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.compat.conftest import Stack, auth


def _post(stack: Stack, path: str, key: str | None = "agent", **kwargs: Any) -> httpx.Response:
    headers = {**(auth(key) if key else {}), **kwargs.pop("headers", {})}
    return httpx.post(f"{stack.compat}{path}", headers=headers, timeout=60, **kwargs)


def _step(trajectory: str, index: int, **fields: Any) -> dict[str, Any]:
    return {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "trajectory_uid": trajectory, "prompt_uid": "p",
            "step_index": index, **fields}


def test_init_trajectory_gives_a_base_url_on_the_ports_public_url(stack: Stack) -> None:
    """CLAWR1_COMPAT_PUBLIC_URL, by default the listening address; the request's Host is never used
    (finding 8 of issue 25: an attacker-chosen Host went back to the agent as its base URL)."""
    port = stack.compat.rsplit(":", 1)[1]
    reply = _post(stack, "/init_trajectory", headers={"Host": "evil.example"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {"trajectory_uid", "base_url"}
    uid = body["trajectory_uid"]
    assert body["base_url"] == f"http://127.0.0.1:{port}/{uid}/{uid}/v1"
    grouped = _post(stack, "/init_trajectory", json={"prompt_uid": "q-17"}).json()
    assert grouped["base_url"].endswith(f"/{grouped['trajectory_uid']}/q-17/v1")


def test_the_seed_agent_flow_without_bodies_is_accepted(stack: Stack) -> None:
    """The seed's agent flow posts complete_trajectory with no body, and may register without one."""
    base = f"/{uuid.uuid4().hex}/1/v1"
    assert _post(stack, f"{base}/register_trajectory").json() == {"status": "ok"}
    assert _post(stack, f"{base}/complete_trajectory").json() == {"status": "ok"}


def test_submit_steps_maps_the_seed_step_and_keeps_multi_modal_data(stack: Stack) -> None:
    trajectory = f"seed-{uuid.uuid4().hex[:8]}"
    experts = [[[0, 3], [1, 2]], [[2, 3], [0, 1]]]
    steps = [_step(trajectory, 0, rollout_log_probs=[-0.5, -0.25], policy_version=2,
                   metadata={"task": "t1"}, multi_modal_data={"image": ["img-0"]}, routed_experts=experts),
             _step(trajectory, 1, reward=0.75, is_last=True, policy_version=2)]
    reply = _post(stack, "/submit_steps", params={"channel": "val"}, json={"steps": steps})
    assert reply.status_code == 200 and reply.json() == {"accepted": 2}, reply.text

    rows = stack.wait_rows(
        "SELECT step_index, prompt_group_id, policy_version, channel, terminal, reward, response_logprobs, "
        f"metadata_json FROM steps WHERE trajectory_id = '{trajectory}' ORDER BY step_index",
        lambda rows: len(rows) == 2)
    assert [(r["step_index"], r["terminal"], r["reward"]) for r in rows] == [(0, 0, None), (1, 1, 0.75)]
    assert {(r["prompt_group_id"], r["policy_version"], r["channel"]) for r in rows} == {("p", 2, "val")}
    assert rows[0]["response_logprobs"] == [-0.5, -0.25]
    metadata = json.loads(rows[0]["metadata_json"])
    assert metadata["task"] == "t1" and metadata["multi_modal_data"] == {"image": ["img-0"]}
    assert metadata["routed_experts"] == experts


def test_complete_trajectory_reward_becomes_the_trajectory_reward(stack: Stack) -> None:
    trajectory = f"done-{uuid.uuid4().hex[:8]}"
    assert _post(stack, "/submit_steps", json={"steps": [_step(trajectory, 0)]}).status_code == 200
    reply = _post(stack, f"/{trajectory}/p/v1/complete_trajectory", json={"reward": 0.5})
    assert reply.status_code == 200 and reply.json() == {"status": "ok"}, reply.text
    rows = stack.wait_rows(
        "SELECT trajectory_reward, trajectory_reward_status, terminal FROM steps "
        f"WHERE trajectory_id = '{trajectory}'",
        lambda rows: bool(rows) and rows[0]["trajectory_reward_status"] == "final")
    assert rows == [{"trajectory_reward": 0.5, "trajectory_reward_status": "final", "terminal": 1}]
    feedback = stack.wait_rows("SELECT reward, terminal, source FROM feedback "
                               f"WHERE target_kind = 'trajectory' AND target_id = '{trajectory}'", bool)
    assert feedback == [{"reward": 0.5, "terminal": 1, "source": "complete_trajectory"}]


def test_compute_reward_calls_the_configured_function(stack: Stack) -> None:
    reply = _post(stack, "/compute_reward", json={
        "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6, 7], "num_turns": 2,
        "extra_fields": {"tool": "calc"}, "dataset_fields": {"ground_truth": "42"}})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"reward_score": 2.0, "reward_extra_info": {
        "prompt_tokens": 3, "ground_truth": "42", "tool": "calc"}}


@pytest.mark.parametrize(("path", "body", "loc"), [
    ("/submit_steps", {"steps": [{"response_ids": [1], "trajectory_uid": "t"}]},
     ["body", "steps", 0, "prompt_ids"]),
    ("/submit_steps", {"steps": [{"prompt_ids": [1], "response_ids": [2, 3], "trajectory_uid": "t",
                                  "rollout_log_probs": [-1.0]}]}, ["body", "steps", 0, "rollout_log_probs"]),
    ("/submit_steps", {"steps": [{"prompt_ids": [1], "response_ids": [2]}]},
     ["body", "steps", 0, "trajectory_uid"]),
    ("/submit_steps", {"steps": [{"prompt_ids": [1], "response_ids": [2], "trajectory_uid": "t",
                                  "metadata": {"routed_experts": 1}, "routed_experts": [1]}]},
     ["body", "steps", 0, "metadata", "routed_experts"]),
    ("/submit_steps", {"step": []}, ["body", "steps"]),
    ("/generate", {"prompt_ids": []}, ["body", "prompt_ids"]),
    ("/generate", {"prompt_ids": [1], "image_data": ["x"]}, ["body", "image_data"]),
    ("/compute_reward", {"prompt_ids": "1 2", "response_ids": [3]}, ["body", "prompt_ids"]),
    ("/t/p/v1/register_trajectory", {"metadata": {"policy_version": "v2"}},
     ["body", "metadata", "policy_version"]),
    ("/t/p/v1/complete_trajectory", {"reward": "high"}, ["body", "reward"]),
])
def test_bad_shapes_are_refused_in_the_seed_error_shape(stack: Stack, path: str, body: Any,
                                                        loc: list[Any]) -> None:
    reply = _post(stack, path, json=body)
    assert reply.status_code == 422, reply.text
    assert loc in [error["loc"] for error in reply.json()["detail"]], reply.json()


def test_a_bad_channel_is_refused(stack: Stack) -> None:
    reply = _post(stack, "/submit_steps", params={"channel": "train/../x"}, json={"steps": []})
    assert reply.status_code == 422 and reply.json()["detail"][0]["loc"] == ["query", "channel"]


@pytest.mark.parametrize(("key", "path", "status"), [
    (None, "/submit_steps", 401),
    ("reader", "/submit_steps", 403),
    ("scorer", "/generate", 403),
    ("scorer", "/t/p/v1/chat/completions", 403),
    ("reader", "/init_trajectory", 403),
    ("reader", "/compute_reward", 403),
])
def test_keys_need_the_kind_of_what_the_route_writes(stack: Stack, key: str | None, path: str,
                                                     status: int) -> None:
    reply = _post(stack, path, key=key, json={})
    assert reply.status_code == status, reply.text
    assert isinstance(reply.json()["detail"], str)
