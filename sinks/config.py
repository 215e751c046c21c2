"""The sink's knobs: ``CLAWR1_SINK_*`` variables, declared in ``clawr1/core/registry.py`` and read with
``Settings.role_setting``."""

from __future__ import annotations

from dataclasses import dataclass, field

from clawr1.core import registry as r
from clawr1.core.settings import Settings
from clawr1.streams.readiness import ReadinessRule

DEFAULT_GROUP = r.SINK_GROUP.default


@dataclass(frozen=True)
class SinkConfig:
    steps_topic: str = r.SINK_STEPS_TOPIC.default
    prefix_nodes_topic: str = r.SINK_PREFIX_NODES_TOPIC.default
    dlq_topic: str = r.SINK_DLQ_TOPIC.default
    feedback_topic: str = r.SINK_FEEDBACK_TOPIC.default
    group_id: str = DEFAULT_GROUP
    batch_rows: int = r.SINK_BATCH_ROWS.default
    batch_seconds: float = r.SINK_BATCH_SECONDS.default
    # A crashed sink's partitions wait this long for their next owner (librdkafka's default is 45 s).
    session_timeout_ms: int = r.SINK_SESSION_TIMEOUT_MS.default
    # Test hook for crash recovery: exit the process right after a batch insert, before its commit.
    exit_after_insert: bool = r.SINK_EXIT_AFTER_INSERT.default
    # The worker's rule, for the versions the sink writes itself (``clawr1.sinks.late_feedback``).
    readiness: ReadinessRule = field(default_factory=ReadinessRule)

    @classmethod
    def from_settings(cls, settings: Settings) -> SinkConfig:
        knob = settings.role_setting
        return cls(
            steps_topic=knob(r.SINK_STEPS_TOPIC),
            prefix_nodes_topic=knob(r.SINK_PREFIX_NODES_TOPIC),
            dlq_topic=knob(r.SINK_DLQ_TOPIC),
            feedback_topic=knob(r.SINK_FEEDBACK_TOPIC),
            group_id=knob(r.SINK_GROUP),
            batch_rows=knob(r.SINK_BATCH_ROWS),
            batch_seconds=knob(r.SINK_BATCH_SECONDS),
            session_timeout_ms=knob(r.SINK_SESSION_TIMEOUT_MS),
            exit_after_insert=knob(r.SINK_EXIT_AFTER_INSERT),
            readiness=ReadinessRule.parse(knob(r.READY_RULE)),
        )
