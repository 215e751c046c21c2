"""The sink's knobs: ``CLAWR1_SINK_*`` variables, read with ``Settings.role_setting``."""

from __future__ import annotations

from dataclasses import dataclass

from clawr1.core.settings import Settings, T
from clawr1.core.topics import DLQ, PREFIX_NODES, RAW_FEEDBACK, STEPS

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
        defaults = cls()

        def knob(name: str, default: T) -> T:
            return settings.role_setting(f"CLAWR1_SINK_{name}", default)

        return cls(
            steps_topic=knob("STEPS_TOPIC", defaults.steps_topic),
            prefix_nodes_topic=knob("PREFIX_NODES_TOPIC", defaults.prefix_nodes_topic),
            dlq_topic=knob("DLQ_TOPIC", defaults.dlq_topic),
            feedback_topic=knob("FEEDBACK_TOPIC", defaults.feedback_topic),
            group_id=knob("GROUP", defaults.group_id),
            batch_rows=knob("BATCH_ROWS", defaults.batch_rows),
            batch_seconds=knob("BATCH_SECONDS", defaults.batch_seconds),
            session_timeout_ms=knob("SESSION_TIMEOUT_MS", defaults.session_timeout_ms),
            exit_after_insert=knob("EXIT_AFTER_INSERT", defaults.exit_after_insert),
        )
