"""The seed's agent flows, unchanged, through the live stack: the pool holds their steps with the
ids, indexes, policy versions, channels and rewards the seed protocol gave them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai import OpenAI

from clawr1.consumer_sdk import PoolConsumer
from examples import seed_blackbox_agent, seed_whitebox_agent
from tests.integration.compat.conftest import KEYS, Stack, auth

STEP_COLUMNS = ("trajectory_id, step_index, prompt_group_id, policy_version, channel, terminal, ready, "
                "reward, trajectory_reward, trajectory_reward_status, prompt_token_ids, response_token_ids, "
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


def _episode(stack: Stack, group: str, reward: float, metadata: dict[str, Any]) -> str:
    """init -> register -> two chat calls with the official SDK -> complete, as the seed's agents do."""
    with httpx.Client(headers=auth("agent"), timeout=60) as http:
        root = http.post(f"{stack.compat}/init_trajectory").json()["base_url"].rsplit("/", 2)[0]
        base_url = f"{root}/{group}/v1"
        http.post(f"{base_url}/register_trajectory", json={"metadata": metadata}).raise_for_status()
        agent = OpenAI(base_url=base_url, api_key=KEYS["agent"])
        messages: list[Any] = [{"role": "user", "content": "name a colour"}]
        first = agent.chat.completions.create(model="m", messages=messages, max_tokens=8).choices[0].message
        messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "another"}]
        agent.chat.completions.create(model="m", messages=messages, max_tokens=8)
        http.post(f"{base_url}/complete_trajectory", json={"reward": reward}).raise_for_status()
    return root.rsplit("/", 1)[1]


def test_complete_trajectory_makes_the_last_step_terminal_for_fetch_batch_and_to_verl(stack: Stack) -> None:
    group = f"grp-{uuid.uuid4().hex[:8]}"
    metadata = {"policy_version": 6, "ground_truth": "blue", "task": {"id": 7, "split": "train"}}
    rewards = {_episode(stack, group, reward, metadata): reward for reward in (0.75, 0.25)}

    rows = _steps(stack, f"prompt_group_id = '{group}'", lambda rows: len(rows) == 4 and sum(
        r["terminal"] for r in rows) == 2 and all(r["trajectory_reward_status"] == "final" for r in rows))
    for trajectory, reward in rewards.items():
        steps = [r for r in rows if r["trajectory_id"] == trajectory]
        assert [(s["step_index"], s["terminal"], s["ready"]) for s in steps] == [(0, 0, 1), (1, 1, 1)], rows
        assert [s["trajectory_reward"] for s in steps] == [reward, reward]
        for step in steps:  # the registration's metadata reaches every step
            assert step["policy_version"] == 6
            assert {k: json.loads(step["metadata_json"])[k] for k in metadata} == metadata

    with PoolConsumer(stack.api, "trainer:compat", api_key=KEYS["trainer"]) as consumer:
        batch = consumer.fetch_batch(1, n_rollouts=2, timeout=60)
        verl = batch.to_verl(as_dataproto=False)
    extra = verl["non_tensor_batch"]
    assert set(extra["trajectory_uids"]) == set(rewards) and set(extra["uid"]) == {group}
    assert list(extra["ground_truth"]) == ["blue"] * 4
    scores, mask = verl["token_level_scores"], verl["response_mask"]
    places = zip(extra["trajectory_uids"], extra["step_indices"], strict=True)
    for row, (trajectory, index) in enumerate(places):
        expected = rewards[trajectory] if index == 1 else 0.0  # the outcome sits on the terminal step
        last = int(mask[row].sum()) - 1
        assert scores[row][last] == pytest.approx(expected) and scores[row].sum() == pytest.approx(expected)


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
