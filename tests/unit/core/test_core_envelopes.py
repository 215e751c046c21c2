"""Grouping records by partition and cutting envelopes to Kafka's size: nothing lost, reordered or
left too large when it could be smaller."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.core.envelopes import by_partition, fit, halved
from clawr1.core.routing import partition_of


def encode(items: Sequence[bytes]) -> bytes:
    """A stand-in codec: an envelope's size is its header plus its items."""
    return b"H" + b"".join(items)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.sampled_from(["a", "b", "c", "t-1", "t-2", "traj-9"]), max_size=40),
       partitions=st.integers(1, 8))
def test_groups_hold_their_keys_partition_in_the_order_given(keys: list[str], partitions: int) -> None:
    groups = by_partition([(key, (key, n)) for n, key in enumerate(keys)], partitions)
    grouped = sorted(item for group in groups.values() for item in group)
    assert grouped == sorted((key, n) for n, key in enumerate(keys))
    for partition, group in groups.items():
        assert all(partition_of(key, partitions) == partition for key, _ in group)
        assert [n for _, n in group] == sorted(n for _, n in group)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=60), max_bytes=st.integers(1, 400))
def test_envelopes_fit_unless_one_item_alone_is_too_large(sizes: list[int], max_bytes: int) -> None:
    items = [bytes([n % 256]) * size for n, size in enumerate(sizes)]
    envelopes = fit(items, encode, max_bytes)
    assert [item for chunk, _ in envelopes for item in chunk] == items
    for chunk, value in envelopes:
        assert value == encode(chunk)
        assert len(value) <= max_bytes or len(chunk) == 1


def test_a_group_that_fits_is_one_envelope_encoded_once() -> None:
    calls: list[int] = []

    def counting(items: Sequence[bytes]) -> bytes:
        calls.append(len(items))
        return encode(items)

    assert fit([b"ab", b"cd"], counting, 100) == [([b"ab", b"cd"], b"Habcd")]
    assert calls == [2]


def test_an_envelope_kafka_refused_is_halved_until_one_record_remains() -> None:
    items = [b"x" * 10] * 5
    value = encode(items)
    pieces = halved(items, len(value), encode)
    assert pieces is not None and len(pieces) == 2
    assert [item for chunk, _ in pieces for item in chunk] == items
    assert all(len(v) < len(value) for _, v in pieces)
    assert halved(items[:1], len(encode(items[:1])), encode) is None
