"""Records into envelopes the way producers send them: one message per partition, sized to fit Kafka.

A producer (the gateway, the proxy's emitter) holds records with their Kafka keys. ``by_partition``
groups them where each key lands (``clawr1.core.routing.partition_of``), keeping their order within a
group, which keeps every key's order: that is Kafka's promise per key and the worker relies on it.
``fit`` cuts a group into envelopes of at most ``max_bytes``; a producer whose envelope Kafka still
finds too large (a topic with a smaller limit) sends it again ``halved``, so only a record too large
on its own is ever refused for its size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from clawr1.core.routing import partition_of

T = TypeVar("T")
# Under a default broker's message limit (1 MiB and a few bytes), before compression, with room for
# the record batch's own framing.
ENVELOPE_MAX_BYTES = 1_000_000


def by_partition(keyed: Iterable[tuple[str, T]], partitions: int) -> dict[int, list[T]]:
    """Items grouped by the partition their key hashes to, each group in the order given."""
    groups: dict[int, list[T]] = {}
    for key, item in keyed:
        groups.setdefault(partition_of(key, partitions), []).append(item)
    return groups


def fit(items: Sequence[T], encode: Callable[[Sequence[T]], bytes],
        max_bytes: int = ENVELOPE_MAX_BYTES) -> list[tuple[Sequence[T], bytes]]:
    """``items`` as consecutive envelopes ``(items, encode(items))`` of at most ``max_bytes`` each; one
    item larger than that alone stays an envelope of its own (Kafka decides whether it is too large).
    An envelope that does not fit is cut into as many even pieces as its size asks for, then each is
    checked again, so a group is encoded about twice at worst."""
    value = encode(items)
    if len(value) <= max_bytes or len(items) <= 1:
        return [(items, value)]
    pieces = min(len(items), -(-len(value) // max_bytes))
    size = -(-len(items) // pieces)
    return [envelope for start in range(0, len(items), size)
            for envelope in fit(items[start:start + size], encode, max_bytes)]


def halved(items: Sequence[T], size: int,
           encode: Callable[[Sequence[T]], bytes]) -> list[tuple[Sequence[T], bytes]] | None:
    """An envelope of ``size`` bytes Kafka refused as too large, as two or more smaller ones; None when
    it holds one item. Kafka's limit is only known to be below ``size``: each refusal halves again."""
    if len(items) <= 1:
        return None
    middle = (len(items) + 1) // 2
    return [*fit(items[:middle], encode, size - 1), *fit(items[middle:], encode, size - 1)]
