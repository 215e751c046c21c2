"""State that ends: what the worker lets go once it has not been written for the TTL, what it keeps
meanwhile, and what arrives for state that is gone (``clawr1.streams.expiry``)."""

from __future__ import annotations

from typing import Any

import orjson

from clawr1.core.routing import key_hash, partition_of, routable_id
from clawr1.streams import expiry, messages
from clawr1.streams.expiry import Clock, Wheel
from clawr1.streams.store import Store
from tests.integration.streams.events import assistant, feedback, llm_call, user, whitebox_step
from tests.unit.streams.test_streams_processor import PARTITIONS, CountingStore, Harness

TTL_MS = Harness().config.state_ttl_s * 1000


def _trajectory(name: str, length: int = 4) -> list[dict[str, Any]]:
    return [whitebox_step(routable_id(name, f"{name}/{n}".encode()), name, n, prompt_ids=list(range(20 + n)),
                          response_ids=[7, n], reward=1.0, terminal=n == length - 1) for n in range(length)]


def _tick(harness: Harness, after_ms: int) -> None:
    """Let ``after_ms`` pass, then a tick to every partition and the checkpoint it opens."""
    harness.now_ms += after_ms
    for partition in range(PARTITIONS):
        harness.processor.on_work("", messages.message(expiry.TICK), harness.origin_at(partition))
    harness.checkpoint()


def _state(harness: Harness, *skip: bytes) -> dict[str, list[bytes]]:
    """Live keys by namespace, without the wheel's own (``E``) and those named in ``skip``."""
    found: dict[str, list[bytes]] = {}
    for partition in harness.partitions:
        for key in partition:
            namespace = key.split(b"/", 1)[0].decode()
            if namespace != "E" and not key.startswith(skip):
                found.setdefault(namespace, []).append(key)
    return found


def _dead_letters(harness: Harness) -> list[dict[str, Any]]:
    return harness.dead_letters


def test_a_finished_trajectory_is_let_go_after_the_ttl_leaving_a_marker() -> None:
    harness = Harness()
    for record in _trajectory("t-done"):
        harness.whitebox(record)
    harness.checkpoint()
    assert _state(harness)  # the record (and what indexes it)
    _tick(harness, TTL_MS - 1_000)
    assert "T" in _state(harness)  # not yet
    _tick(harness, 2 * harness.processor.clock.bucket_ms)
    assert _state(harness) == {"Z": [b"Z/t-done"]}
    assert _dead_letters(harness) == []
    _tick(harness, harness.processor.clock.marker_ttl_ms + 2 * harness.processor.clock.bucket_ms)
    assert _state(harness) == {}
    wheel = [k for p in harness.partitions for k in p]
    assert all(k == b"E/cursor" for k in wheel)  # the wheel keeps only where it stands


def test_a_prompt_group_and_its_rollouts_are_let_go_together() -> None:
    harness = Harness()
    for rollout in range(4):
        name = f"t-group-{rollout}"
        for n in range(2):
            harness.whitebox(whitebox_step(routable_id(name, f"{name}/{n}".encode()), name, n,
                                           prompt_ids=list(range(30 + n)), response_ids=[rollout, n],
                                           reward=1.0, terminal=n == 1, group=("g-1", 4)))
    harness.checkpoint()
    assert {"G", "GC"} <= set(_state(harness))
    _tick(harness, TTL_MS + 2 * harness.processor.clock.bucket_ms)
    assert set(_state(harness)) == {"Z"}
    assert b"Z/g-1" in _state(harness)["Z"]


