"""Data-fidelity report: a generated agent workload with known ground truth through the pure linker and
feedback resolution (the logic the stream worker runs), counting how every step, reward and prompt group
landed, for each way rollout workers hold their client connections.

The workload mixes what breaks naive linking: GRPO groups of 4 rollouts of one task whose rollouts share
their first actions (few distinct actions and observations, so histories collide), run in waves as a
rollout worker runs a batch of prompts, calls interleaved at random; frameworks that re-serialize
tool-call arguments; context compaction; n > 1 calls (distinct choices, one continued; identical
choices, both continued); engine ids drawn like Ollama's ``chatcmpl-<0..998>``; a second epoch of the
same tasks ten minutes later (new groups of the same prompts); feedback by response id and by step id.
Two kinds of retry, one workload each:

- ``client_retries``: the client's retry of a failed call (a timeout or a 5xx: the proxy records the
  first try as failed), as the openai SDK does;
- ``agent_reasks``: the agent throws an answer away and asks the same prompt again (not on a first
  call, where no content can tell it from another rollout).

Connection patterns (what the proxy records as ``client_connection``):

- ``per_rollout``: a client per rollout;
- ``shared_async``: one AsyncOpenAI client for all rollouts (each call on one of its pooled connections);
- ``shared_sync``: one sync client for all rollouts, first turns streamed (the SDK drops the connection
  after a streamed call, so the next call opens a new one; 20% of later calls stream too);
- ``per_call``: a new connection for every call;
- ``none``: recorded traffic without connection ids.

Per pattern and workload:

- ``misassigned_steps``: silently wrong steps: a continuation marked ``root``, a thrown-away answer that
  stands unflagged, a kept step marked ``superseded``, two live steps at one index of a trajectory, or a
  trajectory whose prompts are not each an extension of the previous step's prompt and reply. Flagged
  steps (``ambiguous``, ``compacted``) are honest, not misassigned;
- ``wrongly_superseded``: steps the agent kept marked ``superseded`` (``continued_superseded``: those it
  went on from);
- ``thrown_away_standing``: thrown-away answers not superseded (flagged or not); ``failed_standing``:
  failed tries left standing after the client retried them;
- ``groups_exact``: true GRPO groups (task and epoch) whose rollouts' steps carry exactly one inferred
  group, carried by no other group's steps, of ``groups``; ``group_steps_without_group``: kept steps of
  rollouts with no group (flagged starts);
- rewards: feedback for every kept step (half by response id, half by step id), resolved, dead-lettered
  (engine ids reused within the window), misassigned.

    .venv/bin/python -m bench.fidelity_report [--groups 60] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawr1.core.conversation import prefix_digests
from clawr1.streams.linking import DEFAULT_GROUP_WINDOW_MS, SUPERSEDED, LinkState, link_turn, step_ids_of
from clawr1.streams.rewards import feedback_fact
from clawr1.streams.targets import Target, TargetState, add_feedback, add_target
from clawr1.streams.turns import turn_from_llm_call
from tests.support.events import feedback, llm_call

RESULTS = Path(__file__).resolve().parent / "results"
HORIZON_MS, BOUND, WINDOW_MS = 24 * 3_600_000, 2048, 3_600_000
PATTERNS = ("per_rollout", "shared_async", "shared_sync", "per_call", "none")
WORKLOADS = {"client_retries": (0.10, 0.0), "agent_reasks": (0.0, 0.15)}  # (failed try p, re-ask p)
WAVE = 8  # prompts a rollout worker runs at once (4 rollouts each)
POOL = 4  # connections of the shared async client's pool
EPOCH_GAP_MS = 10 * 60_000


@dataclass
class Call:
    """One captured call and its ground truth."""

    record: dict[str, Any]
    kind: str  # kept | failed (a try the client retried) | thrown (an answer the agent threw away)
    root: bool  # the first call of its rollout (or a compacted restart, which may be flagged)
    rollout: int | None  # None: an n > 1 call's part of the workload (groups given by the call)
    group: str | None  # the true GRPO group: task and epoch
    continued: bool  # the agent went on from it
    streamed: bool


Plan = tuple[list[dict[str, Any]], dict[str, Any], str, bool, bool]  # messages, reply, kind, root, continued


def _tool_call(action: str, n: int, spaced: bool) -> dict[str, Any]:
    arguments = json.dumps({"q": action, "n": n}, separators=(", ", ": ") if spaced else (",", ":"))
    return {"id": f"call_{action}_{n}", "type": "function",
            "function": {"name": "search", "arguments": arguments}}


def _rollout_calls(rng: random.Random, task: str, actions: list[str], failed_p: float, reask_p: float,
                   compact: bool) -> list[Plan]:
    """The calls of one rollout, in order."""
    system = {"role": "system", "content": "use the search tool"}
    history: list[dict[str, Any]] = [system, {"role": "user", "content": task}]
    out: list[Plan] = []
    for depth, action in enumerate(actions):
        last = depth == len(actions) - 1
        if rng.random() < failed_p:  # the call failed; the client sent it again
            out.append((list(history), {}, "failed", False, False))
        if depth and rng.random() < reask_p:  # answered, thrown away, asked again
            discarded = _tool_call(action + "-discarded", depth, False)
            out.append((list(history), {"role": "assistant", "content": None, "tool_calls": [discarded]},
                        "thrown", False, False))
        reply = {"role": "assistant", "content": None, "tool_calls": [_tool_call(action, depth, False)]}
        out.append((list(history), reply, "kept", depth == 0, not last and not (compact and depth == 1)))
        observation = rng.choice(["none", "one hit", "two hits"])
        spaced = rng.random() < 0.5  # the framework re-serializes the arguments it echoes
        history += [{"role": "assistant", "content": None, "tool_calls": [_tool_call(action, depth, spaced)]},
                    {"role": "tool", "tool_call_id": f"call_{action}_{depth}", "content": observation}]
        if compact and depth == 1:
            history = [system, {"role": "user", "content": task},
                       {"role": "user", "content": f"summary: searched twice, last {observation}"}]
            summary = {"role": "assistant", "content": "after-compaction"}
            out.append((list(history), summary, "kept", True, not last))
            history.append(summary)
            history.append({"role": "user", "content": "go on"})
    return out


class Connections:
    """The client connection each call comes on, as the proxy records it, under a pattern."""

    def __init__(self, pattern: str, rng: random.Random) -> None:
        self.pattern, self.rng, self.opened = pattern, rng, 0

    def __call__(self, rollout: int, streamed: bool) -> str:
        if self.pattern == "per_rollout":
            return f"rollout-{rollout}"
        if self.pattern == "shared_async":
            return f"pool-{self.rng.randrange(POOL)}"
        if self.pattern == "shared_sync":
            connection = f"sync-{self.opened}"
            self.opened += streamed  # the SDK drops a connection after a streamed call
            return connection
        if self.pattern == "per_call":
            self.opened += 1
            return f"call-{self.opened}"
        return ""


def workload(rng: random.Random, groups: int, pattern: str, failed_p: float, reask_p: float) -> list[Call]:
    """Calls of ``groups`` GRPO groups (4 rollouts each) in waves of ``WAVE`` prompts, then a second epoch
    of the first quarter of the tasks, then n > 1 calls; with truth."""
    connection = Connections(pattern, random.Random(rng.random()))
    epochs = [[f"task {g}" for g in range(groups)], [f"task {g}" for g in range(groups // 4)]]
    waves = [(epoch, tasks[w:w + WAVE]) for epoch, tasks in enumerate(epochs)
             for w in range(0, len(tasks), WAVE)]
    calls: list[Call] = []
    clock = 1_000_000
    rollouts = 0
    for n, (epoch, tasks) in enumerate(waves):
        if n and epoch != waves[n - 1][0]:
            clock += EPOCH_GAP_MS  # the next epoch: the same prompts again, as new groups
        wave = [(task, f"{task}/epoch {epoch}") for task in tasks]
        streams: list[tuple[int, str, list[Plan]]] = []
        for task, group in wave:
            for _ in range(4):
                depth = rng.randint(1, 4)
                actions = [rng.choice(["search", "read"]) for _ in range(depth)]
                plan = _rollout_calls(rng, task, actions, failed_p, reask_p, rng.random() < 0.05)
                streams.append((rollouts, group, plan))
                rollouts += 1
        order = [i for i, (_, _, plan) in enumerate(streams) for _ in plan]
        rng.shuffle(order)  # the interleaving; each rollout keeps its own order
        cursor = [0] * len(streams)
        for i in order:
            rollout, group, plan = streams[i]
            messages, reply, kind, root, continued = plan[cursor[i]]
            first = cursor[i] == 0
            cursor[i] += 1
            clock += rng.randint(1, 200)
            streamed = first or rng.random() < 0.2
            failed = kind == "failed"
            record = llm_call(f"e{len(calls)}", messages, [] if failed else [reply["content"] or ""],
                              at=clock, reply_messages=None if failed else [[reply]],
                              status=500 if kind == "failed" else 200,
                              response_id=f"chatcmpl-{rng.randint(0, 998)}",
                              connection=connection(rollout, streamed))
            calls.append(Call(record, kind, root, rollout, group, continued, streamed))
    for k in range(groups // 4):  # n > 1: distinct choices, one continued; identical ones, both continued
        clock += 10
        prompt = [{"role": "user", "content": f"write {k}"}]
        calls.append(Call(llm_call(f"n{k}", prompt, ["left", "right"], at=clock,
                                   response_id=f"chatcmpl-{rng.randint(0, 998)}"), "kept", True, None, None,
                          True, False))
        pick = rng.choice(["left", "right"])
        history = [*prompt, {"role": "assistant", "content": pick}, {"role": "user", "content": "shorter"}]
        calls.append(Call(llm_call(f"n{k}-next", history, ["ok"], at=clock + 5,
                                   response_id=f"chatcmpl-{rng.randint(0, 998)}"), "kept", False, None, None,
                          False, False))
        same = [{"role": "user", "content": f"greedy {k}"}]
        calls.append(Call(llm_call(f"g{k}", same, ["same", "same"], at=clock + 6, model="m-greedy",
                                   connection=connection(0, True)), "kept", True, None, None, True, True))
        again = [*same, {"role": "assistant", "content": "same"}, {"role": "user", "content": "again"}]
        for c in range(2):
            calls.append(Call(llm_call(f"g{k}-next{c}", again, ["done"], at=clock + 7 + c, model="m-greedy",
                                       connection=connection(0, False)), "kept", False, None, None, False,
                              False))
    return calls


def run(groups: int, seed: int, pattern: str, failed_p: float, reask_p: float) -> dict[str, Any]:
    rng = random.Random(seed)
    calls = workload(rng, groups, pattern, failed_p, reask_p)
    states: dict[str, LinkState] = {}
    steps: dict[str, dict[str, Any]] = {}
    superseded: set[str] = set()
    started = time.perf_counter()
    for call in calls:
        turn = turn_from_llm_call(call.record)
        state = states.setdefault(call.record["conversation_key"], LinkState())
        linked = link_turn(state, turn, HORIZON_MS, BOUND, DEFAULT_GROUP_WINDOW_MS)
        replies = [reply.messages for reply in turn.replies] or [[]]
        for step_id, assignment, reply in zip(step_ids_of(turn), linked.assignments, replies, strict=True):
            steps[step_id] = {"a": assignment, "status": assignment.link_status, "call": call, "turn": turn,
                              "reply": reply}
        # As the join folds them: superseded unless revived; a revived step stays revived.
        superseded |= {s for s, _ in linked.superseded}
        for step_id, _ in linked.unsuperseded:
            steps[step_id]["revived"] = True
    link_seconds = time.perf_counter() - started
    for step_id, s in steps.items():
        if step_id in superseded and not s.get("revived"):
            s["status"] = SUPERSEDED
    statuses = Counter(s["status"] for s in steps.values())
    rewards = _rewards(rng, steps)
    return {"calls": len(calls), "steps": len(steps), "link_seconds": round(link_seconds, 3),
            **{k: statuses.get(k, 0) for k in ("linked", "root", "ambiguous", "compacted", "superseded")},
            **_misassigned(steps), **_groups(steps), **rewards}


def _state_after(steps: dict[str, dict[str, Any]], step_id: str | None) -> str | None:
    """Digest of a step's prompt plus reply: the state a call after it starts from."""
    if step_id is None:
        return None
    s = steps[step_id]
    return prefix_digests([*s["turn"].messages, *s["reply"]])[-1]


