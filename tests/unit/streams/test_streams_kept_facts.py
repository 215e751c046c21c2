"""How the worker's state keeps a step's fact: token ids and logprobs packed (``packed_fact``), read back
exactly (``unpacked_fact``), state written before packing (JSON lists) still read, and facts a checkpoint
adds in bulk sealed at its end, so later rewrites of the record do not carry them again."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from clawr1.core.routing import routable_id
from clawr1.schemas.batch import pack_ints
from clawr1.streams.trajectory_record import packed_fact, unpacked_fact
from tests.support.events import feedback, growing_conversation, whitebox_step
from tests.support.stream_harness import Harness, decoded_state

LOGPROBS = [-0.1, -1e-300, 0.0, float(np.float32(-0.3371)), -17.25]


def _round_trip(kept: dict[str, Any]) -> dict[str, Any]:
    """Through the store's JSON, as a checkpoint writes it and a restart reads it."""
    return orjson.loads(orjson.dumps(kept))


def test_a_fact_packed_and_read_back_is_the_same_fact() -> None:
    base = {"step_id": "s", "prompt_token_ids": [1, 2, 2**31 - 1], "response_token_ids": np.array([4, 0]),
            "response_logprobs": LOGPROBS[:2], "response_text": "x"}
    kept = _round_trip(packed_fact(base, base["prompt_token_ids"]))
    assert all(isinstance(kept[name], str)
               for name in ("prompt_token_ids", "response_token_ids", "response_logprobs"))
    whole = unpacked_fact(kept)
    assert list(whole["prompt_token_ids"]) == [1, 2, 2**31 - 1]
    assert list(whole["response_token_ids"]) == [4, 0]
    assert whole["response_logprobs"] == LOGPROBS[:2] and whole["response_text"] == "x"


def test_a_prompt_kept_as_a_difference_reads_back_against_its_base() -> None:
    before = np.array([1, 2, 3, 4, 5], dtype=np.int32)  # the turn before: its prompt and its reply
    base = {"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7], "response_token_ids": [8], "response_logprobs": None}
    difference = {"b": "parent", "n": 5, "p": pack_ints([6, 7]).hex()}
    kept = _round_trip(packed_fact(base, difference))
    assert kept["prompt_token_ids"] == difference and kept["response_logprobs"] is None
    whole = unpacked_fact(kept, before)
    assert list(whole["prompt_token_ids"]) == [1, 2, 3, 4, 5, 6, 7]
    assert list(whole["response_token_ids"]) == [8]
    assert whole["response_logprobs"] is None


def test_a_fact_kept_before_packing_reads_as_it_was() -> None:
    kept = {"prompt_token_ids": [1, 2], "response_token_ids": [3], "response_logprobs": LOGPROBS}
    assert unpacked_fact(kept) == kept
    difference = {**kept, "prompt_token_ids": {"b": "parent", "n": 1, "p": pack_ints([9]).hex()}}
    assert list(unpacked_fact(difference, np.array([1, 2], dtype=np.int32))["prompt_token_ids"]) == [1, 9]


def _as_before_packing(kept: dict[str, Any]) -> dict[str, Any]:
    """A fact as workers kept it before packing: whole prompts, replies and logprobs as JSON lists."""
    listed = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in unpacked_fact(
        {**kept, "prompt_token_ids": []} if isinstance(kept["prompt_token_ids"], dict) else kept).items()}
    if isinstance(kept["prompt_token_ids"], dict):
        listed["prompt_token_ids"] = kept["prompt_token_ids"]
    return listed


def test_state_written_before_packing_is_read_after_a_restart() -> None:
    harness = Harness()
    prompt: list[int] = list(range(300))
    steps = []
    for n in range(4):
        reply = [40_000 + n * 7 + k for k in range(50)]
        step = whitebox_step(routable_id("t-old", f"t-old/{n}".encode()), "t-old", n, prompt_ids=list(prompt),
                             response_ids=reply, reward=None)
        steps.append({**step, "response_logprobs": [LOGPROBS[k % 5] for k in range(50)]})
        prompt += reply + [7] * 10
    for step in steps:
        harness.whitebox(step)
    harness.checkpoint()
    ((key, records),) = decoded_state(harness, b"T/").items()
    tail = records["t-old"]["tail"]
    assert all(isinstance(fact["response_logprobs"], str) for fact in tail.values())
    records["t-old"]["tail"] = {step_id: _as_before_packing(fact) for step_id, fact in tail.items()}
    before = orjson.dumps(records)
    for partition in harness.partitions:
        if key in partition:
            partition[key] = before
    harness.restart()
    harness.feedback(feedback("fb", "trajectory", "t-old", reward=1.0, terminal=True))
    harness.checkpoint()
    for step in steps:
        published = harness.steps[step["step_id"]]
        assert published["trajectory_reward"] == 1.0
        assert list(published["prompt_token_ids"]) == step["prompt_token_ids"]
        assert list(published["response_token_ids"]) == step["response_token_ids"]
        assert published["response_logprobs"] == step["response_logprobs"]


def test_a_rollout_posted_whole_is_sealed_so_its_reward_rewrites_a_small_record() -> None:
    harness = Harness()
    # ~1,000 token ids, then ~400 a turn: past SEAL_TOKENS in one checkpoint
    steps = growing_conversation("t-roll", 8, first_prompt=1_024, reply=128, added=256)
    for step in steps:
        harness.whitebox(step)
    harness.checkpoint()
    (chunk,) = decoded_state(harness, b"C/").values()
    assert sorted(chunk) == sorted(step["step_id"] for step in steps)
    (records,) = decoded_state(harness, b"T/").values()
    assert records["t-roll"]["tail"] == {}
    harness.feedback(feedback("fb", "trajectory", "t-roll", reward=1.0, terminal=True))
    harness.checkpoint()
    (rewritten,) = [v for p in harness.partitions for k, v in p.items() if k.startswith(b"T/")]
    assert len(rewritten) < 4_000  # the steps' small parts, not their ~4,000 token ids again
    assert [list(harness.steps[s["step_id"]]["prompt_token_ids"]) for s in steps] == \
        [s["prompt_token_ids"] for s in steps]
