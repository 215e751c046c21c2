"""A recorded mix of raw events, interleaved the way production interleaves them, and its outcome.

The mix has rewards before their steps, a duplicated call, white-box steps out of order, a
re-submitted step, feedback for a target that never comes, undecodable bytes, an unknown schema
version, a record of the wrong schema, a tombstone, invalid records, and records in envelopes (whose
token ids the worker reads as arrays), one of them corrupt. ``EXPECTED_STEPS`` and
``EXPECTED_DEAD_LETTERS`` are the exact outcome, worked out by hand from the rules in
docs/streams.md (versions count the distinct facts joined into a step).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from clawr1.core.conversation import conversation_key
from clawr1.schemas.codec import pack_record
from tests.integration.streams.events import (
    CODEC,
    assistant,
    feedback,
    llm_call,
    llm_key,
    service_event,
    user,
    whitebox_step,
)


@dataclass(frozen=True)
class Raw:
    """One message to produce: ``topic`` names a StreamTopics field (raw_llm, raw_steps, ...)."""

    topic: str
    key: bytes | None
    value: bytes | None


SYSTEM = {"role": "system", "content": "you are terse"}
T1 = [SYSTEM, user("q")]
T1_2 = [*T1, assistant("a"), user("more")]
T1_3 = [*T1_2, assistant("b"), user("q")]


def _llm(record: dict) -> Raw:
    return Raw("raw_llm", llm_key(record).encode(), CODEC.encode("raw_llm_call", record))


def _feedback(record: dict) -> Raw:
    return Raw("raw_feedback", record["target_id"].encode(), CODEC.encode("feedback", record))


def _whitebox(record: dict) -> Raw:
    return Raw("raw_steps", record["trajectory_id"].encode(), CODEC.encode("whitebox_step", record))


def _envelope(topic: str, schema: str, key: str, record: dict) -> Raw:
    """The record alone in an envelope, as the gateway and the proxy send them: its ids read as arrays."""
    return Raw(topic, key.encode(), CODEC.encode_batch(schema, [pack_record(schema, record)]))


def _event(record: dict) -> Raw:
    return Raw("raw_events", record["trajectory_id"].encode(), CODEC.encode("service_event", record))


C1 = llm_call("c1", T1, ["a"], at=1_000, prompt_ids=[1, 2, 3], reply_ids=[[4, 5]], response_id="resp-c1")
C2 = llm_call("c2", T1_2, ["b"], at=2_000, prompt_ids=[1, 2, 3, 4, 5, 6], reply_ids=[[7]],
              response_id="resp-c2")
C3 = llm_call("c3", T1_3, ["answer"], at=3_000, prompt_ids=[1, 2, 3, 4, 5, 6, 7, 8], reply_ids=[[9, 10]],
              response_id="resp-c3", terminal=True)
GROUP = llm_call("g", [user("hi")], ["hello there", "hi"], at=4_000, trajectory_id="tr-2", policy_version=7)
FAILED = llm_call("fail-1", [user("hi")], [], at=4_500, trajectory_id="tr-f", status=500)
W0 = whitebox_step("w0", "wb-1", 0, prompt_ids=[10, 11], response_ids=[12], reward=0.1, at=5_000)
W1_PROVISIONAL = whitebox_step("w1", "wb-1", 1, prompt_ids=[10, 11, 12, 13], response_ids=[14], reward=0.3,
                               final=False, at=5_100)
W1_FINAL = whitebox_step("w1", "wb-1", 1, prompt_ids=[10, 11, 12, 13], response_ids=[14], reward=0.4,
                         at=6_000)
W2 = whitebox_step("w2", "wb-1", 2, prompt_ids=[10, 11, 12, 13, 14, 15], response_ids=[16], terminal=True,
                   at=5_200)
S0 = service_event("ev-s0", "svc-1", {"prompt_messages": [user("q")], "response_text": "a", "reward": 1.0,
                                      "prompt_token_ids": [20, 21], "response_token_ids": [22]},
                   step_index=0, step_id="svc-1-0", at=8_000)
TOOL = service_event("ev-tool", "svc-1", {"tool": "search", "result": "ok"}, kind="tool_result", at=8_100)
S1 = service_event("ev-s1", "svc-1", {"prompt_messages": [user("hi there")], "response_text": "hello"},
                   step_index=1, at=8_200)

UNKNOWN_SCHEMA = b"\xc3\x01" + struct.pack("<Q", 0x1234_5678_9ABC_DEF0) + b"\x02\x04body"
WRONG_SCHEMA = CODEC.encode("feedback", feedback("wrong", "step", "x"))
BAD_TARGET = CODEC.encode("feedback", {**feedback("fb-bad", "step", "c1"), "target_kind": "session"})
# An envelope whose packed ids cannot be int32s (7 bytes): the whole message is the dead letter.
CORRUPT_ENVELOPE = CODEC.encode_batch("whitebox_step", [{**pack_record("whitebox_step", W0),
                                                        "prompt_token_ids": b"\x01" * 7}])
BAD_MESSAGES = CODEC.encode("raw_llm_call", {**llm_call("bad-1", [user("x")], ["y"], at=9_000),
                                             "messages_json": "{broken"})

MIX: list[Raw] = [
    _feedback(feedback("fb-c1", "response", "resp-c1", reward=1.0, at=900)),  # before its step
    _llm(C1),
    _envelope("raw_steps", "whitebox_step", "wb-1", W2),  # white-box steps out of order
    Raw("raw_llm", b"junk", b"not avro at all"),
    _llm(C2),
    _feedback(feedback("fb-c2b", "step", "c2", reward=0.6, at=2_200)),  # final before provisional
    _whitebox(W0),
    _llm(C2),  # a duplicate delivery of the same call
    _feedback(feedback("fb-c2a", "step", "c2", reward=0.2, final=False, at=2_100)),
    _event(S0),
    _llm(GROUP),
    Raw("raw_steps", b"wb-1", UNKNOWN_SCHEMA),
    _whitebox(W1_PROVISIONAL),
    _feedback(feedback("fb-g0", "step", "g:0", reward=1.0, source="human", source_name="alice", label="good",
                       comment="nice", at=4_100)),
    _event(TOOL),
    Raw("raw_events", b"svc-1", WRONG_SCHEMA),
    _llm(FAILED),
    _feedback(feedback("fb-ghost", "step", "never-seen", reward=1.0)),
    Raw("raw_feedback", b"c1", BAD_TARGET),
    _envelope("raw_llm", "raw_llm_call", llm_key(C3), C3),
    Raw("raw_feedback", b"c1", None),
    _event(S1),
    _whitebox(W1_FINAL),  # re-submitted with its final reward
    _feedback(feedback("fb-g1", "step", "g:1", reward=0.0, components={"format": 0.0}, source="rule",
                       source_name="fmt", at=4_200)),
    Raw("raw_llm", b"bad-1", BAD_MESSAGES),
    Raw("raw_steps", b"wb-1", CORRUPT_ENVELOPE),
    _feedback(feedback("fb-traj", "trajectory", "traj-c1", reward=5.0, source="env", source_name="",
                       at=3_500)),
]
assert llm_key(C1) == llm_key(C2) == llm_key(C3) == conversation_key(T1)

FIELDS = ("version", "trajectory_id", "step_index", "parent_step_id", "prompt_group_id", "prompt_group_size",
          "token_provenance", "reward", "reward_status", "reward_source", "trajectory_reward",
          "trajectory_reward_status", "terminal", "status", "ready", "quality_labels")
EXPECTED_STEPS: dict[str, tuple] = {
    # step: version, trajectory, index, parent, group, size, tokens, reward, status, source,
    #       trajectory reward, its status, terminal, status, ready, labels
    # c1 is a first call without hints: its rollout's prompt group is inferred, named after it
    "c1": (3, "traj-c1", 0, None, "c1", None, "engine", 1.0, "final", "reward_model:rm-a", 5.0, "final",
           False, "ok", True, []),
    "c2": (4, "traj-c1", 1, "c1", "c1", None, "engine", 0.6, "final", "reward_model:rm-a", 5.0, "final",
           False, "ok", True, []),
    # ready without a reward of its own: its trajectory's final outcome (the default readiness rule)
    "c3": (2, "traj-c1", 2, "c2", "c1", None, "engine", None, "pending", None, 5.0, "final", True, "ok",
           True, []),
    "g:0": (2, "tr-2:0", 0, None, "g", 2, "retokenized", 1.0, "final", "human:alice", None, "pending", False,
            "ok", True, ["good"]),
    "g:1": (2, "tr-2:1", 0, None, "g", 2, "retokenized", 0.0, "final", "rule:fmt", None, "pending", False,
            "ok", True, []),
    "fail-1": (1, "tr-f", 0, None, None, None, "none", None, "pending", None, None, "pending", False,
               "failed", False, []),
    "w0": (2, "wb-1", 0, None, None, None, "engine", 0.1, "final", "whitebox:team-wb", None, "pending", False,
           "ok", True, []),
    # two submissions + their two inline rewards + one step seen at index 0 (its parent)
    "w1": (5, "wb-1", 1, "w0", None, None, "engine", 0.4, "final", "whitebox:team-wb", None, "pending", False,
           "ok", True, []),
    "w2": (2, "wb-1", 2, "w1", None, None, "engine", None, "pending", None, None, "pending", True, "ok",
           False, []),
    "svc-1-0": (2, "svc-1", 0, None, None, None, "engine", 1.0, "final", "service:svc-a", None, "pending",
                False, "ok", True, []),
    "ev-s1": (2, "svc-1", 1, "svc-1-0", None, None, "retokenized", None, "pending", None, None, "pending",
              False, "ok", False, []),
}
# How each step was linked: the first of a trajectory is a root, each choice of ``g`` its own.
LINK_STATUS = {"c1": "root", "c2": "linked", "c3": "linked", "g:0": "root", "g:1": "root", "fail-1": "root",
               "w0": "root", "w1": "linked", "w2": "linked", "svc-1-0": "root", "ev-s1": "linked"}
ENGINE_TOKENS = {
    "c1": ([1, 2, 3], [4, 5]), "c2": ([1, 2, 3, 4, 5, 6], [7]), "c3": ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10]),
    "w0": ([10, 11], [12]), "w1": ([10, 11, 12, 13], [14]), "w2": ([10, 11, 12, 13, 14, 15], [16]),
    "svc-1-0": ([20, 21], [22]),
}
# What the retokenized steps' ids must spell, in the documented ChatML template.
RETOKENIZED_TEXT = {
    "g:0": ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "hello there<|im_end|>"),
    "g:1": ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "hi<|im_end|>"),
    "ev-s1": ("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "hello<|im_end|>"),
}
# (source topic field, stage, reason fragment, original value)
EXPECTED_DEAD_LETTERS = [
    ("raw_llm", "decode", "not an Avro single-object or Confluent-framed message", b"not avro at all"),
    ("raw_steps", "decode", "unknown writer schema fingerprint f0debc9a78563412", UNKNOWN_SCHEMA),
    ("raw_events", "decode", "expected a 'service_event' message, got 'feedback'", WRONG_SCHEMA),
    ("raw_feedback", "validate", "target_kind must be one of step, response, trajectory", BAD_TARGET),
    ("raw_feedback", "validate", "empty message (no value)", None),
    ("raw_llm", "validate", "messages_json is not JSON", BAD_MESSAGES),
    ("raw_steps", "decode", "a packed array", CORRUPT_ENVELOPE),
]
# Final version of each merge scope: its merged steps plus those whose parent it knows.
EXPECTED_SCOPE_VERSIONS = {"c1": 3 + 2, "g": 2, "wb-1": 3 + 2, "svc-1": 2 + 1}
# The conversation c1 -> c2 -> c3 merges into one chain of three nodes.
EXPECTED_TRAJECTORY_TREE = {
    "nodes": [(0, [1, 2, 3, 4, 5], ["c1"]), (5, [6, 7], ["c2"]), (7, [8, 9, 10], ["c3"])],
    "total_tokens": 5 + 7 + 10,
    "tree_tokens": 10,
    "forks": 0,
}
# alice's key holds kinds reward and curate: her reward and label count on another source's step.
FEEDBACK_OF_G0 = [{"feedback_id": "fb-g0", "target_kind": "step", "target_id": "g:0", "reward": 1.0,
                   "components": {}, "final": True, "source": "human", "source_name": "alice",
                   "label": "good", "comment": "nice", "correction": None, "received_at_ms": 4_100,
                   "privileged": True}]
