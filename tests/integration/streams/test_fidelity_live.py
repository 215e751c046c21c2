"""Black-box fidelity through the live path: the official openai SDK -> the real proxy (reverse mode)
-> the real broker -> a real stream worker. GRPO rollouts whose first actions are identical stay
apart, retries are superseded, compaction is flagged, n > 1 choices are rollouts of one group,
feedback by a reused engine id is refused with its candidates, and a replay after 1,000 other
calls of its key keeps its first assignment.

Rollout workers share one client: an ``AsyncOpenAI`` running rollouts with ``asyncio.gather``, a sync
client shared by threads whose first turn streams (the SDK drops a connection after a stream), ``n=2``
streamed with identical choices, and the OpenAI Agents SDK with function tools. Each rollout stays one
trajectory, no step a rollout went on from is superseded, and with no hints the rollouts of a task
form one inferred prompt group."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI, OpenAI

from clawr1.core.kafka_io import make_producer
from clawr1.core.settings import Settings
from tests.integration.streams.conftest import Outputs, WorkerRun
from tests.support.events import CODEC, feedback, llm_call, llm_key
from tests.support.ports import free_port
from tests.support.proxy import EmbeddedProxy, LoopThread, TopicReader, start_standin

TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the corpus",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}}}}}]


class Live:
    """An agent's view (an OpenAI client through the proxy) plus the worker's outputs and raw calls."""

    def __init__(self, run: WorkerRun, outputs: Outputs, client: OpenAI, raw: TopicReader,
                 engine: str) -> None:
        self.run, self.outputs, self.client, self.raw, self.engine = run, outputs, client, raw, engine

    def call(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        return self.client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)

    def steps_of(self, marker: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        """The latest version of the ``count`` steps whose prompt carries ``marker`` (once all arrived)."""
        def mine() -> list[dict[str, Any]]:
            return [s for s in self.outputs.latest_steps().values() if marker in s["prompt_messages"]]
        self.outputs.wait_for(lambda _: len(mine()) >= count, timeout, self.run)
        self.outputs.poll(1.0)  # later versions (supersede, feedback) of the same steps
        return mine()

    def give_feedback(self, target_kind: str, target_id: str, reward: float) -> str:
        feedback_id = "fb-" + uuid.uuid4().hex[:8]
        record = feedback(feedback_id, target_kind, target_id, reward=reward, at=int(time.time() * 1000))
        producer = make_producer(self.run.bootstrap)
        producer.produce(self.run.topics.raw_feedback, key=target_id.encode(),
                         value=CODEC.encode("feedback", record))
        assert producer.flush(30) == 0
        return feedback_id


@pytest.fixture(scope="module")
def live(worker_runs: Callable[[], tuple[WorkerRun, Outputs]],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    run, outputs = worker_runs()
    run.start()
    loop = LoopThread()
    standin = start_standin(loop)
    settings = Settings(data_dir=tmp_path_factory.mktemp("proxy"), kafka_bootstrap=run.bootstrap,
                        proxy_port=free_port(), reverse_port=free_port(), upstream=standin.url)
    raw = TopicReader(run.bootstrap, run.topics.raw_llm)
    try:
        with EmbeddedProxy(settings, run.topics.raw_llm) as proxy:
            client = OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key="sk-x")
            yield Live(run, outputs, client, raw, standin.url)
    finally:
        raw.close()
        loop.run(standin.engine.stop())
        loop.close()


def echo(message: Any) -> dict[str, Any]:
    """The reply as an agent framework puts it back in its history: arguments re-serialized."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": json.dumps(json.loads(c.function.arguments))}}
            for c in message.tool_calls]
    return out


