"""What one checkpoint publishes, gathered while its events are handled and sent as envelopes at its end.

Outputs leave in the checkpoint's Kafka transaction, just before it commits, as one message per
partition of each topic: the step versions (``step_batch``), prefix-tree nodes (``prefix_node_batch``)
and the worker's own cross-partition messages (``clawr1.streams.messages``). A step published several
times within one checkpoint (its version grows as its siblings, children or rewards arrive) leaves
once, in its newest version; so does a prefix-tree node. Dead letters leave one by one (rare, and each
cites its own source position).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from clawr1.core.routing import partition_of
from clawr1.schemas.codec import AvroCodec, pack_record
from clawr1.streams import messages
from clawr1.streams.join import scope_of


@dataclass(frozen=True)
class Envelope:
    topic: str
    partition: int | None  # None: by key
    key: bytes | None
    value: bytes


@dataclass
class Outbox:
    partitions: int
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)  # step id -> newest record
    nodes: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (scope, node) -> row
    internal: dict[int, list[tuple[str, dict[str, Any]]]] = field(default_factory=lambda: defaultdict(list))
    dead_letters: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)

    def step(self, record: dict[str, Any]) -> None:
        held = self.steps.get(record["step_id"])
        if held is None or held["version"] <= record["version"]:
            self.steps[record["step_id"]] = record

    def prefix_node(self, row: dict[str, Any]) -> None:
        slot = (row["scope_id"], row["node_id"])
        held = self.nodes.get(slot)
        if held is None or held["version"] <= row["version"]:
            self.nodes[slot] = row

    def send(self, partition: int, key: str, message: dict[str, Any]) -> None:
        self.internal[partition].append((key, message))

    def dead_letter(self, key: bytes, record: dict[str, Any]) -> None:
        self.dead_letters.append((key, record))

    def __len__(self) -> int:
        internal = sum(map(len, self.internal.values()))
        return len(self.steps) + len(self.nodes) + internal + len(self.dead_letters)

    def envelopes(self, codec: AvroCodec, steps_topic: str, nodes_topic: str, internal_topic: str,
                  dlq_topic: str) -> list[Envelope]:
        """Everything held, encoded: one envelope per partition and topic (records keyed as on their
        topic decide the partition), dead letters one by one. A step goes where its merge scope (its
        prompt group, else its trajectory) does: the steps that repeat each other's prompts share an
        envelope, whose compression then keeps those tokens about once."""
        out: list[Envelope] = []
        by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for record in self.steps.values():
            scope_id, _ = scope_of(record)
            by_partition[partition_of(scope_id, self.partitions)].append(pack_record("step", record))
        out += [Envelope(steps_topic, p, None, codec.encode_batch("step", records))
                for p, records in sorted(by_partition.items())]
        by_partition = defaultdict(list)
        for (scope_id, _), row in self.nodes.items():
            by_partition[partition_of(scope_id, self.partitions)].append(pack_record("prefix_node", row))
        out += [Envelope(nodes_topic, p, None, codec.encode_batch("prefix_node", rows))
                for p, rows in sorted(by_partition.items())]
        out += [Envelope(internal_topic, p, None, messages.pack(batch))
                for p, batch in sorted(self.internal.items())]
        out += [Envelope(dlq_topic, None, key, codec.encode("dead_letter", record))
                for key, record in self.dead_letters]
        return out

    def clear(self) -> None:
        self.steps.clear()
        self.nodes.clear()
        self.internal.clear()
        self.dead_letters.clear()
