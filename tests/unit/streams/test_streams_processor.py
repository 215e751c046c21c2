"""The stream logic between a checkpoint's state and its outbox, without Kafka: where work runs, what a
checkpoint writes, and how feedback finds its step by a routable id or by the index."""

from __future__ import annotations

from typing import Any

import orjson

from clawr1.core.routing import key_hash, routable_id
from tests.support.events import feedback, growing_conversation, llm_call, user, whitebox_step
from tests.support.stream_harness import CountingStore, Harness, decoded_state


def _whitebox_trajectory(trajectory: str, length: int, reward: float | None = 1.0) -> list[dict[str, Any]]:
    return [whitebox_step(routable_id(trajectory, f"{trajectory}/{n}".encode()), trajectory, n,
                          prompt_ids=list(range(10 + n)), response_ids=[7, n], reward=reward)
            for n in range(length)]


def test_a_posted_trajectory_is_joined_where_it_lands_with_one_record() -> None:
    harness = Harness()
    for record in _whitebox_trajectory("t-1", 10):
        harness.whitebox(record)
    harness.checkpoint()
    assert harness.hops == 0  # no index entry, no trajectory message: everything in one partition
    assert len(harness.steps) == 10 and all(s["ready"] for s in harness.steps.values())
    assert all(s["response_id"] == s["step_id"] for s in harness.steps.values())
    assert CountingStore.writes == 1  # the trajectory's record, its step facts in the record's tail
    assert sorted(s["parent_step_id"] is None for s in harness.steps.values()) == [False] * 9 + [True]


def test_feedback_by_a_routable_step_id_finds_its_step_before_or_after_it_arrived() -> None:
    harness = Harness()
    steps = _whitebox_trajectory("t-2", 3, reward=None)
    harness.feedback(feedback("fb-early", "step", steps[0]["step_id"], reward=0.5))
    harness.checkpoint()
    for record in steps:
        harness.whitebox(record)
    harness.checkpoint()
    harness.feedback(feedback("fb-late", "response", steps[2]["step_id"], reward=0.25))
    harness.checkpoint()
    assert harness.steps[steps[0]["step_id"]]["reward"] == 0.5
    assert harness.steps[steps[2]["step_id"]]["reward"] == 0.25
    assert harness.steps[steps[1]["step_id"]]["reward"] is None
    assert not any(key.startswith(b"X/") for p in harness.partitions for key in p)  # no index


def test_other_ids_are_indexed_and_feedback_meets_the_index() -> None:
    harness = Harness()
    harness.whitebox(whitebox_step("client-chosen", "t-3", 0, prompt_ids=[1, 2], response_ids=[3]))
    harness.checkpoint()
    harness.feedback(feedback("fb", "step", "client-chosen", reward=1.0))
    harness.checkpoint()
    assert harness.steps["client-chosen"]["reward"] == 1.0
    assert any(key.startswith(b"X/client-chosen") for p in harness.partitions for key in p)


def _call(key: str, name: str, history: list[dict[str, Any]], reply: str, at: int) -> dict[str, Any]:
    """A call without token ids: no prefix-tree merge, whose prompt group keeps records of its own."""
    return llm_call(routable_id(key, name.encode()), history, [reply], at=at, response_id=f"chatcmpl-{name}")


def _keys(harness: Harness, prefix: bytes) -> list[bytes]:
    return sorted(k for p in harness.partitions for k in p if k.startswith(prefix))


def _started(key: str, name: str) -> tuple[Harness, dict[str, Any]]:
    """A harness after a conversation's first call and its checkpoint."""
    harness = Harness()
    first = _call(key, name, [user("task")], "a", 1_000)
    harness.llm(first, key)
    harness.checkpoint()
    return harness, first


def test_a_black_box_conversation_is_one_record_with_its_link_state() -> None:
    key = "conversation-root"
    harness, first = _started(key, "call-1")
    before = CountingStore.writes
    second = _call(key, "call-2", [user("task"), {"role": "assistant", "content": "a"}, user("more")], "b",
                   2_000)
    harness.llm(second, key)
    harness.checkpoint()
    one, two = first["event_id"], second["event_id"]
    assert harness.steps[two]["trajectory_id"] == f"traj-{one}"
    assert harness.steps[two]["parent_step_id"] == one
    # A call writes its conversation's record (link state and trajectory) and its response id's index entry.
    assert CountingStore.writes - before == 2
    assert _keys(harness, b"R/") == [f"R/{key_hash(key)}".encode()]
    assert _keys(harness, b"L/") == _keys(harness, b"T/") == _keys(harness, b"S/") == []
    harness.feedback(feedback("fb", "step", two, reward=1.0))
    harness.feedback(feedback("fb-first", "step", one, reward=0.5))
    harness.checkpoint()
    assert harness.steps[two]["reward"] == 1.0  # found by a scan of the record its id's hash names
    assert harness.steps[one]["reward"] == 0.5  # its trajectory's namesake


