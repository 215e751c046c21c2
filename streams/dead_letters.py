"""Dead-letter records: an event the streams could not use, kept whole with the reason.

The id is the event's position (topic, partition, offset), and the time is the event's own Kafka
timestamp, so a replay after a crash writes the identical dead letter again (idempotent).
"""

from __future__ import annotations

from typing import Any

# Where processing gave up: decode (not Avro / unknown writer schema), validate (decoded but
# unusable), normalize, join or prefix (an unexpected error in that stage's logic).
STAGES = ("decode", "validate", "normalize", "join", "prefix")


def dead_letter(reason: str, stage: str, topic: str, partition: int | None, offset: int | None,
                key: bytes | None, value: bytes | None, timestamp_ms: int) -> dict[str, Any]:
    return {
        "dlq_id": f"{topic}:{partition}:{offset}",
        "reason": reason,
        "stage": stage,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "original_key": key,
        "original_value": value,
        "failed_at_ms": timestamp_ms,
    }
