"""The live demo loop `clawr1 up --demo` (`make run`) drives until Ctrl-C.

Every way into the pool runs at once, each in a thread that paces itself (``clawr1.demo.tasks.DemoConfig``):

- black-box agents through the capture proxy with the official openai SDK (streamed and plain) and
  one with the anthropic SDK: multi-turn, calling a real grep tool over a temp directory, GRPO groups
  of ``group_size`` rollouts per task announced with ``X-Claw-*`` headers;
- an agent built with the OpenAI Agents SDK (``openai-agents``: an ``Agent`` with the grep tool as a
  ``function_tool``, run by ``Runner``), pointed at the proxy by base URL; its model is the SDK's chat
  completions model (the stand-in engine also serves the Responses API, but chat completions is what
  the proxy agents speak too), and the SDK's own tracing to OpenAI is off;
- an agent instrumented with OpenTelemetry (``clawr1.demo.otel_agent``, its own process) that calls the
  engine directly and whose model calls reach the pool as GenAI spans through ``/v1/traces``;
- an agent of the seed system's protocol on the compat port (init, register, calls, complete);
- a white-box rollout worker posting token-exact steps with logprobs, in groups, to ``/v1/steps``;
- a black-box service posting its model calls as ``turn`` events to ``/v1/events``;
- a simulated human labelling, commenting on and correcting a fraction of the newest steps;
- a trainer on the consumer SDK (``whole_groups=True``, the ``demo-train`` preset) that commits each
  batch and bumps the policy version every ``bump_every`` batches; every agent reports that version.

Rewards come from the ``clawr1 rewarder`` role, started by the stack with ``clawr1.demo.tasks:demo_reward``.
One progress line every ``progress_s`` seconds says what the pool holds and how far the trainer is.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from clawr1.demo.standin.toy import EOS, encode, render_prompt, toy_logprob
from clawr1.demo.tasks import (
    GREP_TOOL,
    AgentTask,
    DemoConfig,
    PolicyClock,
    agent_task,
    math_reply,
    math_task,
    run_tool,
    write_workspace,
)
from clawr1.gateway.client import GatewayClient
from clawr1.pool.consumer_tables import COMMITS_TABLE

MODEL = "demo-policy"
TRAINER_GROUP = "demo-trainer"
PRESET = "demo-train"
OFF_TOPIC = "off-topic"
"""A label the demo's preset leaves out (``excluded``/``untrainable`` leave every consumer's batches)."""
API_KEY = "sk-demo-secret-never-stored"
AGENTS_SDK_AGENT = "agents-sdk-agent"
VAL_EVERY = 5
"""Every fifth group of the white-box worker and the compat agent goes to the ``val`` channel."""


@dataclass
class Demo:
    """What the demo's threads share: where the stack is, the config, the policy clock, counters."""

    api_url: str
    reverse_url: str
    compat_url: str | None
    config: DemoConfig
    stop: threading.Event
    workspace: Path
    clock: PolicyClock
    rng_lock: threading.Lock = field(default_factory=threading.Lock)
    groups_consumed: int = 0
    steps_consumed: int = 0
    tasks_started: int = 0
    errors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.config.seed)

    def rng(self) -> random.Random:
        """A private generator per use, drawn from the seeded one (threads never share a generator)."""
        with self.rng_lock:
            return random.Random(self._rng.getrandbits(64))

    def next_task_number(self) -> int:
        with self.rng_lock:
            self.tasks_started += 1
            return self.tasks_started

    def headers(self, trajectory: str, group: str | None, size: int, agent: str,
                terminal: bool) -> dict[str, str]:
        hints = {"X-Claw-Trajectory-Id": trajectory, "X-Claw-Policy-Version": str(self.clock.version),
                 "X-Claw-Agent": agent, "X-Claw-Terminal": "true" if terminal else "false"}
        if group is not None:
            hints |= {"X-Claw-Prompt-Group-Id": group, "X-Claw-Prompt-Group-Size": str(size)}
        return hints


# --- black-box agents -------------------------------------------------------------------------------

