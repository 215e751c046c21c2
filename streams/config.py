"""What a stream worker is configured with: topic names, app id, bounds and the readiness rule.

Everything comes from ``Settings``; the streams-only knobs are the ``CLAWR1_STREAMS_*`` /
``CLAWR1_PREFIX_*`` / ``CLAWR1_READY_RULE`` / ``CLAWR1_TOPIC_SUFFIX`` variables declared in
``clawr1/core/registry.py`` (read with ``Settings.role_setting``), so a docker-compose service and a test
differ only in environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from clawr1.core import registry as r
from clawr1.core import topics
from clawr1.core.settings import Settings
from clawr1.streams.readiness import ReadinessRule

DEFAULT_APP_ID = r.STREAMS_APP_ID.default


@dataclass(frozen=True)
class StreamTopics:
    """Every topic the worker reads or writes; ``with_suffix`` gives tests their own set."""

    raw_llm: str = topics.RAW_LLM.name
    raw_steps: str = topics.RAW_STEPS.name
    raw_events: str = topics.RAW_EVENTS.name
    raw_feedback: str = topics.RAW_FEEDBACK.name
    steps: str = topics.STEPS.name
    prefix_nodes: str = topics.PREFIX_NODES.name
    dlq: str = topics.DLQ.name
    # What the worker sends its own partitions (clawr1.streams.messages).
    work: str = "clawr1.internal.work"

    def with_suffix(self, suffix: str) -> StreamTopics:
        return replace(self, **{f.name: getattr(self, f.name) + suffix for f in fields(self)})

    def all_names(self) -> list[str]:
        """Topics to create before the worker starts (Quix creates only its state changelogs)."""
        return [getattr(self, f.name) for f in fields(self)]

    def inputs(self) -> list[str]:
        return [self.raw_llm, self.raw_steps, self.raw_events, self.raw_feedback, self.work]


@dataclass(frozen=True)
class StreamConfig:
    bootstrap: str
    data_dir: Path
    app_id: str = DEFAULT_APP_ID
    topics: StreamTopics = field(default_factory=StreamTopics)
    partitions: int = r.TOPIC_PARTITIONS.default
    replication: int = r.STREAMS_REPLICATION.default
    tokenizer: str = ""
    schema_registry_url: str = ""
    readiness: ReadinessRule = field(default_factory=ReadinessRule)
    # Linking state per raw.llm key expires by event-time age (a continuation after a longer pause
    # starts a flagged trajectory; a redelivery keeps its first assignment within it); the count is
    # a safety valve for keys busier than that.
    link_horizon_ms: int = r.STREAMS_LINK_HORIZON_MS.default
    max_links_per_key: int = r.STREAMS_MAX_LINKS.default
    # Feedback by a response id several steps share resolves to the one created within this window
    # before the feedback was received, if exactly one is.
    feedback_window_ms: int = r.STREAMS_FEEDBACK_WINDOW_MS.default
    # First calls without hints with the same prompt within this window form one inferred prompt group.
    group_window_ms: int = r.STREAMS_GROUP_WINDOW_MS.default
    # Bounds of one prefix-tree merge scope; steps beyond them are not merged (counted as skipped).
    max_scope_steps: int = r.PREFIX_MAX_STEPS.default
    max_scope_tokens: int = r.PREFIX_MAX_TOKENS.default
    # Prefix trees kept built in memory; others are rebuilt from the table on demand.
    tree_cache_size: int = 256
    # A killed worker's partitions move to the others after this long (broker minimum: 6 s).
    session_timeout_s: float = r.STREAMS_SESSION_TIMEOUT_S.default
    # The worker's slot (CLAWR1_STREAMS_INSTANCE_ID): static membership and a stable transactional id.
    instance_id: str = r.STREAMS_INSTANCE_ID.default
    log_level: str = r.STREAMS_LOG_LEVEL.default
    # Checkpoints: one Kafka transaction each (outputs, state changelogs, input offsets).
    commit_interval_ms: int = r.STREAMS_COMMIT_INTERVAL_MS.default
    busy_commit_interval_ms: int = r.STREAMS_BUSY_COMMIT_INTERVAL_MS.default  # clawr1.streams.commit_pacing
    commit_every: int = r.STREAMS_COMMIT_EVERY.default
    transaction_timeout_ms: int = r.STREAMS_TRANSACTION_TIMEOUT_MS.default
    linger_ms: int = r.STREAMS_LINGER_MS.default
    # State untouched this long is let go (clawr1.streams.expiry); RocksDB's memory per worker.
    state_ttl_s: int = r.STREAMS_STATE_TTL_S.default
    rocksdb_cache_mb: int = r.STREAMS_ROCKSDB_CACHE_MB.default
    rocksdb_write_buffer_mb: int = r.STREAMS_ROCKSDB_WRITE_BUFFER_MB.default

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamConfig:
        knob = settings.role_setting
        return cls(
            bootstrap=settings.bootstrap_servers,
            data_dir=settings.data_dir / "streams",
            app_id=knob(r.STREAMS_APP_ID),
            topics=StreamTopics().with_suffix(knob(r.TOPIC_SUFFIX)),
            partitions=settings.topic_partitions,
            replication=knob(r.STREAMS_REPLICATION),
            tokenizer=settings.tokenizer,
            schema_registry_url=settings.schema_registry_url,
            readiness=ReadinessRule.parse(knob(r.READY_RULE)),
            link_horizon_ms=knob(r.STREAMS_LINK_HORIZON_MS),
            max_links_per_key=knob(r.STREAMS_MAX_LINKS),
            feedback_window_ms=knob(r.STREAMS_FEEDBACK_WINDOW_MS),
            group_window_ms=knob(r.STREAMS_GROUP_WINDOW_MS),
            max_scope_steps=knob(r.PREFIX_MAX_STEPS),
            max_scope_tokens=knob(r.PREFIX_MAX_TOKENS),
            session_timeout_s=knob(r.STREAMS_SESSION_TIMEOUT_S),
            instance_id=knob(r.STREAMS_INSTANCE_ID),
            log_level=knob(r.STREAMS_LOG_LEVEL),
            commit_interval_ms=knob(r.STREAMS_COMMIT_INTERVAL_MS),
            busy_commit_interval_ms=knob(r.STREAMS_BUSY_COMMIT_INTERVAL_MS),
            commit_every=knob(r.STREAMS_COMMIT_EVERY),
            transaction_timeout_ms=knob(r.STREAMS_TRANSACTION_TIMEOUT_MS),
            linger_ms=knob(r.STREAMS_LINGER_MS),
            state_ttl_s=knob(r.STREAMS_STATE_TTL_S),
            rocksdb_cache_mb=knob(r.STREAMS_ROCKSDB_CACHE_MB),
            rocksdb_write_buffer_mb=knob(r.STREAMS_ROCKSDB_WRITE_BUFFER_MB),
        )