def test_a_second_trajectory_of_a_key_moves_the_first_out_and_feedback_still_finds_both() -> None:
    harness = Harness()
    key = "shared-task"
    calls = [_call(key, "a0", [user("task")], "x", 1_000)]
    calls.append(_call(key, "a1", [user("task"), {"role": "assistant", "content": "x"}, user("go")], "y",
                       2_000))
    for call in calls:
        harness.llm(call, key)
    harness.checkpoint()
    assert not _keys(harness, b"T/")  # one trajectory: it lives in the conversation's record
    calls.append(_call(key, "b0", [user("task")], "z", 3_000))  # another rollout of the same task
    harness.llm(calls[-1], key)
    harness.checkpoint()
    trajectories = {harness.steps[c["event_id"]]["trajectory_id"] for c in calls}
    assert trajectories == {f"traj-{calls[0]['event_id']}", f"traj-{calls[2]['event_id']}"}
    records = decoded_state(harness, b"R/")
    (home,) = records.values()
    assert home["t"] == {}  # both trajectories under their own ids' hashes now
    assert len(_keys(harness, b"T/")) == 2
    # The continuation is no longer found by a scan of its hash's record: it got an index entry.
    assert _keys(harness, b"S/") == [f"S/{calls[1]['event_id']}".encode()]
    harness.restart()
    for n, call in enumerate(calls):
        harness.feedback(feedback(f"fb-{n}", "step", call["event_id"], reward=float(n)))
    harness.checkpoint()
    assert [harness.steps[c["event_id"]]["reward"] for c in calls] == [0.0, 1.0, 2.0]


def test_state_kept_before_home_records_is_read_and_moved_into_them() -> None:
    key = "older-worker"
    harness, first = _started(key, "o1")
    # Rewrite the state as a worker before home records kept it: L/<key>, T/<hash of the trajectory id>
    # and an S entry for a continuation (none here: the first call is its trajectory's namesake).
    (name,) = _keys(harness, b"R/")
    part = next(p for p in harness.partitions if name in p)
    home = orjson.loads(part.pop(name))
    ((tid, record),) = home["t"].items()
    part[f"L/{key}".encode()] = orjson.dumps(home["l"][key])
    part[f"T/{key_hash(tid)}".encode()] = orjson.dumps({tid: record})
    harness.restart()
    second = _call(key, "o2", [user("task"), {"role": "assistant", "content": "a"}, user("more")], "b", 2_000)
    harness.llm(second, key)
    harness.checkpoint()
    assert harness.steps[second["event_id"]]["parent_step_id"] == first["event_id"]  # the link state read
    assert harness.steps[second["event_id"]]["trajectory_id"] == tid
    assert _keys(harness, b"L/") == _keys(harness, b"T/") == []  # moved, not copied
    assert list(decoded_state(harness, b"R/")[name]["t"]) == [tid]
    harness.feedback(feedback("fb", "trajectory", tid, reward=1.0, terminal=True))
    harness.checkpoint()
    assert harness.steps[first["event_id"]]["trajectory_reward"] == 1.0


def test_a_checkpoint_writes_each_key_once_however_many_events_touched_it() -> None:
    harness = Harness()
    for record in _whitebox_trajectory("t-4", 5) + _whitebox_trajectory("t-5", 5):
        harness.whitebox(record)
    harness.checkpoint()
    assert CountingStore.writes == 2  # two trajectories: a record each
    before = CountingStore.writes
    harness.feedback(feedback("fb", "trajectory", "t-4", reward=1.0, terminal=True))
    harness.checkpoint()
    assert CountingStore.writes - before == 1  # the trajectory's record only
    t4 = [s for s in harness.steps.values() if s["trajectory_id"] == "t-4"]
    assert all(s["trajectory_reward"] == 1.0 for s in t4) and sum(s["terminal"] for s in t4) == 1



