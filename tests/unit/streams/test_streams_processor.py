"""The stream logic between a checkpoint's state and its outbox, without Kafka: where work runs, what a
checkpoint writes, and how feedback finds its step by a routable id or by the index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from clawr1.core.routing import partition_of, routable_id
from clawr1.streams.config import StreamConfig
from clawr1.streams.outbox import Outbox
from clawr1.streams.processor import Origin, Processor
from clawr1.streams.store import Store
from tests.integration.streams.events import feedback, llm_call, user, whitebox_step

PARTITIONS = 4


class CountingStore(dict[bytes, Any]):
    """A partition's store as the Quix ``State`` offers it, counting writes (changelog records)."""

    writes = 0

    def get(self, key: bytes, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key, default)

    def set(self, key: bytes, value: Any) -> None:
        self[key] = value
        CountingStore.writes += 1

    def delete(self, key: bytes) -> None:
        self.pop(key, None)
        CountingStore.writes += 1


class Harness:
    """Events in, checkpoints, and the worker's own messages delivered to their partitions."""

    def __init__(self) -> None:
        CountingStore.writes = 0
        self.partitions = [CountingStore() for _ in range(PARTITIONS)]
        self.outbox = Outbox(PARTITIONS)
        self.processor = Processor(StreamConfig("k:1", Path("/unused")), PARTITIONS,
                                   Store(lambda p: self.partitions[p]), self.outbox)
        self.steps: dict[str, dict[str, Any]] = {}
        self.hops = 0

    def restart(self) -> None:
        """A new processor over the same stores, as after a worker restart."""
        self.processor = Processor(StreamConfig("k:1", Path("/unused")), PARTITIONS,
                                   Store(lambda p: self.partitions[p]), self.outbox)

    def _at(self, partition: int) -> None:
        self.processor.partition = partition
        self.processor.origin = Origin("t", partition, 0, None, b"x", 0)

    def whitebox(self, record: dict[str, Any]) -> None:
        self._at(partition_of(record["trajectory_id"], PARTITIONS))
        self.processor.on_whitebox_step(record)

    def llm(self, record: dict[str, Any], key: str) -> None:
        self._at(partition_of(key, PARTITIONS))
        self.processor.on_llm_call(key, record)

    def feedback(self, record: dict[str, Any]) -> None:
        self._at(partition_of(record["target_id"], PARTITIONS))
        self.processor.on_feedback(record, self.processor.origin or Origin("t", 0, 0, None, None, 0))

    def checkpoint(self) -> None:
        """Flush, keep the published steps, and deliver the worker's messages (more checkpoints)."""
        while True:
            self.processor.flush()
            for record in self.outbox.steps.values():
                held = self.steps.get(record["step_id"])
                if held is None or held["version"] <= record["version"]:
                    self.steps[record["step_id"]] = record
            internal = dict(self.outbox.internal)
            self.outbox.clear()
            if not internal:
                return
            for partition, messages in internal.items():
                self.hops += 1
                self._at(partition)
                for key, message in messages:
                    self.processor.on_work(key, message)


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


def test_a_black_box_trajectory_named_after_a_routable_call_lives_beside_its_link_state() -> None:
    harness = Harness()
    key = "conversation-root"
    first = routable_id(key, b"call-1")
    second = routable_id(key, b"call-2")
    harness.llm(llm_call(first, [user("task")], ["a"], at=1_000, prompt_ids=[1, 2], reply_ids=[[3]],
                         response_id="chatcmpl-1"), key)
    harness.llm(llm_call(second, [user("task"), {"role": "assistant", "content": "a"}, user("more")], ["b"],
                         at=2_000, prompt_ids=[1, 2, 3, 4], reply_ids=[[5]], response_id="chatcmpl-2"), key)
    harness.checkpoint()
    assert harness.steps[second]["trajectory_id"] == f"traj-{first}"
    assert harness.steps[second]["parent_step_id"] == first
    # Only the engine's response ids took a hop to their index; the trajectory stayed in place.
    assert harness.hops <= 2
    harness.feedback(feedback("fb", "step", second, reward=1.0))
    harness.feedback(feedback("fb-first", "step", first, reward=0.5))
    harness.checkpoint()
    assert harness.steps[second]["reward"] == 1.0  # found through the S entry the join wrote
    # The first call is found as its trajectory's namesake: it needed no S entry of its own.
    assert harness.steps[first]["reward"] == 0.5
    assert [k for p in harness.partitions for k in p if k.startswith(b"S/")] == [f"S/{second}".encode()]


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


def _state(harness: Harness, prefix: bytes) -> dict[bytes, Any]:
    return {k: orjson.loads(v) for p in harness.partitions for k, v in p.items() if k.startswith(prefix)}


def test_a_tail_that_grows_past_its_bound_is_sealed_into_a_chunk_and_facts_survive_a_restart() -> None:
    harness = Harness()
    steps = [whitebox_step(routable_id("t-long", f"t-long/{n}".encode()), "t-long", n,
                           prompt_ids=list(range(1_000 + n)), response_ids=[7] * 100, reward=None)
             for n in range(30)]
    writes = []
    for record in steps:  # one step per checkpoint, as an agent posts turn by turn
        before = CountingStore.writes
        harness.whitebox(record)
        harness.checkpoint()
        writes.append(CountingStore.writes - before)
    # ~1,100 tokens a step: the 8,192-token tail holds 7, the 8th seals them into a chunk of their own.
    assert writes == [2 if n in (7, 14, 21, 28) else 1 for n in range(30)]
    assert len(_state(harness, b"C/")) == 4
    (record,) = _state(harness, b"T/").values()
    assert sorted(record["t-long"]["tail"]) == sorted(s["step_id"] for s in steps[28:])
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-long", reward=1.0, terminal=True))
    harness.checkpoint()
    for record in steps:  # every step re-published with its tokens, from a chunk or from the tail
        published = harness.steps[record["step_id"]]
        assert published["trajectory_reward"] == 1.0
        assert published["prompt_token_ids"] == record["prompt_token_ids"]


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
    assert harness.steps[big["step_id"]]["prompt_token_ids"] == big["prompt_token_ids"]
    assert harness.steps[big["step_id"]]["trajectory_reward"] == 1.0
