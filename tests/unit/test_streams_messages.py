"""Packed index entries: each lands in the partition its target id hashes to, in order, intact."""

from __future__ import annotations

import pytest

from clawr1.streams import messages


def test_the_partition_is_the_one_faust_sends_keyed_feedback_to() -> None:
    """Faust's producer (aiokafka) routes a keyed message with its default partitioner."""
    from aiokafka.partitioner import DefaultPartitioner

    for key in ("a", "step-1", "chatcmpl-42", "ü-unicode", ""):
        for partitions in (1, 4, 12):
            assert messages.partition_of(key, partitions) == DefaultPartitioner()(
                key.encode(), list(range(partitions)), list(range(partitions)))
    assert {messages.partition_of(f"k{i}", 4) for i in range(100)} == {0, 1, 2, 3}


def test_pack_groups_by_partition_and_unpack_restores_every_entry_in_order() -> None:
    entries = [(f"id-{i}", {"kind": messages.TARGET, "step_id": f"s{i}", "target": {"n": i}})
               for i in range(50)]
    packed = messages.pack_targets(entries, 4)
    assert set(packed) <= {0, 1, 2, 3}
    restored = {p: messages.unpack_targets(data) for p, data in packed.items()}
    for partition, got in restored.items():
        assert all(messages.partition_of(target_id, 4) == partition for target_id, _ in got)
        assert got == [e for e in entries if messages.partition_of(e[0], 4) == partition]
    assert sum(len(got) for got in restored.values()) == len(entries)


def test_an_unpacked_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="must be packed"):
        messages.unpack_targets(messages.encode(messages.TARGET, step_id="s", target={}))