def test_state_written_again_within_the_ttl_is_kept() -> None:
    harness = Harness()
    steps = _trajectory("t-busy", 6)
    for n, record in enumerate(steps):
        harness.whitebox(record)
        harness.checkpoint()
        if n < len(steps) - 1:
            harness.now_ms += TTL_MS // 2
    _tick(harness, TTL_MS // 2)
    assert "T" in _state(harness)  # written TTL/2 ago: kept, though its first checks were due long since
    _tick(harness, TTL_MS)
    assert _state(harness) == {"Z": [b"Z/t-busy"]}


def test_a_black_box_conversation_expires_and_its_continuation_says_so() -> None:
    harness = Harness()
    key = "conversation-root"
    first = llm_call(routable_id(key, b"one"), [user("task")], ["a"], at=1_000, response_id="chatcmpl-one")
    harness.llm(first, key)
    harness.checkpoint()
    _tick(harness, TTL_MS + 2 * harness.processor.clock.bucket_ms)
    assert set(_state(harness)) == {"Z"}
    later = llm_call(routable_id(key, b"two"), [user("task"), assistant("a"), user("go on")], ["b"],
                     at=2_000, response_id="chatcmpl-two")
    harness.llm(later, key)
    again = llm_call(routable_id(key, b"three"), [user("task")], ["c"], at=2_500, response_id="chatcmpl-3")
    harness.llm(again, key)
    harness.checkpoint()
    continued, anew = harness.steps[later["event_id"]], harness.steps[again["event_id"]]
    assert continued["link_status"] == "expired"  # not a new conversation: its history is there
    assert continued["trajectory_id"] != harness.steps[first["event_id"]]["trajectory_id"]
    assert anew["link_status"] == "root"  # a first call of the same task is a new rollout


def test_feedback_for_a_step_that_never_arrives_is_a_dead_letter_when_its_state_expires() -> None:
    harness = Harness()
    ghost = routable_id("t-ghost", b"never")
    harness.feedback(feedback("fb-ghost", "step", ghost, reward=1.0))
    harness.checkpoint()
    assert "H" in _state(harness)
    _tick(harness, TTL_MS + 2 * harness.processor.clock.bucket_ms)
    assert "H" not in _state(harness)
    [letter] = _dead_letters(harness)
    assert letter["stage"] == "expire" and ghost in letter["reason"]
    assert "CLAWR1_STREAMS_STATE_TTL_S" in letter["reason"]


def test_feedback_for_an_expired_trajectory_is_a_dead_letter_not_a_silent_wait() -> None:
    harness = Harness()
    for record in _trajectory("t-late"):
        harness.whitebox(record)
    harness.checkpoint()
    _tick(harness, TTL_MS + 2 * harness.processor.clock.bucket_ms)
    harness.feedback(feedback("fb-late", "trajectory", "t-late", reward=0.5))
    harness.checkpoint()
    [letter] = _dead_letters(harness)
    assert letter["stage"] == "expire" and "t-late" in letter["reason"] and "expired" in letter["reason"]
    assert orjson.loads(letter["original_value"])["feedback_id"] == "fb-late"


def test_a_late_step_of_an_expired_trajectory_lands_but_is_not_merged_into_a_new_tree() -> None:
    harness = Harness()
    steps = _trajectory("t-resumed", 3)
    for record in steps[:2]:
        harness.whitebox(record)
    harness.checkpoint()
    assert harness.nodes  # the first steps were merged
    _tick(harness, TTL_MS + 2 * harness.processor.clock.bucket_ms)
    harness.nodes.clear()
    harness.whitebox(steps[2])
    harness.checkpoint()
    late = harness.steps[steps[2]["step_id"]]
    assert late["trajectory_id"] == "t-resumed" and late["ready"]
    assert harness.nodes == []  # the pool's tree is the expired state's: no second tree contradicts it
    record = orjson.loads(next(v for p in harness.partitions for k, v in p.items() if k.startswith(b"T/")))
    assert record["t-resumed"]["after_expiry"] is True and record["t-resumed"]["scope"] is None


def test_the_wheel_writes_one_slice_per_due_bucket_and_sweeps_each_once() -> None:
    partitions = [CountingStore() for _ in range(2)]
    store = Store(lambda p: partitions[p])
    clock = Clock(ttl_ms=60_000, marker_ttl_ms=600_000)
    wheel = Wheel(store, clock)
    wheel.schedule(0, [("t", "a"), ("t", "b"), ("z", "m")], now_ms=1_000_000)
    wheel.schedule(0, [("t", "c")], now_ms=1_000_500)
    store.flush()
    assert wheel.take(0, 1_000_000 + 59_000) == []
    assert wheel.take(0, 1_000_000 + 66_000) == [("t", "a"), ("t", "b"), ("t", "c")]
    store.flush()
    assert wheel.take(0, 1_000_000 + 66_000) == []
    assert wheel.take(0, 1_000_000 + 606_000) == [("z", "m")]
    store.flush()
    assert set(partitions[0]) == {b"E/cursor"}


def test_state_written_by_the_previous_encoding_is_read() -> None:
    """Version-1 state: step entries and link nodes as lists in field order, held feedback as a bare list,
    no times (they count as written when their check was scheduled)."""
    harness = Harness()
    key = "conversation-v1"
    first = llm_call(routable_id(key, b"one"), [user("task")], ["a"], at=1_000, response_id="chatcmpl-v1")
    harness.llm(first, key)
    harness.checkpoint()
    part = partition_of(key, PARTITIONS)
    slot = f"R/{key_hash(key)}".encode()
    home = orjson.loads(harness.partitions[part][slot])
    for link in home["l"].values():
        link["nodes"] = {s: [n.get(f, d) for f, d in _NODE_FIELDS] for s, n in link["nodes"].items()}
        link["assigned"] = {e: {**a, "assignments": [[x.get(f, d) for f, d in _ASSIGNMENT_FIELDS]
                                                     for x in a["assignments"]]}
                            for e, a in link["assigned"].items()}
    for record in home["t"].values():
        record.pop("v"), record.pop("touched_ms")
        record["steps"] = {s: [e.get(f, d) for f, d in _ENTRY_FIELDS] for s, e in record["steps"].items()}
    home.pop("v"), home.pop("touched_ms")
    harness.partitions[part][slot] = orjson.dumps(home)
    harness.restart()
    later = llm_call(routable_id(key, b"two"), [user("task"), assistant("a"), user("more")], ["b"],
                     at=2_000, response_id="chatcmpl-v1b")
    harness.llm(later, key)
    harness.checkpoint()
    step = harness.steps[later["event_id"]]
    assert step["parent_step_id"] == first["event_id"] and step["link_status"] == "linked"
    assert step["trajectory_id"] == harness.steps[first["event_id"]]["trajectory_id"]


_NODE_FIELDS = [("trajectory_id", None), ("step_index", None), ("parent_step_id", None), ("prompt", None),
                ("tail", None), ("at_ms", None), ("connection", ""), ("explicit", None), ("group_id", None),
                ("group_size", None), ("response_id", None), ("continued", False), ("superseded", False),
                ("group_inferred", False), ("group_closes_at_ms", None), ("group_key", ""), ("extra_of", "")]
_ASSIGNMENT_FIELDS = [("trajectory_id", None), ("step_index", None), ("parent_step_id", None),
                      ("link_status", "linked"), ("candidate_step_id", None), ("prompt_group_id", None),
                      ("prompt_group_size", None), ("prompt_group_inferred", False),
                      ("prompt_group_closes_at_ms", None)]
_ENTRY_FIELDS = [("chunk", None), ("base_digest", ""), ("base_digests", []), ("feedback", []),
                 ("superseded", False), ("revived", False)]
