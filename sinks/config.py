"""The sink's knobs: ``CLAWR1_SINK_*`` variables, declared in ``clawr1/core/registry.py``; each field
names the one it is read from (``setting_field``)."""

from __future__ import annotations

from dataclasses import dataclass

from clawr1.core import registry as r
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.core.thin_batch import ThinWait
from clawr1.streams.readiness import ReadinessRule


@dataclass(frozen=True)
class SinkConfig:
    steps_topic: str = setting_field(r.SINK_STEPS_TOPIC)
    prefix_nodes_topic: str = setting_field(r.SINK_PREFIX_NODES_TOPIC)
    dlq_topic: str = setting_field(r.SINK_DLQ_TOPIC)
    feedback_topic: str = setting_field(r.SINK_FEEDBACK_TOPIC)
    group_id: str = setting_field(r.SINK_GROUP)
    batch_rows: int = setting_field(r.SINK_BATCH_ROWS)
    batch_seconds: float = setting_field(r.SINK_BATCH_SECONDS)
    # A trickle's batch waits longer, so an insert's fixed cost is shared (``clawr1.core.thin_batch``).
    thin_batch_seconds: float = setting_field(r.SINK_THIN_BATCH_SECONDS)
    thin_batch_rows: int = setting_field(r.SINK_THIN_BATCH_ROWS)
    # A crashed sink's partitions wait this long for their next owner (librdkafka's default is 45 s).
    session_timeout_ms: int = setting_field(r.SINK_SESSION_TIMEOUT_MS)
    # Test hook for crash recovery: exit the process right after a batch insert, before its commit.
    exit_after_insert: bool = setting_field(r.SINK_EXIT_AFTER_INSERT)
    # The worker's rule, for the versions the sink writes itself (``clawr1.sinks.late_feedback``).
    readiness: ReadinessRule = setting_field(r.READY_RULE, ReadinessRule.parse)

    @property
    def thin(self) -> ThinWait:
        return ThinWait(self.thin_batch_seconds, self.thin_batch_rows)

    @classmethod
    def from_settings(cls, settings: Settings) -> SinkConfig:
        return config_from(cls, settings)
