"""The demo workload `make run` drives through a freshly started stack.

It exercises the three ways in: a black-box agent (the official openai SDK, only its base URL
pointed at the proxy) holding multi-turn conversations, streamed and not; a white-box agent
submitting a GRPO group with token ids through the gateway; and late rewards sent as feedback,
which the streams join to steps already in the pool.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx

from gateway.client import GatewayClient

_TASKS = (
    "List the files in the repository and summarise what the project does.",
    "Fix the failing unit test in tests/test_math.py.",
    "Write a bash one-liner that counts lines of Python code.",
)


def _black_box_conversations(reverse_url: str, turns: int) -> list[str]:
    """A black-box agent: plain openai SDK calls, each turn resending the whole conversation."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{reverse_url}/v1", api_key="sk-demo-secret-never-stored")
    response_ids: list[str] = []
    for task in _TASKS:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": task},
        ]
        for turn in range(turns):
            if turn % 2:
                stream = client.chat.completions.create(model="demo-policy", messages=messages, stream=True)
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
                response_ids.append("")
            else:
                reply = client.chat.completions.create(model="demo-policy", messages=messages)
                text = reply.choices[0].message.content or ""
                response_ids.append(reply.id)
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": f"Tool output for turn {turn}: ok. Continue."})
    return [r for r in response_ids if r]


def _white_box_group(gateway: GatewayClient, group_size: int) -> list[str]:
    """A white-box rollout worker: one GRPO group of samples sharing a prompt, with exact token ids."""
    group = f"demo-group-{uuid.uuid4().hex[:8]}"
    prompt = list(range(100, 164))
    steps = []
    for sample in range(group_size):
        response = [200 + sample, 300 + sample, 400, 401, 402 + sample]
        steps.append(
            {
                "trajectory_id": f"{group}-t{sample}",
                "step_index": 0,
                "prompt_group_id": group,
                "prompt_group_size": group_size,
                "prompt_token_ids": prompt,
                "response_token_ids": response,
                "response_logprobs": [-0.5] * len(response),
                "reward": None,
                "terminal": True,
                "policy_version": 1,
                "model": "demo-policy",
                "agent": "demo-whitebox",
            }
        )
    return gateway.submit_steps(steps)


def run_demo(api_url: str, reverse_url: str, turns: int = 3, group_size: int = 4, wait: float = 60.0) -> None:
    started = time.monotonic()
    response_ids = _black_box_conversations(reverse_url, turns)
    with GatewayClient(api_url) as gateway:
        step_ids = _white_box_group(gateway, group_size)
        for i, step_id in enumerate(step_ids):  # rewards arrive after the steps, from a reward model
            gateway.submit_feedback(
                {
                    "step_id": step_id,
                    "reward": float(i % 2),
                    "final": True,
                    "source": "reward_model",
                    "components": {"tests_passed": float(i % 2)},
                }
            )
        for response_id in response_ids:  # a human rates black-box replies by the engine's response id
            gateway.submit_feedback(
                {
                    "response_id": response_id,
                    "reward": 1.0,
                    "final": True,
                    "source": "human",
                    "label": "helpful",
                }
            )
    print(
        f"[demo] sent {len(_TASKS) * turns} proxied calls, {len(step_ids)} white-box steps and "
        f"{len(step_ids) + len(response_ids)} rewards in {time.monotonic() - started:.1f}s",
        flush=True,
    )
    _wait_for_rewarded(api_url, step_ids, wait)
    _print_pool_summary(api_url)


_SUMMARY_SQL = (
    "SELECT source_kind, count() AS steps, countIf(ready = 1) AS ready, "
    "countIf(reward_status = 'final') AS rewarded, uniqExact(trajectory_id) AS trajectories "
    "FROM steps GROUP BY source_kind ORDER BY source_kind"
)


def _query(api_url: str, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    reply = httpx.post(
        f"{api_url}/v1/sql",
        json={"query": sql, "format": "JSONEachRow", "parameters": parameters or {}},
        timeout=30,
    )
    reply.raise_for_status()
    return [json.loads(line) for line in reply.text.splitlines() if line.strip()]


def _wait_for_rewarded(api_url: str, step_ids: list[str], wait: float) -> None:
    """This run's white-box steps with their joined rewards: proof the whole path has carried them."""
    sql = "SELECT count() AS n FROM steps WHERE has({ids:Array(String)}, step_id) AND reward_status = 'final'"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if int(_query(api_url, sql, {"ids": step_ids})[0]["n"]) == len(step_ids):
            return
        time.sleep(0.5)
    print(f"[demo] the rewarded steps did not all reach the pool within {wait:.0f}s", flush=True)


def _print_pool_summary(api_url: str) -> None:
    print("[demo] pool by source:", flush=True)
    for row in _query(api_url, _SUMMARY_SQL):
        print(f"[demo]   {json.dumps(row)}", flush=True)
    print(f'[demo] explore: clawr1 sql --api {api_url} "SELECT * FROM steps LIMIT 5"', flush=True)
