"""The pure mappings between the seed's shapes and ours."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from clawr1.compat.models import GenerateRequest, StepPayload
from clawr1.compat.registry import NotOwner, Registry
from clawr1.compat.steps import (
    Refused,
    Registration,
    forward_headers,
    generate_payload,
    generate_response,
    policy_version_of,
    step_in,
)
from clawr1.demo.standin.toy import completion_prompts


def test_a_seed_step_becomes_a_whitebox_step() -> None:
    payload = StepPayload(prompt_ids=[1, 2], response_ids=[3], rollout_log_probs=[-0.5], reward=1.0,
                          trajectory_uid="t", prompt_uid="g", step_index=3, policy_version=9, is_last=True,
                          metadata={"k": "v"}, multi_modal_data={"image": [1]}, routed_experts=[[0, 1]])
    step = step_in(payload, "val")
    assert (step.trajectory_id, step.prompt_group_id, step.step_index, step.terminal) == ("t", "g", 3, True)
    assert (step.prompt_token_ids, step.response_token_ids, step.response_logprobs) == ([1, 2], [3], [-0.5])
    assert (step.reward, step.policy_version, step.channel) == (1.0, 9, "val")
    assert step.metadata == {"k": "v", "multi_modal_data": {"image": [1]}, "routed_experts": [[0, 1]]}


def test_refusals_name_the_seed_fields() -> None:
    payload = StepPayload(prompt_ids=[], response_ids=[3, 4], rollout_log_probs=[-1.0], trajectory_uid="t")
    with pytest.raises(Refused) as refused:
        step_in(payload, "train", index=2)
    locs = {tuple(p.loc) for p in refused.value.problems}
    assert locs == {("body", "steps", 2, "prompt_ids"), ("body", "steps", 2, "rollout_log_probs")}


def test_forwarded_headers_carry_the_path_and_registration_not_the_agents_hints() -> None:
    agent = [("Host", "x"), ("Authorization", "Bearer k"), ("X-Claw-Trajectory-Id", "spoof"),
             ("X-Claw-Agent", "a"), ("Content-Type", "application/json")]
    registration = Registration("val", 4, {"policy_version": 4, "q": "é"})
    headers = dict(forward_headers(agent, "t", "g", registration, drop_authorization=True))
    assert headers == {"X-Claw-Agent": "a", "Content-Type": "application/json", "X-Claw-Trajectory-Id": "t",
                       "X-Claw-Prompt-Group-Id": "g", "X-Claw-Channel": "val", "X-Claw-Policy-Version": "4",
                       "X-Claw-Metadata": '{"policy_version":4,"q":"\\u00e9"}'}
    assert json.loads(headers["X-Claw-Metadata"])["q"] == "é"
    kept = dict(forward_headers(agent, "t", "g", Registration(), drop_authorization=False))
    assert kept["Authorization"] == "Bearer k" and "X-Claw-Policy-Version" not in kept


def test_policy_version_reads_like_the_seed() -> None:
    assert policy_version_of({"policy_version": "12"}) == 12 and policy_version_of(None) is None
    with pytest.raises(ValueError):
        policy_version_of({"policy_version": 1.5})


def test_generate_asks_for_engine_ids_and_returns_them_as_they_are() -> None:
    params = {"temperature": 0.2, "logprobs": True, "n": 4}
    request = GenerateRequest(prompt_ids=[5, 6], sampling_params=params)
    payload = generate_payload(request, max_tokens=64)
    assert payload == {"temperature": 0.2, "top_p": 1.0, "prompt": [5, 6], "n": 1, "return_token_ids": True,
                       "skip_special_tokens": False, "max_tokens": 64, "logprobs": 1}
    reply = {"choices": [{"text": "ignored", "token_ids": [7, 8], "finish_reason": "length",
                          "logprobs": {"token_logprobs": [-0.1, -0.2]}}]}
    answer = generate_response(reply, want_logprobs=True)
    assert (answer.token_ids, answer.log_probs, answer.stop_reason) == ([7, 8], [-0.1, -0.2], "length")
    with pytest.raises(ValueError, match="return_token_ids"):
        generate_response({"choices": [{"text": "no ids"}]}, want_logprobs=False)


def test_registrations_survive_a_restart_and_stay_bounded(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    registry = Registry(path, max_entries=2)
    for name in ("a", "b", "c"):
        registry.register(name, Registration("val", 1, {"n": name}), "agent")
    registry.close()
    reopened = Registry(path, max_entries=2)
    assert reopened.claim("a", "other") == Registration()  # beyond the bound: forgotten, claimed anew
    assert reopened.claim("c", "agent") == Registration("val", 1, {"n": "c"})
    reopened.close()


def test_a_trajectory_belongs_to_the_key_that_first_used_it(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "r.sqlite3", max_entries=10)
    assert registry.claim("t1", "alice") == Registration()
    registry.register("t1", Registration("val", 3, {"ground_truth": "4"}), "alice")
    forged = Registration("train", 999, {"ground_truth": "x"})
    for intruder in (lambda: registry.claim("t1", "mallory"),
                     lambda: registry.register("t1", forged, "mallory")):
        with pytest.raises(NotOwner, match="belongs to another API key"):
            intruder()
    assert registry.claim("t1", "alice") == Registration("val", 3, {"ground_truth": "4"})
    registry.close()


def test_registrations_from_before_owners_are_claimed_by_their_next_use(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE registrations (seq INTEGER PRIMARY KEY AUTOINCREMENT, trajectory_id TEXT "
                    "NOT NULL UNIQUE, channel TEXT NOT NULL, policy_version INTEGER, metadata_json TEXT)")
        old.execute("INSERT INTO registrations (trajectory_id, channel, policy_version) "
                    "VALUES ('t', 'val', 2)")
    registry = Registry(path, max_entries=10)
    assert registry.claim("t", "bob") == Registration("val", 2, None)
    with pytest.raises(NotOwner):
        registry.claim("t", "alice")
    registry.close()


def test_standin_engine_takes_token_id_prompts() -> None:
    assert completion_prompts([1, 2]) == [([1, 2], [1, 2])]
    assert completion_prompts([[1], "a"]) == [([1], [1]), ("a", [256, 97])]
    assert completion_prompts([1.5]) is None
