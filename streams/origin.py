"""Where an event came from: what a dead letter cites, and what feedback held for later keeps so that its
dead letter can still cite it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Origin:
    """Where an event came from, as a dead letter cites it: a record of an envelope is cited alone, its
    bytes encoded only when a dead letter needs them (``cite``)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    index: int | None = None  # the record's place in an envelope
    cite: Callable[[], bytes] | None = field(default=None, compare=False)

    def original(self) -> bytes | None:
        return self.cite() if self.value is None and self.cite is not None else self.value

    def to_json(self) -> dict[str, Any]:
        value = self.original()
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "key": None if self.key is None else self.key.hex(),
                "value": None if value is None else value.hex(), "timestamp_ms": self.timestamp_ms,
                "index": self.index}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Origin:
        return cls(data["topic"], data["partition"], data["offset"],
                   None if data["key"] is None else bytes.fromhex(data["key"]),
                   None if data["value"] is None else bytes.fromhex(data["value"]), data["timestamp_ms"],
                   data.get("index"))