def tool_result(message: Any, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": text}


def chains(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for step in sorted(steps, key=lambda s: s["step_index"]):
        out.setdefault(step["trajectory_id"], []).append(step)
    return out


def test_grpo_rollouts_with_identical_first_actions_stay_apart(live: Live) -> None:
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, {"role": "user", "content": f"find {marker}"}]
    history: dict[int, list[dict[str, Any]]] = {}
    firsts = {}
    for r in range(4):  # four rollouts of one task: the engine answers each identically
        firsts[r] = live.call(task).choices[0].message
        history[r] = [*task, echo(firsts[r]), tool_result(firsts[r], f"observation {r}")]
    assert len({json.dumps(echo(m)) for m in firsts.values()}) == 1
    for r in (2, 0, 3, 1):
        reply = live.call(history[r]).choices[0].message
        history[r] += [echo(reply), {"role": "user", "content": "go on"}]
        if r in (0, 1):
            live.call(history[r])
    trajectories = chains(live.steps_of(marker, 10))
    assert sorted(len(c) for c in trajectories.values()) == [2, 2, 3, 3]
    assert {s["engine"] for c in trajectories.values() for s in c} == {live.engine}  # the engine that served
    observations = set()
    for chain in trajectories.values():
        assert [s["step_index"] for s in chain] == list(range(len(chain)))
        assert [s["link_status"] for s in chain] == ["root"] + ["linked"] * (len(chain) - 1)
        prompts = [json.loads(s["prompt_messages"]) for s in chain]
        for before, after in zip(prompts, prompts[1:], strict=False):
            assert after[: len(before)] == before  # each prompt a prefix-extension of the previous
        seen = {m["content"] for m in prompts[-1] if m["role"] == "tool"}
        assert len(seen) == 1  # one rollout's observation only
        observations |= seen
    assert observations == {f"observation {r}" for r in range(4)}
    # The four first calls share the engine's response id: feedback by it names no single step.
    shared = next(c[0]["response_id"] for c in trajectories.values())
    live.give_feedback("response", shared, 1.0)
    live.outputs.wait_for(lambda o: any(shared in d["reason"] for d in o.dead_letters), 60, live.run)
    letter = next(d for d in live.outputs.dead_letters if shared in d["reason"])
    assert letter["stage"] == "join" and "ambiguous" in letter["reason"]
    assert all(c[0]["step_id"] in letter["reason"] for c in trajectories.values())


def test_a_retried_call_is_superseded_by_the_one_the_agent_continued(live: Live) -> None:
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, {"role": "user", "content": f"look up {marker}"}]
    first = live.call(task).choices[0].message
    history = [*task, echo(first), tool_result(first, "found it")]
    live.call(history)
    reply = live.call(history).choices[0].message  # the agent timed out and asked again
    live.call([*history, echo(reply), {"role": "user", "content": "thanks"}])
    steps = live.steps_of(marker, 4)
    at_one = sorted((s["link_status"], s["ready"]) for s in steps if s["step_index"] == 1)
    assert at_one == [("linked", False), ("superseded", False)]
    kept = next(s for s in steps if s["step_index"] == 1 and s["link_status"] == "linked")
    last = next(s for s in steps if s["step_index"] == 2)
    assert last["parent_step_id"] == kept["step_id"] and len({s["trajectory_id"] for s in steps}) == 1


def test_a_superseded_answer_the_agent_goes_on_from_is_revived(live: Live) -> None:
    """The agent asks again (another model answers differently), then goes on from its first answer
    after all: the linker revisits its decision, the join gets an unsupersede, and the retry is the
    step superseded."""
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, {"role": "user", "content": f"check {marker}"}]
    first = live.call(task).choices[0].message
    history = [*task, echo(first), tool_result(first, "found it")]
    kept = live.client.chat.completions.create(model="m", messages=history).choices[0].message
    retry = live.client.chat.completions.create(model="m-other", messages=history).choices[0].message
    assert kept.content != retry.content
    live.call([*history, {"role": "assistant", "content": kept.content}, {"role": "user", "content": "ok"}])
    steps = {s["response_text"]: s for s in live.steps_of(marker, 4) if s["step_index"] == 1}
    statuses = (steps[kept.content]["link_status"], steps[retry.content]["link_status"])
    assert statuses == ("linked", "superseded")
    # Its versions: the fact, superseded (at the retry), revived (at the continuation).
    assert steps[kept.content]["version"] == 3
    last = next(s for s in live.steps_of(marker, 4) if s["step_index"] == 2)
    assert last["parent_step_id"] == steps[kept.content]["step_id"]


