"""A black-box agent written for the seed Claw-R1 gateway, unchanged, against the compat port.

The seed's pattern (``claw_r1/blackbox_agent/blackbox_agent_flow.py``):

1. ``POST /init_trajectory`` gives a per-trajectory ``base_url``; its prompt uid is swapped for the
   sample's GRPO group;
2. ``POST {base_url}/register_trajectory`` with the channel and dataset metadata (policy version);
3. the agent itself knows nothing of Claw-R1: the official ``openai`` SDK pointed at ``base_url``,
   with a tool (the first reply calls it, the second answers), streamed or not;
4. ``POST {base_url}/complete_trajectory`` with the episode's reward.

Every call is captured by the proxy as a step of that trajectory (ids from the path).

Run against a stack started with an upstream engine and a reverse port, e.g.
``clawr1 up --demo`` then ``python examples/seed_blackbox_agent.py --gateway http://127.0.0.1:8100``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import httpx
from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "look a fact up",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


@dataclass(frozen=True)
class Episode:
    trajectory_uid: str
    base_url: str
    tool_call: dict[str, Any]
    answer: str
    reward: float


def lookup(arguments: str) -> str:
    """The agent's tool: a stand-in for search, code execution, ..."""
    return f"facts about {json.loads(arguments).get('query', '')!r}"


def _streamed(client: OpenAI, **request: Any) -> dict[str, Any]:
    """One streamed chat call, folded back into the reply message (content and tool calls)."""
    content, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _plain(client: OpenAI, **request: Any) -> dict[str, Any]:
    return client.chat.completions.create(**request).choices[0].message.model_dump(exclude_none=True)


def run_episode(gateway: str, question: str, *, prompt_uid: str, channel: str = "train",
                metadata: dict[str, Any] | None = None, stream: bool = False, api_key: str | None = None,
                model: str = "default") -> Episode:
    """One episode of the seed's black-box flow; ``api_key`` is the stack's key when it requires one."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=auth, timeout=60) as http:
        init = http.post(f"{gateway}/init_trajectory")
        init.raise_for_status()
        root = init.json()["base_url"].rsplit("/", 2)[0]  # http://host:port/<trajectory_uid>
        base_url = f"{root}/{prompt_uid}/v1"
        http.post(f"{base_url}/register_trajectory",
                  json={"channel": channel, "metadata": metadata or {}}).raise_for_status()

        agent = OpenAI(base_url=base_url, api_key=api_key or "EMPTY")
        call = _streamed if stream else _plain
        messages: list[dict[str, Any]] = [{"role": "system", "content": "use the tool, then answer"},
                                          {"role": "user", "content": question}]
        first = call(agent, model=model, messages=messages, tools=TOOLS)
        tool_call = first["tool_calls"][0]
        messages += [first, {"role": "tool", "tool_call_id": tool_call["id"],
                             "content": lookup(tool_call["function"]["arguments"])}]
        answer = call(agent, model=model, messages=messages, tools=TOOLS)["content"] or ""

        reward = 1.0 if answer.endswith(".") else 0.0  # the task's own check
        http.post(f"{base_url}/complete_trajectory", json={"reward": reward}).raise_for_status()
    return Episode(init.json()["trajectory_uid"], base_url, tool_call, answer, reward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8100", help="the compat port's URL")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--samples", type=int, default=2, help="rollouts of the one prompt (a GRPO group)")
    args = parser.parse_args()
    for sample in range(args.samples):
        episode = run_episode(args.gateway, "what is the capital of France?", prompt_uid="france",
                              metadata={"policy_version": 0, "ground_truth": "Paris"},
                              stream=sample % 2 == 1, api_key=args.api_key)
        print(json.dumps(episode.__dict__))


if __name__ == "__main__":
    main()