def _misassigned(steps: dict[str, dict[str, Any]]) -> dict[str, int]:
    wrong: set[str] = set()
    counts: Counter[str] = Counter()
    # States a flagged step names (its candidate's), and states some rollout ended at.
    doubted = {_state_after(steps, s["a"].candidate_step_id) for s in steps.values()
               if s["status"] == "ambiguous"}
    ended = {_state_after(steps, step_id) for step_id, s in steps.items()
             if s["call"].kind == "kept" and not s["call"].continued and s["call"].rollout is not None}
    for step_id, s in steps.items():
        call, status = s["call"], s["status"]
        if call.kind == "kept" and status == SUPERSEDED:
            wrong.add(step_id)
            counts["wrongly_superseded"] += 1
            counts["continued_superseded"] += call.continued
        if call.kind == "thrown" and status != SUPERSEDED:
            counts["thrown_away_standing"] += 1
            after = _state_after(steps, s["a"].parent_step_id)
            if status == "ambiguous" or after in doubted:
                counts["thrown_away_flagged"] += 1  # a flagged step names the state it stands after
            else:
                wrong.add(step_id)
                # Content cannot tell it: a rollout ended at that state, as if it had gone on with it.
                counts["thrown_away_indistinguishable"] += after in ended
        if call.kind == "failed" and status != SUPERSEDED:
            counts["failed_standing"] += 1
        if status == "root" and not call.root:
            wrong.add(step_id)  # a silent split
    live: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for step_id, s in steps.items():
        if s["status"] != SUPERSEDED and s["call"].kind != "failed":
            live[s["a"].trajectory_id].append((s["a"].step_index, step_id))
    for chain in live.values():
        chain.sort()
        indexes = [i for i, _ in chain]
        if len(set(indexes)) != len(indexes):
            wrong.update(step_id for _, step_id in chain)
        for (_, before), (_, after) in zip(chain, chain[1:], strict=False):
            prefix = [*steps[before]["turn"].messages, *steps[before]["reply"]]
            if not _extends(steps[after]["turn"].messages, prefix):
                wrong.add(after)
    return {"misassigned_steps": len(wrong), **{k: counts[k] for k in (
        "wrongly_superseded", "continued_superseded", "thrown_away_standing", "thrown_away_flagged",
        "thrown_away_indistinguishable", "failed_standing")}}