def test_a_compacted_context_is_flagged_with_its_candidate(live: Live) -> None:
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, {"role": "user", "content": f"study {marker}"}]
    first = live.call(task).choices[0].message
    live.call([*task, echo(first), tool_result(first, "long output")])
    live.call([*task, {"role": "user", "content": "Summary so far: searched once, got long output."}])
    steps = {s["step_index"]: s for s in live.steps_of(marker, 3) if s["link_status"] != "compacted"}
    compacted = [s for s in live.steps_of(marker, 3) if s["link_status"] == "compacted"]
    assert len(compacted) == 1 and compacted[0]["step_index"] == 0
    assert compacted[0]["link_candidate_step_id"] == steps[1]["step_id"]
    assert compacted[0]["trajectory_id"] != steps[1]["trajectory_id"]


def test_each_choice_is_a_rollout_and_feedback_by_the_call_id_finds_the_continued_one(live: Live) -> None:
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "user", "content": f"write about {marker}"}]
    both = live.client.chat.completions.create(model="m", messages=task, n=2)
    live.client.chat.completions.create(model="m", messages=[
        *task, {"role": "assistant", "content": both.choices[1].message.content},
        {"role": "user", "content": "shorter"}])
    steps = live.steps_of(marker, 3)
    trajectories = chains(steps)
    assert len(trajectories) == 2
    assert len({(s["prompt_group_id"], s["prompt_group_size"]) for s in steps}) == 1
    assert steps[0]["prompt_group_size"] == 2
    continued = next(c for c in trajectories.values() if len(c) == 2)
    assert continued[0]["response_text"] == both.choices[1].message.content
    live.give_feedback("response", both.id, 0.5)
    live.outputs.wait_for(lambda o: o.latest_steps()[continued[0]["step_id"]]["reward"] == 0.5, 60, live.run)
    other = next(c for c in trajectories.values() if len(c) == 1)[0]
    assert live.outputs.latest_steps()[other["step_id"]]["reward"] is None


def test_a_replay_after_a_thousand_other_calls_keeps_its_first_assignment(live: Live) -> None:
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, {"role": "user", "content": f"replay {marker}"}]
    first = live.call(task).choices[0].message
    live.call([*task, echo(first), tool_result(first, "r")])
    original = {s["step_id"]: s for s in live.steps_of(marker, 2)}
    raw = live.raw.wait_for(lambda r: marker in r["request_body"], 2)
    now = int(time.time() * 1000)
    others = [llm_call(f"other-{marker}-{i}", task, ["x"], at=now + i) for i in range(1_000)]
    producer = make_producer(live.run.bootstrap)
    for record in others:
        producer.produce(live.run.topics.raw_llm, key=llm_key(record).encode(),
                         value=CODEC.encode("raw_llm_call", record))
    for event in raw:  # the proxy's calls again, as a redelivery would bring them
        producer.produce(live.run.topics.raw_llm, key=event.key.encode(), value=event.value)
    sentinel = llm_call(f"sentinel-{marker}", task, ["y"], at=now + 2_000)
    producer.produce(live.run.topics.raw_llm, key=llm_key(sentinel).encode(),
                     value=CODEC.encode("raw_llm_call", sentinel))
    assert producer.flush(60) == 0
    live.outputs.wait_for(lambda o: sentinel["event_id"] in o.latest_steps(), 180, live.run)
    for step_id, step in original.items():
        records = [s for s in live.outputs.steps if s["step_id"] == step_id]
        assert {(s["trajectory_id"], s["step_index"], s["parent_step_id"]) for s in records} == {
            (step["trajectory_id"], step["step_index"], step["parent_step_id"])}
        assert live.outputs.latest_steps()[step_id]["version"] == step["version"]


# ---------------------------------------------------------------- rollout workers sharing one client

