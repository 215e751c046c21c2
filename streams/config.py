"""What a stream worker is configured with: topic names, app id, bounds and the readiness rule.

Everything comes from ``Settings``; the streams-only knobs are read from ``CLAWR1_STREAMS_*`` /
``CLAWR1_READY_RULE`` / ``CLAWR1_TOPIC_SUFFIX`` variables (``Settings.role_setting``) so a
docker-compose service and a test differ only in environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from clawr1.core import topics
from clawr1.core.settings import Settings
from streams.readiness import DEFAULT_RULE, ReadinessRule

DEFAULT_APP_ID = "clawr1-streams"


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
    # Internal re-keying topics (see docs/streams.md for the flow).
    targets: str = "clawr1.internal.targets"
    trajectories: str = "clawr1.internal.trajectories"
    scopes: str = "clawr1.internal.scopes"

    def with_suffix(self, suffix: str) -> StreamTopics:
        return replace(self, **{f.name: getattr(self, f.name) + suffix for f in fields(self)})

    def all_names(self) -> list[str]:
        """Topics to create before the worker starts: Faust creates only its changelogs."""
        return [getattr(self, f.name) for f in fields(self)]


@dataclass(frozen=True)
class StreamConfig:
    bootstrap: str
    data_dir: Path
    app_id: str = DEFAULT_APP_ID
    topics: StreamTopics = field(default_factory=StreamTopics)
    partitions: int = 4
    replication: int = 1
    # 0 disables Faust's web server (it would otherwise listen on 6066).
    web_port: int = 0
    tokenizer: str = ""
    schema_registry_url: str = ""
    readiness: ReadinessRule = field(default_factory=ReadinessRule)
    # Linking state per raw.llm key expires by event-time age (a continuation after a longer pause
    # starts a flagged trajectory; a redelivery keeps its first assignment within it); the count is
    # a safety valve for keys busier than that.
    link_horizon_ms: int = 24 * 3_600_000
    max_links_per_key: int = 2048
    # Feedback by a response id several steps share resolves to the one created within this window
    # before the feedback was received, if exactly one is.
    feedback_window_ms: int = 3_600_000
    # Bounds of one prefix-tree merge scope; steps beyond them are not merged (counted as skipped).
    max_scope_steps: int = 128
    max_scope_tokens: int = 1 << 20
    # Prefix trees kept built in memory; others are rebuilt from the table on demand.
    tree_cache_size: int = 256
    # A killed worker's partitions move to the others after this long (broker minimum: 6 s).
    session_timeout_s: float = 30.0
    log_level: str = "warning"

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamConfig:
        defaults = cls(bootstrap="", data_dir=Path())
        knob = settings.role_setting
        return cls(
            bootstrap=settings.bootstrap_servers,
            data_dir=settings.data_dir / "streams",
            app_id=knob("CLAWR1_STREAMS_APP_ID", DEFAULT_APP_ID),
            topics=StreamTopics().with_suffix(knob("CLAWR1_TOPIC_SUFFIX", "")),
            partitions=settings.topic_partitions,
            replication=knob("CLAWR1_STREAMS_REPLICATION", defaults.replication),
            web_port=knob("CLAWR1_STREAMS_WEB_PORT", defaults.web_port),
            tokenizer=settings.tokenizer,
            schema_registry_url=settings.schema_registry_url,
            readiness=ReadinessRule.parse(knob("CLAWR1_READY_RULE", DEFAULT_RULE)),
            link_horizon_ms=knob("CLAWR1_STREAMS_LINK_HORIZON_MS", defaults.link_horizon_ms),
            max_links_per_key=knob("CLAWR1_STREAMS_MAX_LINKS", defaults.max_links_per_key),
            feedback_window_ms=knob("CLAWR1_STREAMS_FEEDBACK_WINDOW_MS", defaults.feedback_window_ms),
            max_scope_steps=knob("CLAWR1_PREFIX_MAX_STEPS", defaults.max_scope_steps),
            max_scope_tokens=knob("CLAWR1_PREFIX_MAX_TOKENS", defaults.max_scope_tokens),
            session_timeout_s=knob("CLAWR1_STREAMS_SESSION_TIMEOUT_S", defaults.session_timeout_s),
            log_level=knob("CLAWR1_STREAMS_LOG_LEVEL", defaults.log_level),
        )
