"""The seed's agent flows, unchanged, through the live stack: the pool holds their steps with the
ids, indexes, policy versions, channels and rewards the seed protocol gave them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from examples import seed_blackbox_agent, seed_whitebox_agent
from tests.integration.compat.conftest import KEYS, Stack, auth

pytestmark = pytest.mark.integration

STEP_COLUMNS = ("trajectory_id, step_index, prompt_group_id, policy_version, channel, terminal, reward, "
                "trajectory_reward, trajectory_reward_status, prompt_token_ids, response_token_ids, "
                "response_logprobs, tool_calls_json, token_provenance, metadata_json, source_kind")


def _steps(stack: Stack, where: str, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    query = f"SELECT {STEP_COLUMNS} FROM steps WHERE {where} ORDER BY trajectory_id, step_index"
    return stack.wait_rows(query, done)


def test_blackbox_agent_plain_and_streamed_with_tools(stack: Stack) -> None:
    group = f"grp-{uuid.uuid4().hex[:8]}"
    plain = seed_blackbox_agent.run_episode(
        stack.compat, "capital of France?", prompt_uid=group, channel="train",
        metadata={"policy_version": 3, "ground_truth": "Paris"}, api_key=KEYS["agent"])
    streamed = seed_blackbox_agent.run_episode(
        stack.compat, "capital of France?", prompt_uid=group, channel="val",
        metadata={"policy_version": 4}, stream=True, api_key=KEYS["agent"])
    assert plain.tool_call["function"]["name"] == streamed.tool_call["function"]["name"] == "lookup"
    assert plain.answer.startswith("Choice 0:") and streamed.answer.startswith("Choice 0:")

    rows = _steps(stack, f"prompt_group_id = '{group}'",
                  lambda rows: len(rows) == 4 and all(r["trajectory_reward_status"] == "final" for r in rows))
    by_trajectory = {uid: [r for r in rows if r["trajectory_id"] == uid]
                     for uid in (plain.trajectory_uid, streamed.trajectory_uid)}
    for episode, version, channel in ((plain, 3, "train"), (streamed, 4, "val")):
        steps = by_trajectory[episode.trajectory_uid]
        assert [s["step_index"] for s in steps] == [0, 1], rows
        assert all(s["source_kind"] == "blackbox_agent" and s["prompt_group_id"] == group for s in steps)
        assert [s["policy_version"] for s in steps] == [version, version]
        assert [s["channel"] for s in steps] == [channel, channel]
        assert [s["trajectory_reward"] for s in steps] == [episode.reward, episode.reward]
        assert json.loads(steps[0]["tool_calls_json"])[0]["function"]["name"] == "lookup"
        assert all(s["token_provenance"] == "engine" and s["response_token_ids"] for s in steps)


def test_every_agent_api_is_captured_under_the_base_url(stack: Stack) -> None:
    trajectory, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    base = f"{stack.compat}/{trajectory}/{group}/v1"
    calls = [("completions", {"model": "m", "prompt": "once upon a time", "max_tokens": 8}),
             ("responses", {"model": "m", "input": "say hi"}),
             ("messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})]
    for path, body in calls:
        reply = httpx.post(f"{base}/{path}", json=body, headers=auth("agent"), timeout=30)
        assert reply.status_code == 200, (path, reply.text)
    rows = _steps(stack, f"trajectory_id = '{trajectory}'", lambda rows: len(rows) >= len(calls))
    assert [r["step_index"] for r in rows] == [0, 1, 2]
    assert all(r["prompt_group_id"] == group and r["channel"] == "train" for r in rows)


def test_whitebox_agent_generates_exact_engine_ids_and_submits_steps(stack: Stack) -> None:
    trajectory, group = f"wb-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    prompt = [256, 260, *b"count to three", 258, 261]
    steps = seed_whitebox_agent.run_episode(
        stack.compat, prompt, trajectory_uid=trajectory, prompt_uid=group,
        observation_ids=[258, 262, 258, 261], policy_version=7, channel="val",
        dataset_fields={"ground_truth": "3"}, api_key=KEYS["agent"])

    # /generate hands back the engine's own ids: ask the engine directly for the same prompt.
    direct = httpx.post(f"{stack.engine}/v1/completions", json={
        "prompt": prompt, "max_tokens": 24, "return_token_ids": True, "logprobs": 1}).json()
    assert steps[0]["response_ids"] == direct["choices"][0]["token_ids"]
    assert steps[0]["rollout_log_probs"] == direct["choices"][0]["logprobs"]["token_logprobs"]
    assert steps[-1]["reward"] == len(steps[-1]["response_ids"]) / 2  # the configured reward function

    rows = _steps(stack, f"trajectory_id = '{trajectory}'", lambda rows: len(rows) >= 2)
    assert [r["step_index"] for r in rows] == [0, 1]
    assert [r["terminal"] for r in rows] == [0, 1]
    for row, step in zip(rows, steps, strict=True):
        assert row["source_kind"] == "whitebox_agent" and row["prompt_group_id"] == group
        assert row["prompt_token_ids"] == step["prompt_ids"]
        assert row["response_token_ids"] == step["response_ids"]
        assert row["response_logprobs"] == pytest.approx(step["rollout_log_probs"])
        assert row["policy_version"] == 7 and row["channel"] == "val"
    assert rows[1]["reward"] == steps[-1]["reward"] and rows[0]["reward"] is None