def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assert_rollouts(steps: list[dict[str, Any]], rollouts: int, length: int
                    ) -> dict[str, list[dict[str, Any]]]:
    """Each rollout one trajectory of ``length`` calls (root, then linked), none superseded, each prompt
    extending the previous; all in one inferred prompt group, as the same task's rollouts are."""
    trajectories = chains(steps)
    assert sorted(len(c) for c in trajectories.values()) == [length] * rollouts, {
        t: [(s["step_index"], s["link_status"]) for s in c] for t, c in trajectories.items()}
    for chain in trajectories.values():
        assert [s["link_status"] for s in chain] == ["root"] + ["linked"] * (length - 1)
        assert [s["step_index"] for s in chain] == list(range(length))
        prompts = [json.loads(s["prompt_messages"]) for s in chain]
        for before, after in zip(prompts, prompts[1:], strict=False):
            assert after[: len(before)] == before
    (group,) = {(s["prompt_group_id"], s["prompt_group_size"], s["prompt_group_inferred"]) for s in steps}
    # Named after the first call linked (the proxy records a call once it completes), open for a minute.
    first = next(s for s in steps if s["step_id"] == group[0] and s["step_index"] == 0)
    assert group[1:] == (None, True)
    assert {s["prompt_group_closes_at_ms"] for s in steps} == {first["created_at_ms"] + 60_000}
    return trajectories


def last_user_texts(chain: list[dict[str, Any]]) -> set[str]:
    return {m["content"] for m in json.loads(chain[-1]["prompt_messages"]) if m["role"] == "user"}


def connections_of(live: Live, marker: str) -> list[tuple[str, str]]:
    """(client connection, request body) of the proxy's recorded calls carrying ``marker``."""
    return [(e.record["client_connection"], e.record["request_body"])
            for e in live.raw.wait_for(lambda r: marker in r["request_body"], 1)]


def test_rollouts_gathered_on_one_async_client_stay_apart_in_their_inferred_groups(live: Live) -> None:
    """The issue's AsyncOpenAI pattern: two tasks, four rollouts each, gathered on one client. Every
    first action and tool result is identical, so the second calls of a task repeat one prompt on
    whichever pooled connection is free; tool delays differ per rollout."""
    client = AsyncOpenAI(base_url=str(live.client.base_url), api_key="sk-x")
    markers = [uuid.uuid4().hex[:8] for _ in range(2)]
    # Tool delays differ per rollout: a task's second calls come one after another, each on whichever
    # pooled connection is idle.
    delays = [d for _ in range(2) for d in random.Random(7).sample([0.0, 0.15, 0.3, 0.45], 4)]

    async def rollout(task_number: int, r: int) -> None:
        task = [{"role": "system", "content": "use tools"}, user(f"find {markers[task_number]}")]
        first = (await client.chat.completions.create(model="m", messages=task, tools=TOOLS)
                 ).choices[0].message
        await asyncio.sleep(delays[task_number * 4 + r])  # the tool runs
        history = [*task, echo(first), tool_result(first, "same result")]
        second = (await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
                  ).choices[0].message
        history += [echo(second), user(f"now check {r}")]
        await client.chat.completions.create(model="m", messages=history, tools=TOOLS)

    async def run_all() -> None:
        await asyncio.gather(*(rollout(t, r) for t in range(2) for r in range(4)))
        await client.close()

    asyncio.run(run_all())
    for marker in markers:
        trajectories = assert_rollouts(live.steps_of(marker, 12), rollouts=4, length=3)
        assert sorted(text for c in trajectories.values() for text in last_user_texts(c)
                      if text.startswith("now check")) == [f"now check {r}" for r in range(4)]
    # One client: a pooled connection carried the second calls of several rollouts.
    seconds = [connection for connection, body in connections_of(live, markers[0]) if "same result" in body
               and "now check" not in body]
    assert len(seconds) == 4 and len(set(seconds)) < 4, seconds


