"""Data-fidelity report: a generated agent workload with known ground truth through the pure linker and
feedback resolution (the logic the stream worker runs), counting how every step and reward landed.

The workload mixes what breaks naive linking: GRPO groups whose rollouts share their first actions
(few distinct actions and observations, so histories collide), interleaved at random; retries whose
thrown-away reply is never continued; frameworks that re-serialize tool-call arguments; context
compaction; n > 1 calls whose agent continues one choice; engine ids drawn like Ollama's
``chatcmpl-<0..998>``; feedback by response id and by step id.

A step is *misassigned* when it is silently wrong: a continuation marked ``root``, a thrown-away
retry not ``superseded`` (or a kept step that is), two live steps at one index of a trajectory, or
a trajectory whose prompts are not each an extension of the previous step's prompt and reply.
Flagged steps (``ambiguous``, ``compacted``) are honest, not misassigned. A reward is misassigned
when it resolves to a step other than the one it was meant for.

    .venv/bin/python -m bench.fidelity_report [--groups 60] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawr1.core.conversation import prefix_digests
from clawr1.streams.linking import LinkState, link_turn, step_ids_of
from clawr1.streams.rewards import feedback_fact
from clawr1.streams.targets import Target, TargetState, add_feedback, add_target
from clawr1.streams.turns import turn_from_llm_call
from tests.integration.streams.events import feedback, llm_call

RESULTS = Path(__file__).resolve().parent / "results"
HORIZON_MS, BOUND, WINDOW_MS = 24 * 3_600_000, 2048, 3_600_000


@dataclass
class Call:
    """One captured call and its ground truth."""

    record: dict[str, Any]
    thrown_away: bool  # a retry the agent did not continue
    root: bool  # the first call of its rollout (or a compacted restart, which may be flagged)
    compacted: bool = False


def _tool_call(action: str, n: int, spaced: bool) -> dict[str, Any]:
    arguments = json.dumps({"q": action, "n": n}, separators=(", ", ": ") if spaced else (",", ":"))
    return {"id": f"call_{action}_{n}", "type": "function",
            "function": {"name": "search", "arguments": arguments}}


def _rollout_calls(rng: random.Random, task: str, actions: list[str], retry_p: float,
                   compact: bool) -> list[tuple[list[dict[str, Any]], dict[str, Any], bool, bool, bool]]:
    """(messages, reply, thrown away, root, compacted) per call of one rollout, in order."""
    system = {"role": "system", "content": "use the search tool"}
    history: list[dict[str, Any]] = [system, {"role": "user", "content": task}]
    out = []
    for depth, action in enumerate(actions):
        if depth and rng.random() < retry_p:  # asked, threw the answer away, asked again
            discarded = _tool_call(action + "-discarded", depth, False)
            out.append((list(history), {"role": "assistant", "content": None, "tool_calls": [discarded]},
                        True, False, False))
        reply = {"role": "assistant", "content": None, "tool_calls": [_tool_call(action, depth, False)]}
        out.append((list(history), reply, False, depth == 0, False))
        observation = rng.choice(["none", "one hit", "two hits"])
        spaced = rng.random() < 0.5  # the framework re-serializes the arguments it echoes
        history += [{"role": "assistant", "content": None, "tool_calls": [_tool_call(action, depth, spaced)]},
                    {"role": "tool", "tool_call_id": f"call_{action}_{depth}", "content": observation}]
        if compact and depth == 1:
            history = [system, {"role": "user", "content": task},
                       {"role": "user", "content": f"summary: searched twice, last {observation}"}]
            summary = {"role": "assistant", "content": "after-compaction"}
            out.append((list(history), summary, False, True, True))
            history.append(summary)
            history.append({"role": "user", "content": "go on"})
    return out


def workload(rng: random.Random, groups: int, connections: bool) -> list[Call]:
    """Interleaved calls of ``groups`` GRPO groups (4 rollouts each) plus n>1 calls, with truth;
    ``connections``: each rollout's calls carry its client connection id, as the proxy records."""
    streams: list[list[tuple[list[dict[str, Any]], dict[str, Any], bool, bool, bool]]] = []
    for g in range(groups):
        task = f"task {g}"
        for _ in range(4):
            depth = rng.randint(1, 4)
            actions = [rng.choice(["search", "read"]) for _ in range(depth)]
            streams.append(_rollout_calls(rng, task, actions, 0.15, rng.random() < 0.05))
    order = [i for i, s in enumerate(streams) for _ in s]
    rng.shuffle(order)  # the interleaving; each rollout keeps its own order below
    cursor = [0] * len(streams)
    calls: list[Call] = []
    clock = 1_000_000
    for i in order:
        messages, reply, thrown, root, compacted = streams[i][cursor[i]]
        cursor[i] += 1
        clock += rng.randint(1, 200)
        record = llm_call(f"e{len(calls)}", messages, [reply["content"] or ""], at=clock,
                          reply_messages=[[reply]], response_id=f"chatcmpl-{rng.randint(0, 998)}",
                          connection=f"conn-{i}" if connections else "")
        calls.append(Call(record, thrown, root, compacted))
    for k in range(groups // 4):  # n > 1: the agent continues one of two choices
        clock += 10
        prompt = [{"role": "user", "content": f"write {k}"}]
        calls.append(Call(llm_call(f"n{k}", prompt, ["left", "right"], at=clock,
                                   response_id=f"chatcmpl-{rng.randint(0, 998)}"), False, True))
        pick = rng.choice(["left", "right"])
        history = [*prompt, {"role": "assistant", "content": pick}, {"role": "user", "content": "shorter"}]
        calls.append(Call(llm_call(f"n{k}-next", history, ["ok"], at=clock + 5,
                                   response_id=f"chatcmpl-{rng.randint(0, 998)}"), False, False))
    return calls


def run(groups: int, seed: int, connections: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    calls = workload(rng, groups, connections)
    states: dict[str, LinkState] = {}
    steps: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for call in calls:
        turn = turn_from_llm_call(call.record)
        state = states.setdefault(call.record["conversation_key"], LinkState())
        linked = link_turn(state, turn, HORIZON_MS, BOUND)
        placed = zip(step_ids_of(turn), linked.assignments, turn.replies, strict=True)
        for step_id, assignment, reply in placed:
            steps[step_id] = {"a": assignment, "status": assignment.link_status, "call": call, "turn": turn,
                              "reply": reply.messages}
        for step_id, _ in linked.superseded:
            steps[step_id]["status"] = "superseded"
    link_seconds = time.perf_counter() - started
    misassigned = _misassigned(steps)
    rewards = _rewards(rng, steps)
    statuses = Counter(s["status"] for s in steps.values())
    return {"calls": len(calls), "steps": len(steps), "link_seconds": round(link_seconds, 3),
            **{k: statuses.get(k, 0) for k in ("linked", "root", "ambiguous", "compacted", "superseded")},
            "misassigned_steps": misassigned, **rewards}


def _misassigned(steps: dict[str, dict[str, Any]]) -> int:
    wrong = set()
    for step_id, s in steps.items():
        call, status = s["call"], s["status"]
        if (status == "superseded") != call.thrown_away:
            wrong.add(step_id)
        if status == "root" and not call.root:
            wrong.add(step_id)  # a silent split
    live: dict[str, list[tuple[int, str]]] = {}
    for step_id, s in steps.items():
        if s["status"] != "superseded":
            live.setdefault(s["a"].trajectory_id, []).append((s["a"].step_index, step_id))
    for chain in live.values():
        chain.sort()
        indexes = [i for i, _ in chain]
        if len(set(indexes)) != len(indexes):
            wrong.update(step_id for _, step_id in chain)
        for (_, before), (_, after) in zip(chain, chain[1:], strict=False):
            prefix = [*steps[before]["turn"].messages, *steps[before]["reply"]]
            if not _extends(steps[after]["turn"].messages, prefix):
                wrong.add(after)
    return len(wrong)


def _extends(messages: list[dict[str, Any]], prefix: list[dict[str, Any]]) -> bool:
    """``messages`` continue ``prefix`` (compared canonically, as the linker compares)."""
    if len(messages) <= len(prefix):
        return False
    return prefix_digests(messages)[len(prefix) - 1] == prefix_digests(prefix)[-1]


def _rewards(rng: random.Random, steps: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Feedback for every kept step, half by response id, half by step id, through target resolution."""
    targets: dict[str, TargetState] = {}
    for step_id, s in steps.items():
        turn = s["turn"]
        created = turn.created_at_ms
        response_id = turn.engine_response_id if len(turn.replies) == 1 else f"{turn.engine_response_id}:" \
            f"{step_id.rsplit(':', 1)[1]}"
        for target_id in (step_id, response_id):
            add_target(targets.setdefault(target_id, TargetState()), target_id, step_id,
                       Target(s["a"].trajectory_id, created), WINDOW_MS)
    resolved = refused = wrong = 0
    for step_id, s in sorted(steps.items()):
        if s["status"] == "superseded":
            continue
        by_response = rng.random() < 0.5
        target_id = s["turn"].engine_response_id if by_response and len(s["turn"].replies) == 1 else step_id
        fact = feedback_fact(feedback(f"fb-{step_id}", "response" if by_response else "step", target_id,
                                      reward=1.0, at=s["turn"].created_at_ms + 500))
        _, forwards, refusals = add_feedback(targets[target_id], target_id, fact, {}, WINDOW_MS)
        refused += bool(refusals)
        resolved += bool(forwards)
        wrong += sum(f.step_id != step_id for f in forwards)
    return {"rewards_resolved": resolved, "rewards_dead_lettered": refused, "rewards_misassigned": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=60, help="GRPO groups of 4 rollouts")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    report = {"groups": args.groups, "seed": args.seed,
              # as the proxy records calls now, and as recorded traffic without connection ids
              "with_client_connection": run(args.groups, args.seed, connections=True),
              "without_any_signal": run(args.groups, args.seed, connections=False)}
    print(json.dumps(report, indent=2))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"fidelity-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
