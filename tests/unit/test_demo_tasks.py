"""The demo's pure parts: settings from CLAWR1_DEMO_*, the policy clock, tasks, the grep tool, the reward."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from clawr1.demo.tasks import (
    MAX_MATCHES,
    DemoConfig,
    MathTask,
    PolicyClock,
    accuracy_at,
    agent_task,
    demo_reward,
    grep_files,
    math_reply,
    run_tool,
    write_workspace,
)


def test_config_reads_demo_variables_and_names_a_bad_one() -> None:
    config = DemoConfig.from_env({"CLAWR1_DEMO_GROUP_SIZE": "8", "CLAWR1_DEMO_AGENT_PAUSE_S": "0.5",
                                  "CLAWR1_DEMO_ROUNDS": "", "OTHER": "x"})
    assert (config.group_size, config.agent_pause_s, config.rounds) == (8, 0.5, DemoConfig().rounds)
    with pytest.raises(ValueError, match="CLAWR1_DEMO_AGENTS: .*'two'"):
        DemoConfig.from_env({"CLAWR1_DEMO_AGENTS": "two"})
    with pytest.raises(ValueError, match="_BUMP_EVERY"):
        DemoConfig.from_env({"CLAWR1_DEMO_BUMP_EVERY": "0"})
    with pytest.raises(ValueError, match="HUMAN_FRACTION"):
        DemoConfig.from_env({"CLAWR1_DEMO_HUMAN_FRACTION": "1.5"})


def test_the_policy_version_moves_every_k_batches() -> None:
    clock = PolicyClock(bump_every=3)
    moved = [clock.batch_done() for _ in range(7)]
    assert moved == [False, False, True, False, False, True, False]
    assert (clock.version, clock.batches) == (3, 7)


def test_tasks_are_reproducible_from_the_seed() -> None:
    first, second = agent_task(random.Random(1), 4), agent_task(random.Random(1), 4)
    assert first == second and first.task_id.startswith("task-00004-")
    assert first.follow_up(1) != first.follow_up(2)


def test_the_toy_policy_gets_better_with_versions() -> None:
    task = MathTask(20, 22)
    assert accuracy_at(1) < accuracy_at(5) <= 0.95
    rng = random.Random(0)
    right = [math_reply(task, rng, 8).endswith("<answer>42</answer>") for _ in range(400)]
    assert 0.85 < sum(right) / len(right) <= 0.95 + 0.03


def test_grep_finds_lines_holding_any_word_of_the_query(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("kafka offsets\nnothing here\nthe Pool rows\n")
    (tmp_path / "b.txt").write_text("pool again\n")
    found = grep_files(tmp_path, "pool KAFKA")
    assert found == "a.txt:1: kafka offsets\na.txt:3: the Pool rows\nb.txt:1: pool again"
    assert grep_files(tmp_path, "zebra") == "no matches"
    write_workspace(tmp_path / "w", random.Random(3))
    assert len(grep_files(tmp_path / "w", "the a kafka").splitlines()) == MAX_MATCHES


def test_a_tool_call_is_answered_even_when_malformed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("reward shaping\n")
    assert run_tool(tmp_path, "grep_files", json.dumps({"query": "reward"})) == "a.txt:1: reward shaping"
    assert run_tool(tmp_path, "grep_files", "{not json").startswith("error: arguments must be")
    assert run_tool(tmp_path, "calc", "{}") == "error: unknown tool 'calc'"


def test_demo_reward_scores_math_tool_calls_and_grounded_replies() -> None:
    right = demo_reward(extra_fields={"response_text": "<think>x</think> <answer>42</answer>"},
                        dataset_fields={"ground_truth": "42"})
    wrong = demo_reward(extra_fields={"response_text": "the answer is 41"},
                        dataset_fields={"ground_truth": "42"})
    assert (right["score"], wrong["score"]) == (1.1, 0.0)
    call = {"id": "c", "type": "function", "function": {"name": "grep_files", "arguments": '{"query":"x"}'}}
    assert demo_reward(extra_fields={"tool_calls": [call]})["score"] == 1.0
    bad = {**call, "function": {"name": "grep_files", "arguments": "[1]"}}
    assert demo_reward(extra_fields={"tool_calls": [call, bad]})["score"] == 0.0
    prompt = [{"role": "user", "content": "kafka pool"},
              {"role": "tool", "content": "a.txt:1: kafka offsets"}]
    grounded = demo_reward(extra_fields={"response_text": "Kafka holds offsets now",
                                         "prompt_messages": prompt})
    assert grounded["score"] == 0.5
