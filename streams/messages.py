"""The JSON messages the stream stages pass each other on the ``clawr1.internal.*`` topics.

Internal topics are read only by this worker, so they carry plain JSON (no schema evolution
contract); every message names its ``kind``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from aiokafka.partitioner import murmur2

from clawr1.streams.normalize import StepFact

# clawr1.internal.trajectories (key: trajectory id)
STEP = "step"  # {"fact": StepFact}
STEP_FEEDBACK = "step_feedback"  # {"step_id", "feedback"}
TRAJECTORY_FEEDBACK = "trajectory_feedback"  # {"feedback"}
SUPERSEDE = "supersede"  # {"step_id"}
UNSUPERSEDE = "unsupersede"  # {"step_id"}: a superseded step a later call continued (revived)
# clawr1.internal.targets (key: target id)
TARGET = "target"  # {"step_id", "target": clawr1.streams.targets.Target fields}
FEEDBACK = "feedback"  # {"feedback", "origin": the raw feedback's position and bytes, for a dead letter}
# ... or, with no key: one batch's TARGET messages for one partition, {"entries": [[target id, message]]}
TARGETS = "targets"


def encode(kind: str, **fields: Any) -> bytes:
    return json.dumps({"kind": kind, **fields}, ensure_ascii=False, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict) or "kind" not in message:
        raise ValueError("internal message without a kind")
    return message


def step_message(fact: StepFact) -> bytes:
    return encode(STEP, fact=fact.to_json())


def partition_of(key: str, partitions: int) -> int:
    """The partition Java's murmur2 partitioner gives ``key``: where feedback for it lands."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def pack_targets(entries: list[tuple[str, dict[str, Any]]], partitions: int) -> dict[int, bytes]:
    """Index entries as one message per partition, each entry in the partition its target id hashes to.

    One message instead of one per entry: a step has two target ids, and each was a message to produce,
    an event to consume and a Faust ack; a packed batch costs that once per partition.
    """
    by_partition: dict[int, list[list[Any]]] = defaultdict(list)
    for target_id, message in entries:
        by_partition[partition_of(target_id, partitions)].append([target_id, message])
    return {p: encode(TARGETS, entries=packed) for p, packed in sorted(by_partition.items())}


def unpack_targets(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    message = decode(data)
    if message["kind"] != TARGETS:
        raise ValueError(f"a keyless targets message must be packed, not {message['kind']!r}")
    return [(str(target_id), entry) for target_id, entry in message["entries"]]