def _extends(messages: list[dict[str, Any]], prefix: list[dict[str, Any]]) -> bool:
    """``messages`` continue ``prefix`` (compared canonically, as the linker compares)."""
    if len(messages) <= len(prefix):
        return False
    return prefix_digests(messages)[len(prefix) - 1] == prefix_digests(prefix)[-1]


def _groups(steps: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Inferred prompt groups against the true GRPO groups (task and epoch), over the steps the agents
    kept that are not flagged (a flagged start has no group: it may be any rollout's)."""
    inferred: dict[str, set[str | None]] = defaultdict(set)
    holders: dict[str, set[str]] = defaultdict(set)
    flagged = {s["a"].trajectory_id for s in steps.values() if s["status"] in ("ambiguous", "compacted")}
    ungrouped = 0
    for s in steps.values():
        call, assignment = s["call"], s["a"]
        if call.group is None or call.kind != "kept" or s["status"] == SUPERSEDED \
                or assignment.trajectory_id in flagged:
            continue
        if not assignment.prompt_group_inferred:
            ungrouped += 1
        inferred[call.group].add(assignment.prompt_group_id)
        holders[assignment.prompt_group_id or ""].add(call.group)
    exact = sum(len(ids) == 1 and None not in ids and holders[next(iter(ids)) or ""] == {group}
                for group, ids in inferred.items())
    return {"groups": len(inferred), "groups_exact": exact, "group_steps_without_group": ungrouped}


def _rewards(rng: random.Random, steps: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Feedback for every kept step, half by response id, half by step id, through target resolution."""
    targets: dict[str, TargetState] = {}
    for step_id, s in steps.items():
        turn = s["turn"]
        created = turn.created_at_ms
        response_id = turn.engine_response_id if len(turn.replies) <= 1 else f"{turn.engine_response_id}:" \
            f"{step_id.rsplit(':', 1)[1]}"
        for target_id in (step_id, response_id):
            if target_id is not None:
                add_target(targets.setdefault(target_id, TargetState()), target_id, step_id,
                           Target(s["a"].trajectory_id, created), WINDOW_MS)
    resolved = refused = wrong = 0
    for step_id, s in sorted(steps.items()):
        if s["call"].kind != "kept":
            continue
        by_response = rng.random() < 0.5 and s["turn"].engine_response_id is not None
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
    report: dict[str, Any] = {"groups": args.groups, "seed": args.seed,
                              "group_window_ms": DEFAULT_GROUP_WINDOW_MS}
    for name, (failed_p, reask_p) in WORKLOADS.items():
        report[name] = {pattern: run(args.groups, args.seed, pattern, failed_p, reask_p)
                        for pattern in PATTERNS}
    print(json.dumps(report, indent=2))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"fidelity-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
