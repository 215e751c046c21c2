"""The worker's state during one checkpoint: each value decoded once, written back once.

State is partitioned like the topics (one store per partition, changelogged in the same Kafka
transaction as the outputs and the input offsets). Within a checkpoint a key is typically touched by
many events (a trajectory by each of its steps in an envelope), so values are kept decoded here and
written back once, when the checkpoint flushes: one changelog record per key per checkpoint.

Namespaces (the first bytes of every key) say what a value is: ``clawr1.streams.namespaces``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson

from clawr1.streams.namespaces import Namespace

_DELETED = object()


class KeyValues(Protocol):
    """A partition's store as Quix's ``State`` offers it (bytes keys and values)."""

    def get(self, key: bytes, default: Any = None) -> Any: ...

    def set(self, key: bytes, value: Any) -> None: ...

    def delete(self, key: bytes) -> None: ...


class Store:
    """Reads through to the partition's store, holds changes until ``flush``."""

    def __init__(self, open_partition: Callable[[int], KeyValues]) -> None:
        self._open = open_partition
        self._values: dict[tuple[int, bytes], Any] = {}
        self._dirty: set[tuple[int, bytes]] = set()

    @staticmethod
    def key(namespace: Namespace, name: str) -> bytes:
        return f"{namespace}/{name}".encode()

    def get(self, partition: int, namespace: Namespace, name: str) -> Any:
        slot = (partition, self.key(namespace, name))
        if slot in self._values:
            value = self._values[slot]
            return None if value is _DELETED else value
        raw = self._open(partition).get(slot[1])
        value = None if raw is None else orjson.loads(raw)
        self._values[slot] = value if value is not None else _DELETED
        return value

    def put(self, partition: int, namespace: Namespace, name: str, value: Any) -> None:
        """``value`` must be JSON data; the caller may keep mutating it until the flush."""
        slot = (partition, self.key(namespace, name))
        self._values[slot] = value
        self._dirty.add(slot)

    def delete(self, partition: int, namespace: Namespace, name: str) -> None:
        slot = (partition, self.key(namespace, name))
        self._values[slot] = _DELETED
        self._dirty.add(slot)

    def flush(self) -> int:
        """Write every changed value to its partition's store; how many keys that was."""
        written = 0
        for partition, key in self._dirty:
            value = self._values[(partition, key)]
            state = self._open(partition)
            if value is _DELETED:
                state.delete(key)
            else:
                state.set(key, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))
            written += 1
        self.clear()
        return written

    def clear(self) -> None:
        """Forget everything held (after a flush, or when the checkpoint's work is thrown away)."""
        self._values.clear()
        self._dirty.clear()
