"""A conversation's key is the digest of its messages up to the first user turn: the same for every
continuation, and the same as the keys a running deployment already partitioned by."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from clawr1.core.conversation import canonical_arguments, conversation_key, prefix_digests

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
