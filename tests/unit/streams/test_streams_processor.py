"""The stream logic between a checkpoint's state and its outbox, without Kafka: where work runs, what a
checkpoint writes, and how feedback finds its step by a routable id or by the index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_a_posted_trajectory_is_joined_where_it_lands_with_one_record_and_one_chunk() -> None:
    harness = Harness()
    for record in _whitebox_trajectory("t-1", 10):
        harness.whitebox(record)
    harness.checkpoint()
    assert harness.hops == 0  # no index entry, no trajectory message: everything in one partition
    assert len(harness.steps) == 10 and all(s["ready"] for s in harness.steps.values())
    assert all(s["response_id"] == s["step_id"] for s in harness.steps.values())
    assert CountingStore.writes == 2  # the trajectory's record and its one chunk of step facts
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
    assert CountingStore.writes == 4  # two trajectories: a record and a chunk each
    before = CountingStore.writes
    harness.feedback(feedback("fb", "trajectory", "t-4", reward=1.0, terminal=True))
    harness.checkpoint()
    assert CountingStore.writes - before == 1  # the trajectory's record only: step facts are not rewritten
    t4 = [s for s in harness.steps.values() if s["trajectory_id"] == "t-4"]
    assert all(s["trajectory_reward"] == 1.0 for s in t4) and sum(s["terminal"] for s in t4) == 1
