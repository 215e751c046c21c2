"""What a stream worker is configured with: topic names, app id, bounds and the readiness rule.

Everything comes from ``Settings``: each field names the variable it is read from (``setting_field``),
the streams-only ones being the ``CLAWR1_STREAMS_*`` / ``CLAWR1_PREFIX_*`` / ``CLAWR1_READY_RULE`` /
``CLAWR1_TOPIC_SUFFIX`` variables declared in ``clawr1/core/registry.py``, so a docker-compose service
and a test differ only in environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from clawr1.core import registry as r
from clawr1.core import topics
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.streams.readiness import ReadinessRule


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
    work: str = topics.WORK

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
    data_dir: Path = setting_field(r.DATA_DIR, lambda data_dir: data_dir / "streams")
    app_id: str = setting_field(r.STREAMS_APP_ID)
    topics: StreamTopics = setting_field(r.TOPIC_SUFFIX, StreamTopics().with_suffix)
    partitions: int = setting_field(r.TOPIC_PARTITIONS)
    replication: int = setting_field(r.STREAMS_REPLICATION)
    tokenizer: str = setting_field(r.TOKENIZER)
    schema_registry_url: str = setting_field(r.SCHEMA_REGISTRY_URL)
    readiness: ReadinessRule = setting_field(r.READY_RULE, ReadinessRule.parse)
    # Linking state per raw.llm key expires by event-time age (a continuation after a longer pause
    # starts a flagged trajectory; a redelivery keeps its first assignment within it); the count is
    # a safety valve for keys busier than that.
    link_horizon_ms: int = setting_field(r.STREAMS_LINK_HORIZON_MS)
    max_links_per_key: int = setting_field(r.STREAMS_MAX_LINKS)
    # Feedback by a response id several steps share resolves to the one created within this window
    # before the feedback was received, if exactly one is.
    feedback_window_ms: int = setting_field(r.STREAMS_FEEDBACK_WINDOW_MS)
    # First calls without hints with the same prompt within this window form one inferred prompt group.
    group_window_ms: int = setting_field(r.STREAMS_GROUP_WINDOW_MS)
    # Bounds of one prefix-tree merge scope; steps beyond them are not merged (counted as skipped).
    max_scope_steps: int = setting_field(r.PREFIX_MAX_STEPS)
    max_scope_tokens: int = setting_field(r.PREFIX_MAX_TOKENS)
    # Prefix trees kept built in memory; others are rebuilt from the table on demand.
    tree_cache_size: int = 256
    # A killed worker's partitions move to the others after this long (broker minimum: 6 s).
    session_timeout_s: float = setting_field(r.STREAMS_SESSION_TIMEOUT_S)
    # The worker's slot (CLAWR1_STREAMS_INSTANCE_ID): static membership and a stable transactional id.
    instance_id: str = setting_field(r.STREAMS_INSTANCE_ID)
    log_level: str = setting_field(r.STREAMS_LOG_LEVEL)
    # Checkpoints: one Kafka transaction each (outputs, state changelogs, input offsets).
    commit_interval_ms: int = setting_field(r.STREAMS_COMMIT_INTERVAL_MS)
    # While every poll brings input, a checkpoint stays open up to this long (clawr1.streams.commit_pacing).
    busy_commit_interval_ms: int = setting_field(r.STREAMS_BUSY_COMMIT_INTERVAL_MS)
    # A checkpoint of a trickle's few records waits this long since the previous commit (commit_pacing).
    thin_commit_interval_ms: int = setting_field(r.STREAMS_THIN_COMMIT_INTERVAL_MS)
    thin_commit_records: int = setting_field(r.STREAMS_THIN_COMMIT_RECORDS)
    commit_every: int = setting_field(r.STREAMS_COMMIT_EVERY)
    transaction_timeout_ms: int = setting_field(r.STREAMS_TRANSACTION_TIMEOUT_MS)
    linger_ms: int = setting_field(r.STREAMS_LINGER_MS)
    # State untouched this long is let go (clawr1.streams.expiry); RocksDB's memory per worker.
    state_ttl_s: int = setting_field(r.STREAMS_STATE_TTL_S)
    rocksdb_cache_mb: int = setting_field(r.STREAMS_ROCKSDB_CACHE_MB)
    rocksdb_write_buffer_mb: int = setting_field(r.STREAMS_ROCKSDB_WRITE_BUFFER_MB)

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamConfig:
        return config_from(cls, settings, bootstrap=settings.bootstrap_servers)