def test_a_sync_client_shared_by_threads_with_streamed_identical_first_turns(live: Live) -> None:
    """Three rollouts on one sync OpenAI client, each in its thread: the first turn streams (the SDK
    drops that connection), the later turns are plain and reuse one keep-alive connection."""
    client = OpenAI(base_url=str(live.client.base_url), api_key="sk-x")
    marker = uuid.uuid4().hex[:8]
    task = [{"role": "system", "content": "use tools"}, user(f"study {marker}")]

    def rollout(r: int) -> None:
        with client.chat.completions.stream(model="m", messages=task, tools=TOOLS) as stream:
            first = stream.get_final_completion().choices[0].message
        time.sleep(0.05 * r)
        history = [*task, echo(first), tool_result(first, "same result")]
        second = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message
        client.chat.completions.create(model="m", messages=[*history, echo(second), user(f"now check {r}")],
                                       tools=TOOLS)

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(rollout, range(3)))
    client.close()
    trajectories = assert_rollouts(live.steps_of(marker, 9), rollouts=3, length=3)
    assert all(len([t for t in last_user_texts(c) if t.startswith("now check")]) == 1
               for c in trajectories.values())
    connections = Counter(connection for connection, _ in connections_of(live, marker))
    assert max(connections.values()) >= 2  # plain calls of several rollouts shared a connection


def test_identical_streamed_choices_each_stay_one_rollout(live: Live) -> None:
    """``n=2`` streamed from a greedy engine: both choices are the same reply, and both are continued
    with the same next prompt on one client; each choice stays its own trajectory of the call's group."""
    marker = uuid.uuid4().hex[:8]
    task = [user(f"write about {marker}")]
    with live.client.chat.completions.stream(model="m-greedy", messages=task, n=2) as stream:
        both = stream.get_final_completion()
    assert len(both.choices) == 2 and both.choices[0].message.content == both.choices[1].message.content
    history = [*task, {"role": "assistant", "content": both.choices[0].message.content}, user("shorter")]
    seconds = [live.client.chat.completions.create(model="m-greedy", messages=history) for _ in range(2)]
    for i, second in enumerate(seconds):
        reply = {"role": "assistant", "content": second.choices[0].message.content}
        live.client.chat.completions.create(model="m-greedy", messages=[*history, reply, user(f"choice {i}")])
    steps = live.steps_of(marker, 6)
    trajectories = chains(steps)
    assert sorted(len(c) for c in trajectories.values()) == [3, 3]
    assert all([s["link_status"] for s in c] == ["root", "linked", "linked"] for c in trajectories.values())
    assert {(s["prompt_group_size"], s["prompt_group_inferred"]) for s in steps} == {(2, False)}
    assert len({s["prompt_group_id"] for s in steps}) == 1
    assert sorted(t for c in trajectories.values() for t in last_user_texts(c) if t.startswith("choice")) == [
        "choice 0", "choice 1"]


def test_openai_agents_sdk_rollouts_with_function_tools(live: Live) -> None:
    """The OpenAI Agents SDK (chat completions model, function tools) runs four rollouts of one task
    on one AsyncOpenAI client through the proxy, as a rollout worker would: every tool result is the
    same, so their second calls repeat one prompt on shared connections."""
    set_tracing_disabled(True)
    marker = uuid.uuid4().hex[:8]

    @function_tool
    def lookup(query: str) -> str:
        """Look the query up in the corpus."""
        return "same result"

    async def run_all() -> list[Any]:
        client = AsyncOpenAI(base_url=str(live.client.base_url), api_key="sk-x")
        agent = Agent(name="researcher", instructions="Use the lookup tool, then answer.", tools=[lookup],
                      model=OpenAIChatCompletionsModel(model="m", openai_client=client))
        try:
            return await asyncio.gather(*(Runner.run(agent, f"find {marker}", max_turns=4) for _ in range(4)))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    assert all(result.final_output for result in results)
    steps = live.steps_of(marker, 8)
    trajectories = assert_rollouts(steps, rollouts=4, length=2)
    for chain in trajectories.values():
        assert json.loads(chain[0]["tool_calls_json"])[0]["function"]["name"] == "lookup"
        assert any(m["role"] == "tool" for m in json.loads(chain[1]["prompt_messages"]))