def _openai_call(client: Any, messages: list[dict[str, Any]], stream: bool, seed: int,
                 headers: Mapping[str, str]) -> dict[str, Any]:
    """One chat call as an agent makes it; the assistant message to append (tool calls included)."""
    kwargs = {"model": MODEL, "messages": messages, "tools": [GREP_TOOL], "seed": seed,
              "extra_headers": headers}
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in message.tool_calls or []]
        return {"role": "assistant", "content": message.content, **({"tool_calls": calls} if calls else {})}
    text: list[str] = []
    calls_by_index: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text.append(delta.content or "")
        for part in delta.tool_calls or []:
            call = calls_by_index.setdefault(part.index, {"id": "", "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
    calls = [calls_by_index[i] for i in sorted(calls_by_index)]
    return {"role": "assistant", "content": "".join(text) or None, **({"tool_calls": calls} if calls else {})}


def openai_rollout(demo: Demo, client: Any, task: AgentTask, trajectory: str, group: str | None, size: int,
                   seed: int, stream: bool, agent: str) -> int:
    """One multi-turn rollout: per round a tool call, the tool's answer and a reply. Returns calls made."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": task.system},
                                      {"role": "user", "content": task.question}]
    calls = 0
    for round_index in range(demo.config.rounds):
        if round_index:
            messages.append({"role": "user", "content": task.follow_up(round_index)})
        last_round = round_index == demo.config.rounds - 1
        while True:
            asked = messages[-1]["role"] == "tool"
            reply = _openai_call(client, messages, stream, seed,
                                 demo.headers(trajectory, group, size, agent, terminal=last_round and asked))
            calls += 1
            messages.append(reply)
            if not reply.get("tool_calls"):
                break
            for call in reply["tool_calls"]:
                result = run_tool(demo.workspace, call["function"]["name"], call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return calls


def openai_agent(demo: Demo, name: str) -> None:
    """One GRPO group: ``group_size`` rollouts of a fresh task, each on its own client connection,
    every other one streamed."""
    from openai import OpenAI

    number = demo.next_task_number()
    task = agent_task(demo.rng(), number)
    group = f"{task.task_id}-{uuid.uuid4().hex[:6]}"
    size = demo.config.group_size
    for rollout in range(size):
        if demo.stop.is_set():
            return
        with OpenAI(base_url=f"{demo.reverse_url}/v1", api_key=API_KEY, max_retries=1) as client:
            openai_rollout(demo, client, task, f"{group}-r{rollout}", group, size,
                           seed=number * 100 + rollout, stream=bool(rollout % 2), agent=name)


def anthropic_agent(demo: Demo) -> None:
    """A Claude-style agent (the anthropic SDK, Messages API with tool_use/tool_result blocks), one
    rollout per task, streamed every other task."""
    from anthropic import Anthropic

    number = demo.next_task_number()
    task = agent_task(demo.rng(), number)
    trajectory = f"{task.task_id}-claude"
    tool = {"name": GREP_TOOL["function"]["name"], "description": GREP_TOOL["function"]["description"],
            "input_schema": GREP_TOOL["function"]["parameters"]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.question}]
    with Anthropic(base_url=demo.reverse_url, api_key=API_KEY, max_retries=1) as client:
        for round_index in range(demo.config.rounds):
            if round_index:
                messages.append({"role": "user", "content": task.follow_up(round_index)})
            while True:
                answering = isinstance(messages[-1]["content"], list)
                headers = demo.headers(trajectory, trajectory, 1, "claude-agent",
                                       terminal=answering and round_index == demo.config.rounds - 1)
                # Loose JSON (dumped reply blocks, a dict tool), not the SDK's TypedDicts.
                kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "system": task.system,
                                          "messages": messages, "tools": [tool], "extra_headers": headers}
                if number % 2:
                    with client.messages.stream(**kwargs) as stream:
                        reply = stream.get_final_message()
                else:
                    reply = client.messages.create(**kwargs)
                blocks = [block.model_dump(exclude_none=True) for block in reply.content]
                messages.append({"role": "assistant", "content": blocks})
                uses = [b for b in blocks if b["type"] == "tool_use"]
                if not uses:
                    break
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": b["id"],
                     "content": run_tool(demo.workspace, b["name"], json.dumps(b["input"]))} for b in uses]})


def agents_sdk_agent(demo: Demo) -> None:
    """One rollout of a fresh task by an OpenAI Agents SDK agent through the proxy (its trajectory
    announced in ``X-Claw-*`` headers on the client), until the agent gives its final answer."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would otherwise export its traces to OpenAI's platform
    number = demo.next_task_number()
    task = agent_task(demo.rng(), number)

    @function_tool
    def grep_files(query: str) -> str:
        """Search the workspace notes for any of the words in `query`; returns matching lines."""
        return run_tool(demo.workspace, GREP_TOOL["function"]["name"], json.dumps({"query": query}))

    async def run() -> None:
        headers = demo.headers(f"{task.task_id}-agents-sdk", None, 0, AGENTS_SDK_AGENT, terminal=False)
        async with AsyncOpenAI(base_url=f"{demo.reverse_url}/v1", api_key=API_KEY, max_retries=1,
                               default_headers=headers) as client:
            agent = Agent(name=AGENTS_SDK_AGENT, instructions=task.system, tools=[grep_files],
                          model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
            await Runner.run(agent, task.question, max_turns=2 * demo.config.rounds + 2)

    asyncio.run(run())


def otel_agent(demo: Demo, engine_url: str) -> None:
    """``clawr1.demo.otel_agent`` in its own process until the demo stops (or it dies: then retried)."""
    command = [sys.executable, "-m", "clawr1.demo.otel_agent", "--api", demo.api_url, "--engine", engine_url,
               "--pause", str(demo.config.agent_pause_s), "--rounds", str(demo.config.rounds),
               "--seed", str(demo.config.seed)]
    with subprocess.Popen(command, stdin=subprocess.DEVNULL) as process:
        while process.poll() is None and not demo.stop.wait(0.5):
            pass
        if process.poll() is None:
            process.terminate()  # it flushes its last spans on SIGTERM
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        elif not demo.stop.is_set():
            raise RuntimeError(f"the OpenTelemetry agent exited with {process.returncode}")


def compat_agent(demo: Demo) -> None:
    """A seed-protocol agent: ``/init_trajectory`` per rollout (the group as its ``prompt_uid``),
    register with the policy version, call its per-trajectory base URL, complete with a reward."""
    from openai import OpenAI

    assert demo.compat_url is not None
    number = demo.next_task_number()
    task = agent_task(demo.rng(), number)
    group = f"{task.task_id}-seed"
    channel = "val" if number % VAL_EVERY == 0 else "train"
    with httpx.Client(base_url=demo.compat_url, timeout=30) as http:
        for rollout in range(demo.config.group_size):
            if demo.stop.is_set():
                return
            base_url = _ok(http.post("/init_trajectory", json={"prompt_uid": group}))["base_url"]
            _ok(http.post(f"{base_url}/register_trajectory",
                          json={"channel": channel, "metadata": {"policy_version": demo.clock.version}}))
            with OpenAI(base_url=base_url, api_key=API_KEY, max_retries=1) as client:
                calls = openai_rollout(demo, client, task, f"{group}-r{rollout}", None, 0,
                                       seed=number * 100 + rollout, stream=False, agent="seed-agent")
            _ok(http.post(f"{base_url}/complete_trajectory", json={"reward": round(1.0 / calls, 3)}))


def _ok(reply: httpx.Response) -> dict[str, Any]:
    reply.raise_for_status()
    return reply.json()


# --- white-box worker and black-box service ---------------------------------------------------------

def whitebox_group(demo: Demo, gateway: GatewayClient) -> None:
    """A rollout worker's GRPO group: one math prompt, ``group_size`` sampled replies, with the exact
    token ids and logprobs of the (toy) policy at the current version; the rewarder scores them."""
    rng = demo.rng()
    task = math_task(rng)
    number = demo.next_task_number()
    group = f"math-{number:05d}-{uuid.uuid4().hex[:6]}"
    messages = [{"role": "system", "content": "Solve the problem."},
                {"role": "user", "content": task.question}]
    prompt_ids = render_prompt(messages)
    version = demo.clock.version
    steps = []
    for rollout in range(demo.config.group_size):
        text = math_reply(task, rng, version)
        response_ids = [*encode(text), EOS]
        steps.append({
            "trajectory_id": f"{group}-r{rollout}", "step_index": 0, "prompt_group_id": group,
            "prompt_group_size": demo.config.group_size, "prompt_token_ids": prompt_ids,
            "response_token_ids": response_ids,
            "response_logprobs": [toy_logprob(t, k) for k, t in enumerate(response_ids)],
            "prompt_messages": messages, "response_text": text, "terminal": True, "policy_version": version,
            "model": MODEL, "agent": "rollout-worker",
            "channel": "val" if number % VAL_EVERY == 0 else "train",
            "metadata": {"ground_truth": str(task.answer)},
        })
    gateway.submit_steps(steps)


def service_turns(demo: Demo, gateway: GatewayClient) -> None:
    """A black-box chat service reporting one two-turn conversation as ``turn`` events."""
    rng = demo.rng()
    task = agent_task(rng, demo.next_task_number())
    trajectory = f"svc-{uuid.uuid4().hex[:10]}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": task.system},
                                      {"role": "user", "content": task.question}]
    events = []
    for index in range(2):
        reply = f"Looking into {task.question.split()[-1]} (part {index + 1})."
        response_ids = [*encode(reply), EOS]
        events.append({"kind": "turn", "trajectory_id": trajectory, "step_index": index, "payload": {
            "prompt_messages": list(messages), "response_text": reply, "model": MODEL,
            "agent": "chat-service",
            "prompt_token_ids": render_prompt(messages), "response_token_ids": response_ids,
            "logprobs": [toy_logprob(t, k) for k, t in enumerate(response_ids)],
            "policy_version": demo.clock.version, "terminal": index == 1,
            "latency_ms": rng.randint(80, 400)}})
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": task.follow_up(1)}]
    gateway.submit_events(events)


# --- the human and the trainer ----------------------------------------------------------------------

HUMAN_LABELS = ("good", "good", "verbose", OFF_TOPIC, "excluded")
_NEWEST_SQL = """
SELECT step_id, response_text FROM steps
WHERE status = 'ok' AND empty(quality_labels)
ORDER BY created_at_ms DESC LIMIT 20
"""


def human_review(demo: Demo, gateway: GatewayClient) -> None:
    """Label a fraction of the newest unlabelled steps; comment on some, correct a quarter of them.
    The trainer never gets ``excluded`` steps (any consumer) nor ``off-topic`` ones (its preset)."""
    rng = demo.rng()
    feedback = []
    for row in query(demo.api_url, _NEWEST_SQL):
        if rng.random() >= demo.config.human_fraction:
            continue
        item: dict[str, Any] = {"step_id": row["step_id"], "source": "human", "final": True,
                                "label": rng.choice(HUMAN_LABELS)}
        if rng.random() < 0.25:
            item["correction"] = f"{row['response_text'] or ''} (checked against the notes)".strip()
            item["comment"] = "corrected the reply"
        feedback.append(item)
    if feedback:
        gateway.submit_feedback(feedback)


class Trainer:
    """A GRPO-style trainer on the SDK: whole prompt groups through the ``demo-train`` preset, a commit
    per batch, and a new policy version every ``bump_every`` batches."""

    def __init__(self, demo: Demo) -> None:
        from clawr1.consumer_sdk import PoolConsumer, save_preset

        self.demo = demo
        save_preset(demo.api_url, PRESET, exclude_quality_labels=[OFF_TOPIC],
                    max_staleness=demo.config.max_staleness)
        self.consumer = PoolConsumer(demo.api_url, TRAINER_GROUP, preset=PRESET, whole_groups=True)

    def step(self) -> None:
        demo = self.demo
        self.consumer.report_policy_version(demo.clock.version)
        batch = self.consumer.poll(max_steps=256, max_groups=demo.config.batch_groups)
        if not len(batch):
            return
        groups = {row["prompt_group_id"] for row in batch.to_arrow().select(["prompt_group_id"]).to_pylist()}
        self.consumer.commit(batch)
        demo.groups_consumed += len(groups)
        demo.steps_consumed += len(batch)
        if demo.clock.batch_done():
            print(f"[demo] trainer: policy version {demo.clock.version} after {demo.clock.batches} batches",
                  flush=True)

    def close(self) -> None:
        self.consumer.close()


# --- progress -----------------------------------------------------------------------------------------

def query(api_url: str, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    reply = httpx.post(f"{api_url}/v1/sql", timeout=30,
                       json={"query": sql, "format": "JSONEachRow", "parameters": dict(parameters or {})})
    reply.raise_for_status()
    return [json.loads(line) for line in reply.text.splitlines() if line.strip()]


PROGRESS_SQL = f"""
SELECT count() AS steps, countIf(ready = 1) AS ready_steps,
       countIf(source_kind = 'blackbox_agent') AS blackbox,
       countIf(source_kind = 'whitebox_agent') AS whitebox,
       countIf(source_kind = 'blackbox_service') AS service,
       countIf(source_kind = 'otel') AS otel,
       countIf(agent = {{agents_sdk:String}}) AS agents_sdk,
       countIf(ready = 1 AND channel = 'train'
               AND step_id NOT IN (SELECT step_id FROM {COMMITS_TABLE} WHERE group_name = {{group:String}}))
           AS lag
FROM steps
"""


@dataclass
class Progress:
    """One line per interval: arrival rate, readiness, what the trainer took and how far behind it is."""

    demo: Demo
    started: float = field(default_factory=time.monotonic)
    last_steps: int = 0
    last_at: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        parameters = {"group": TRAINER_GROUP, "agents_sdk": AGENTS_SDK_AGENT}
        row = query(self.demo.api_url, PROGRESS_SQL, parameters)[0]
        now = time.monotonic()
        rate = (int(row["steps"]) - self.last_steps) / max(now - self.last_at, 1e-6)
        self.last_steps, self.last_at = int(row["steps"]), now
        return (f"[demo] {now - self.started:5.0f}s | in {rate:5.1f} steps/s ({row['steps']} steps: "
                f"black-box {row['blackbox']} (agents-sdk {row['agents_sdk']}), white-box {row['whitebox']}, "
                f"service {row['service']}, otel {row['otel']}) | "
                f"ready {row['ready_steps']} | consumed {self.demo.groups_consumed} groups "
                f"({self.demo.clock.batches} batches) | policy v{self.demo.clock.version} | "
                f"lag {row['lag']} ready steps")


# --- the loop -------------------------------------------------------------------------------------------

def _forever(demo: Demo, name: str, pause_s: float, act: Callable[[], None]) -> None:
    """``act`` again and again, ``pause_s`` apart, until the stop; a failure is reported (once per
    distinct message) and retried after the pause, as a long-running agent would."""
    while not demo.stop.is_set():
        try:
            act()
        except Exception as exc:  # noqa: BLE001 - any failure of one actor must not end the demo
            if demo.stop.is_set():
                return
            message = f"{type(exc).__name__}: {exc}"
            if demo.errors.get(name) != message:
                demo.errors[name] = message
                print(f"[demo] {name}: {message} (retrying)", flush=True)
        demo.stop.wait(pause_s)


@dataclass(frozen=True)
class Actor:
    name: str
    pause_s: float
    act: Callable[[], None]


def actors(demo: Demo, gateway: GatewayClient, engine_url: str | None) -> Iterator[Actor]:
    config = demo.config
    for number in range(config.agents):
        name = f"openai-agent-{number}"
        yield Actor(name, config.agent_pause_s, partial(openai_agent, demo, name))
    yield Actor("anthropic-agent", config.agent_pause_s, lambda: anthropic_agent(demo))
    yield Actor(AGENTS_SDK_AGENT, config.agent_pause_s, lambda: agents_sdk_agent(demo))
    if engine_url:
        yield Actor("otel-agent", config.agent_pause_s, lambda: otel_agent(demo, engine_url))
    if demo.compat_url:
        yield Actor("seed-agent", config.agent_pause_s * 2, lambda: compat_agent(demo))
    yield Actor("rollout-worker", config.whitebox_pause_s, lambda: whitebox_group(demo, gateway))
    yield Actor("chat-service", config.event_pause_s, lambda: service_turns(demo, gateway))
    yield Actor("human", config.human_pause_s, lambda: human_review(demo, gateway))


def run_demo(api_url: str, reverse_url: str, compat_url: str | None = None,
             stop: threading.Event | None = None, env: Mapping[str, str] | None = None,
             engine_url: str | None = None) -> None:
    """Run every actor of the demo until ``stop`` is set, printing progress; returns once all ended.
    ``engine_url`` (the LLM engine itself) is where the OpenTelemetry agent calls, past the proxy."""
    config = DemoConfig.from_env(os.environ if env is None else env)
    stop = stop or threading.Event()
    with tempfile.TemporaryDirectory(prefix="clawr1-demo-") as workspace, GatewayClient(api_url) as gateway:
        demo = Demo(api_url, reverse_url, compat_url, config, stop, Path(workspace),
                    PolicyClock(config.bump_every))
        write_workspace(demo.workspace, demo.rng())
        threads = [threading.Thread(target=_forever, args=(demo, a.name, a.pause_s, a.act),
                                    name=f"demo-{a.name}", daemon=True)
                   for a in actors(demo, gateway, engine_url)]
        trainer: list[Trainer] = []

        def train() -> None:
            if not trainer:
                trainer.append(Trainer(demo))
            trainer[0].step()

        threads.append(threading.Thread(target=_forever, args=(demo, "trainer", 1.0, train),
                                        name="demo-trainer", daemon=True))
        for thread in threads:
            thread.start()
        print(f"[demo] running {len(threads)} actors against {api_url} (dashboard: {api_url}/dashboard); "
              "Ctrl-C stops", flush=True)
        progress = Progress(demo)
        while not stop.wait(config.progress_s):
            try:
                print(progress.line(), flush=True)
            except httpx.HTTPError as exc:
                print(f"[demo] progress: {exc}", flush=True)
        for thread in threads:
            thread.join(timeout=15)
        if trainer:
            trainer[0].close()
