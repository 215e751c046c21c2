"""A conversation's key is the digest of its messages up to the first user turn: the same for every
continuation, and the same as the keys a running deployment already partitioned by."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.core.conversation import (
    canonical_arguments,
    canonical_message,
    conversation_key,
    message_digest,
    prefix_digests,
)

TASK = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TURNS = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]

messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
    "content": st.text(max_size=8),
}), max_size=8)


def test_keys_are_those_of_earlier_releases() -> None:
    """Written by the release before keys stopped hashing past the first user turn: a changed key would
    put a conversation's next calls on another partition, away from its link state."""
    assert conversation_key([*TASK, *TURNS]) == conversation_key(TASK) == (
        "2d58ba2808e7a47aed84eb9caee2403bfa26816ea8b85a8da2c68d96af58c4c3")
    assert conversation_key(TASK[:1]) == "6b663fd8ff1026b495a94ebe6efd2825bfd1c29837d6137420a80c3cec341ac2"
    assert conversation_key([]) == "de23c812a73c9030be5678d224416a2abc8aa86b45815d0934d6fc7384f706e9"


@given(messages, messages)
def test_key_is_the_prefix_digest_at_the_first_user_turn(head: list[dict[str, Any]],
                                                          tail: list[dict[str, Any]]) -> None:
    conversation = head + tail
    digests = prefix_digests(conversation)
    users = [i for i, m in enumerate(conversation) if m["role"] == "user"]
    expected = digests[users[0]] if users else (digests[-1] if digests else conversation_key([]))
    assert conversation_key(conversation) == expected
    if users and users[0] < len(head):
        assert conversation_key(head) == expected  # every continuation keeps the key


def test_arguments_of_any_depth_are_compared_without_recursion() -> None:
    """50,000-deep arguments raised RecursionError wherever a reply was linked: they stay text."""
    deep = "[" * 50_000 + "]" * 50_000
    assert canonical_arguments(deep) == deep
    call = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep}}]}
    assert len(prefix_digests([{"role": "user", "content": "hi"}, call])) == 2
    assert canonical_arguments('{"q": [1]}') == {"q": [1]}


# Any text, lone surrogates included; ints past 64 bits; floats, those spelled apart more often.
_text = st.text(st.characters(codec=None, categories=None), max_size=12)
_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e16, 1.5e-7, 2.0**63]) | st.floats()
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _floats | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12)


def _stdlib_digest(message: dict[str, Any]) -> str:
    """How every earlier release spelled a message's digest."""
    blob = json.dumps(canonical_message(message), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@settings(max_examples=300)
@given(st.fixed_dictionaries({"role": _text, "content": _text | st.lists(_json, max_size=3),
                              "tool_calls": st.lists(st.fixed_dictionaries({
                                  "id": _text, "function": st.fixed_dictionaries({
                                      "name": _text, "arguments": _json.map(json.dumps) | _text})}),
                                  max_size=2)}))
def test_a_digest_is_the_one_earlier_releases_wrote(message: dict[str, Any]) -> None:
    """Stored link state and Kafka keys hold digests: orjson writes them only where its bytes are the
    standard library's, whatever the text, numbers and nesting (a refusal stays the same refusal)."""
    try:
        expected = _stdlib_digest(message)
    except (UnicodeEncodeError, ValueError) as refused:
        with pytest.raises(type(refused)):
            message_digest(message)
        return
    assert message_digest(message) == expected
