"""Dead-letter records: an event the streams could not use, kept whole with the reason.

The id is the event's position (topic, partition, offset, and its place in an envelope), and the time is
the event's own Kafka timestamp, so the same event always gives the identical dead letter.
"""

from __future__ import annotations

from typing import Any

# Where processing gave up: decode (not Avro / unknown writer schema), validate (decoded but
# unusable), normalize, join or prefix (an unexpected error in that stage's logic).
STAGES = ("decode", "validate", "normalize", "join", "prefix")


def dead_letter(reason: str, stage: str, topic: str, partition: int | None, offset: int | None,
                key: bytes | None, value: bytes | None, timestamp_ms: int,
                index: int | None = None) -> dict[str, Any]:
    """``index``: the record's place in an envelope (then ``value`` is that record alone, re-encoded)."""
    position = f"{topic}:{partition}:{offset}"
    return {
        "dlq_id": position if index is None else f"{position}#{index}",
        "reason": reason,
        "stage": stage,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "original_key": key,
        "original_value": value,
        "failed_at_ms": timestamp_ms,
    }