def test_a_tail_that_grows_past_its_bound_is_sealed_into_a_chunk_and_facts_survive_a_restart() -> None:
    harness = Harness()
    # Prompts that share nothing with the turn before: each fact is kept whole.
    steps = [whitebox_step(routable_id("t-long", f"t-long/{n}".encode()), "t-long", n,
                           prompt_ids=list(range(n * 2_000, n * 2_000 + 1_000 + n)), response_ids=[7] * 100,
                           reward=None)
             for n in range(30)]
    writes = []
    for record in steps:  # one step per checkpoint, as an agent posts turn by turn
        before = CountingStore.writes
        harness.whitebox(record)
        harness.checkpoint()
        writes.append(CountingStore.writes - before)
    # ~1,100 tokens a step: the 8,192-token tail holds 7, the 8th seals them into a chunk of their own.
    assert writes == [2 if n in (7, 14, 21, 28) else 1 for n in range(30)]
    assert len(decoded_state(harness, b"C/")) == 4
    (record,) = decoded_state(harness, b"T/").values()
    assert sorted(record["t-long"]["tail"]) == sorted(s["step_id"] for s in steps[28:])
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-long", reward=1.0, terminal=True))
    harness.checkpoint()
    for record in steps:  # every step re-published with its tokens, from a chunk or from the tail
        published = harness.steps[record["step_id"]]
        assert published["trajectory_reward"] == 1.0
        assert list(published["prompt_token_ids"]) == record["prompt_token_ids"]
        assert list(published["response_token_ids"]) == record["response_token_ids"]


def test_a_conversations_turns_keep_each_token_id_about_once_and_read_back_whole() -> None:
    """Each turn's prompt is the conversation so far: kept as the part beyond the turn before, 30 turns
    fit the tail, and every fact reads back whole after a restart."""
    harness = Harness()
    steps = growing_conversation("t-chat", 30, first_prompt=1_000, reply=100, added=20)
    for record in steps:
        harness.whitebox(record)
        harness.checkpoint()
    assert decoded_state(harness, b"C/") == {}  # ~120 new token ids a turn: no chunk needed
    (record,) = decoded_state(harness, b"T/").values()
    assert record["t-chat"]["tail_tokens"] < 1_100 + 30 * 125
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-chat", reward=1.0, terminal=True))
    harness.checkpoint()
    for record in steps:
        published = harness.steps[record["step_id"]]
        assert list(published["prompt_token_ids"]) == record["prompt_token_ids"]
        assert published["trajectory_reward"] == 1.0


def test_a_fact_that_changes_keeps_the_facts_kept_against_it_whole() -> None:
    harness = Harness()
    first = whitebox_step(routable_id("t-edit", b"t-edit/0"), "t-edit", 0, prompt_ids=list(range(100)),
                          response_ids=[7] * 10, reward=None)
    second = whitebox_step(routable_id("t-edit", b"t-edit/1"), "t-edit", 1,
                           prompt_ids=list(range(100)) + [7] * 10 + [8] * 5, response_ids=[9], reward=None)
    for record in (first, second):
        harness.whitebox(record)
        harness.checkpoint()
    # The client sent it again, changed, later: the later fact is the step's.
    harness.whitebox({**first, "prompt_token_ids": list(range(1, 101)), "received_at_ms": 6_000})
    harness.checkpoint()
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-edit", reward=1.0, terminal=True))
    harness.checkpoint()
    assert list(harness.steps[first["step_id"]]["prompt_token_ids"]) == list(range(1, 101))
    assert list(harness.steps[second["step_id"]]["prompt_token_ids"]) == second["prompt_token_ids"]


def test_a_fact_too_big_for_the_tail_gets_a_chunk_and_records_from_before_tails_still_read() -> None:
    harness = Harness()
    big = whitebox_step(routable_id("t-big", b"t-big/0"), "t-big", 0, prompt_ids=list(range(10_000)),
                        response_ids=[7], reward=None)
    harness.whitebox(big)
    harness.checkpoint()
    assert CountingStore.writes == 2  # the record and the fact's chunk
    # A record as written before tails existed: no tail fields, every fact in a chunk.
    for partition in harness.partitions:
        for key, value in list(partition.items()):
            if key.startswith(b"T/"):
                records = orjson.loads(value)
                for record in records.values():
                    assert record.pop("tail") == {} and record.pop("tail_tokens") == 0
                partition[key] = orjson.dumps(records)
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-big", reward=1.0, terminal=True))
    harness.checkpoint()
    assert list(harness.steps[big["step_id"]]["prompt_token_ids"]) == big["prompt_token_ids"]
    assert harness.steps[big["step_id"]]["trajectory_reward"] == 1.0
