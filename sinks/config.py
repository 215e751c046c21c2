"""The sink's knobs, read from ``Settings`` (``CLAWR1_SINK_*`` variables land in ``settings.extra``)."""

from __future__ import annotations

from dataclasses import dataclass

from clawr1.settings import Settings
from clawr1.topics import DLQ, PREFIX_NODES, RAW_FEEDBACK, STEPS

DEFAULT_GROUP = "clawr1-pool-sink"


@dataclass(frozen=True)
class SinkConfig:
    steps_topic: str = STEPS.name
    prefix_nodes_topic: str = PREFIX_NODES.name
    dlq_topic: str = DLQ.name
    feedback_topic: str = RAW_FEEDBACK.name
    group_id: str = DEFAULT_GROUP
    batch_rows: int = 5000
    batch_seconds: float = 1.0
    # A crashed sink's partitions wait this long for their next owner (librdkafka's default is 45 s).
    session_timeout_ms: int = 10_000
    # Test hook for crash recovery: exit the process right after a batch insert, before its commit.
    exit_after_insert: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> SinkConfig:
        extra = settings.extra
        defaults = cls()

        def text(name: str, default: str) -> str:
            return extra.get(f"CLAWR1_SINK_{name}", default) or default

        try:
            return cls(
                steps_topic=text("STEPS_TOPIC", defaults.steps_topic),
                prefix_nodes_topic=text("PREFIX_NODES_TOPIC", defaults.prefix_nodes_topic),
                dlq_topic=text("DLQ_TOPIC", defaults.dlq_topic),
                feedback_topic=text("FEEDBACK_TOPIC", defaults.feedback_topic),
                group_id=text("GROUP", defaults.group_id),
                batch_rows=int(text("BATCH_ROWS", str(defaults.batch_rows))),
                batch_seconds=float(text("BATCH_SECONDS", str(defaults.batch_seconds))),
                session_timeout_ms=int(text("SESSION_TIMEOUT_MS", str(defaults.session_timeout_ms))),
                exit_after_insert=text("EXIT_AFTER_INSERT", "0").strip().lower() in {"1", "true", "yes"},
            )
        except ValueError as exc:
            raise ValueError(f"CLAWR1_SINK_*: {exc}") from exc
