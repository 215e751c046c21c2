"""Token ids as int32 arrays (an envelope's packed ids, as the worker decodes them) and as lists (a lone
record, stored state) must give the worker's outputs and state byte for byte: the representation is a
cost, never a difference in what a trainer reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from clawr1.core.routing import routable_id
from clawr1.schemas.batch import pack_ints
from clawr1.schemas.codec import DecodeError, codec_for, pack_record
from clawr1.streams.trajectory_record import TAIL_TOKENS
from clawr1.streams.turns import InvalidEvent, turn_from_whitebox
from tests.support.events import assistant, feedback, llm_call, llm_key, user, whitebox_step
from tests.support.stream_harness import Harness

CODEC = codec_for()


def as_envelope(schema: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record as the worker reads it from an envelope: its int arrays numpy int32 arrays."""
    message = CODEC.encode_batch(schema, [pack_record(schema, record)])
    return CODEC.decode_records(message, expect=schema, int_arrays=True)[0]


def _whitebox_load() -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    for t in range(3):  # trajectories: each turn repeats the last and adds to it
        prompt: list[int] = [100 + t, 1, 2, 3]
        for n in range(4):
            response = [(t * 7 + n * 3 + k) % 50 for k in range(5)]
            step_id = routable_id(f"wb-{t}", f"wb-{t}/{n}".encode())
            events.append(("whitebox", whitebox_step(step_id, f"wb-{t}", n, prompt_ids=list(prompt),
                                                     response_ids=response, reward=0.5 if n % 2 else None)))
            prompt = prompt + response + [9, n]
    for g in range(4):  # a GRPO group: one prompt, four samples, merged in the group's scope
        events.append(("whitebox", whitebox_step(f"g-step-{g}", f"g-traj-{g}", 0, prompt_ids=[5, 6, 7, 8],
                                                 response_ids=[g, g + 1, 2**31 - 1], group=("grp", 4),
                                                 reward=float(g))))
    big = list(range(TAIL_TOKENS + 10))  # a fact too large for the record's tail: a chunk of its own
    events.append(("whitebox", whitebox_step(routable_id("wb-big", b"0"), "wb-big", 0, prompt_ids=big,
                                             response_ids=[1, 2])))
    events.append(("whitebox", whitebox_step("no-ids", "wb-none", 0)))  # no token ids at all
    return events


def _blackbox_load() -> list[tuple[str, dict[str, Any]]]:
    history = [user("solve it")]
    first = llm_call(routable_id("conv", b"c1"), history, ["try one", "try two"], prompt_ids=[1, 2, 3],
                     reply_ids=[[4, 5], [6, 7, 8]], response_id="chatcmpl-1")
    second = llm_call(routable_id("conv", b"c2"), [*history, assistant("try one"), user("again")],
                      ["done"], at=2_000, prompt_ids=[1, 2, 3, 4, 5, 10], reply_ids=[[11, 12]],
                      response_id="chatcmpl-2")
    reward = feedback("fb-1", "response", "chatcmpl-2", reward=1.0)
    return [("llm", first), ("llm", second), ("feedback", reward)]


def _run(events: list[tuple[str, dict[str, Any]]], arrays: bool) -> Harness:
    harness = Harness(CODEC)
    schemas = {"whitebox": "whitebox_step", "llm": "raw_llm_call"}
    for n, (kind, record) in enumerate(events):
        if kind in schemas and arrays:
            record = as_envelope(schemas[kind], record)
        if kind == "whitebox":
            harness.whitebox(record)
        elif kind == "llm":
            harness.llm(record, llm_key(record))
        else:
            harness.feedback(record)
        if n % 5 == 4:
            harness.checkpoint()
        if n == 10:  # state read back from its JSON (lists) meets new steps (arrays)
            harness.restart()
    harness.checkpoint()
    again = [(kind, record) for kind, record in events if kind == "whitebox"][:3]  # re-deliveries
    for _, record in again:
        harness.whitebox(as_envelope("whitebox_step", record) if arrays else record)
    harness.checkpoint()
    return harness


def test_arrays_and_lists_publish_and_store_the_same_bytes() -> None:
    events = _whitebox_load() + _blackbox_load()
    lists, arrays = _run(events, arrays=False), _run(events, arrays=True)
    assert [(e.topic, e.partition, e.value) for e in arrays.published] \
        == [(e.topic, e.partition, e.value) for e in lists.published]
    assert arrays.partitions == lists.partitions
    published = {e.topic for e in lists.published}
    assert {"steps", "nodes", "work"} <= published and "dead" not in published  # every path ran, cleanly
    assert any(isinstance(s["prompt_token_ids"], np.ndarray) for s in arrays.steps.values())
    # 17 white-box steps with ids, three black-box replies (two choices, then one)
    assert sum(len(s["prompt_token_ids"]) > 0 for s in lists.steps.values()) == 20


def test_a_negative_id_in_an_array_is_refused_as_in_a_list() -> None:
    record = whitebox_step("s", "t", 0, prompt_ids=[1, 2], response_ids=[3])
    packed = as_envelope("whitebox_step", record)
    assert turn_from_whitebox(packed).prompt_token_ids.tolist() == [1, 2]
    bad = {**packed, "response_token_ids": np.array([3, -1], dtype=np.int32)}
    with pytest.raises(InvalidEvent, match="response_token_ids must be a list of non-negative integers"):
        turn_from_whitebox(bad)
    with pytest.raises(InvalidEvent, match="response_token_ids must be a list of non-negative integers"):
        turn_from_whitebox({**record, "response_token_ids": [3, -1]})


def test_an_envelope_with_a_packed_array_of_impossible_size_is_a_decode_error() -> None:
    packed = pack_record("whitebox_step", whitebox_step("s", "t", 0, prompt_ids=[1, 2], response_ids=[3]))
    broken = CODEC.encode_batch("whitebox_step", [{**packed, "prompt_token_ids": pack_ints([1, 2])[:-1]}])
    for int_arrays in (False, True):
        with pytest.raises(DecodeError, match="packed array"):
            CODEC.decode_records(broken, expect="whitebox_step", int_arrays=int_arrays)


def test_arrays_pack_as_lists_do_and_out_of_range_ids_still_raise() -> None:
    ids = [0, 1, 2**31 - 1, 7]
    for dtype in (np.int32, np.int64, np.uint32):
        assert pack_ints(np.array(ids, dtype=dtype)) == pack_ints(ids)
    assert pack_ints(np.array([], dtype=np.int64)) == pack_ints([]) == b""
    with pytest.raises(OverflowError):
        pack_ints(np.array([2**31], dtype=np.int64))
    with pytest.raises(OverflowError):
        pack_ints([2**31])
