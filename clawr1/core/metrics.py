"""Every Prometheus metric the roles export, in one place so names never drift between the code, the
Grafana dashboard (docs/grafana-clawr1.json) and the docs.

Each role registers into the process's default registry and serves it: the API process on its
``GET /metrics`` route (gateway, pool, sink and compat share that process), the other roles on a
port of their own (``serve_metrics``; ``CLAWR1_<ROLE>_METRICS_PORT``, 0 = off; a standalone
``clawr1 sink`` too). Consumer-group lag and pool
row counts are sampled by background threads (``LagSampler``, ``PoolRowsSampler``), so a scrape never
waits on Kafka or the pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer
from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from clawr1.core import registry
from clawr1.core.offsets import group_offsets, group_reader
from clawr1.core.settings import Settings, env_names

log = logging.getLogger("clawr1.core.metrics")

SAMPLE_INTERVAL_ENV = registry.METRICS_SAMPLE_S.name
DEFAULT_SAMPLE_S = registry.METRICS_SAMPLE_S.default
RETRY_SAMPLE_S = 1.0

# -- proxy (served by its emitter process, which every proxy process hands its calls to) -------------
PROXY_CALLS_CAPTURED = Counter("clawr1_proxy_calls_captured", "LLM calls the proxy captured", ["api"])
PROXY_CALLS_FAILED = Counter(
    "clawr1_proxy_calls_failed",
    "captured calls that failed: upstream_error (no answer), http_error (status >= 400), record_error "
    "(no record could be built from it)", ["api", "reason"])
PROXY_HINTS_IGNORED = Counter("clawr1_proxy_hints_ignored", "captured calls whose X-Claw-* hints were "
                              "ignored: API keys are configured and the call carried no proxy credential")
PROXY_RECORDS_DELIVERED = Counter("clawr1_proxy_records_delivered", "records Kafka confirmed")
PROXY_RECORDS_REJECTED = Counter("clawr1_proxy_records_rejected", "records Kafka refused for good")
PROXY_ENGINE_CALLS = Counter("clawr1_proxy_engine_calls", "calls the reverse port sent to each of "
                             "CLAWR1_UPSTREAM's engines (captured, answered or failed)", ["engine"])
PROXY_ENGINE_POLICY_VERSION = Gauge("clawr1_proxy_engine_policy_version", "the policy version each engine "
                                    "was last resumed at, as its latest captured call carried it", ["engine"])
PROXY_SPOOL_DEPTH = Gauge("clawr1_proxy_spool_depth", "records spooled and not yet confirmed by Kafka")

# -- stream worker -----------------------------------------------------------------------------------
STREAM_RECORDS_IN = Counter("clawr1_stream_records_in", "records the stream worker read (each record of an "
                            "envelope counts), by topic", ["topic"])
STREAM_MESSAGES_OUT = Counter("clawr1_stream_messages_out", "Kafka messages the stream worker sent (an "
                              "envelope counts once), by topic", ["topic"])
STREAM_RECORDS_OUT = Counter("clawr1_stream_records_out", "records the stream worker sent, by topic",
                             ["topic"])
STREAM_DEAD_LETTERS = Counter("clawr1_stream_dead_letters", "events the stream worker dead-lettered",
                              ["stage"])
STREAM_CHECKPOINT_SECONDS = Histogram("clawr1_stream_checkpoint_flush_seconds",
                                      "time a checkpoint spent writing back its state and encoding and "
                                      "sending its outputs, before Quix commits the transaction",
                                      buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
STREAM_STATE_WRITES = Counter("clawr1_stream_state_writes", "state keys the stream worker wrote (one "
                              "changelog record each)")

# -- pool sink (in the API process) ------------------------------------------------------------------
SINK_MESSAGES_IN = Counter("clawr1_sink_messages_in", "messages the sink consumed", ["topic"])
SINK_ROWS_OUT = Counter("clawr1_sink_rows_out", "rows the sink inserted and committed", ["table"])
SINK_DEAD_LETTERS = Counter(
    "clawr1_sink_dead_letters",
    "messages the sink stored as dead letters: undecodable, invalid (no row), rejected (by the table)",
    ["reason"])
SINK_BATCH_MESSAGES = Histogram("clawr1_sink_batch_messages", "messages per flushed sink batch",
                                buckets=(1, 5, 10, 50, 100, 500, 1000, 5000, 10000))
SINK_FLUSH_SECONDS = Histogram("clawr1_sink_flush_seconds", "time to insert and commit one sink batch",
                               buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
INGEST_TO_POOL_SECONDS = Histogram(
    "clawr1_ingest_to_pool_seconds", "from a step's created_at to its row being in the pool",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800))

# -- rewarder ----------------------------------------------------------------------------------------
REWARDER_STEPS = Counter("clawr1_rewarder_steps", "step messages the rewarder read")
REWARDER_FEEDBACK = Counter("clawr1_rewarder_feedback", "rewards the rewarder produced")
REWARDER_DEAD_LETTERS = Counter("clawr1_rewarder_dead_letters", "steps the rewarder dead-lettered",
                                ["stage"])

# -- API process and every consumer ------------------------------------------------------------------
OTLP_SPANS = Counter("clawr1_otlp_spans", "OTLP spans the API read, by outcome: model_call (a step), "
                     "not_genai and genai_other (tools, agents, embeddings: ignored)", ["outcome"])
OTLP_LOG_RECORDS = Counter("clawr1_otlp_log_records", "OTLP log records the API read, by outcome: "
                           "genai_event (message content), not_genai and no_span (ignored), expired (never "
                           "claimed by its span)", ["outcome"])
HTTP_REQUESTS = Counter("clawr1_http_requests", "requests answered, by app (api, compat), route and status",
                        ["app", "route", "status"])
POOL_ROWS = Gauge("clawr1_pool_rows", "rows stored per pool table (active parts, sampled)", ["table"])
CONSUMER_LAG = Gauge("clawr1_consumer_lag", "messages not yet committed by a consumer group (sampled)",
                     ["group", "topic"])
PIPELINE_LAG_SECONDS = Gauge("clawr1_pipeline_lag_seconds",
                             "how far the stream worker is behind on the raw topics, in seconds (sampled; "
                             "over CLAWR1_MAX_LAG_S the ingest routes answer 429)")
CONSUMER_STALLED_SECONDS = Gauge("clawr1_consumer_stalled_seconds",
                                 "how long a consumer group has had records "
                                 "waiting and made no progress (0 = progressing; clawr1/core/progress.py)",
                                 ["group"])

ALL_METRICS: tuple[MetricWrapperBase, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricWrapperBase))

# Keyed by a metric's ``_type``, which prometheus_client types Optional (None on the abstract base only).
_SUFFIXES: dict[str | None, tuple[str, ...]] = {
    "counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exposed_names() -> frozenset[str]:
    """Every series name the roles can expose (a counter's ``_total``, a histogram's parts)."""
    return frozenset(f"{metric._name}{suffix}" for metric in ALL_METRICS  # noqa: SLF001
                     for suffix in _SUFFIXES[metric._type])  # noqa: SLF001


class MetricsPortError(RuntimeError):
    """The metrics port cannot be bound; the message names the setting to change."""


def serve_metrics(port: int, host: str, setting: str) -> bool:
    """Serve the default registry on ``host:port`` from a daemon thread; False when ``port`` is 0 (off).
    Raises MetricsPortError at start (port taken), so a role fails before serving, never mid-run."""
    if not port:
        return False
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise MetricsPortError(f"cannot serve metrics on {host}:{port} ({exc.strerror}): set {setting} "
                               "to a free port, or 0 to turn it off") from exc
    return True


def sample_interval(settings: Settings) -> float:
    return settings.role_setting(registry.METRICS_SAMPLE_S)


def serve_role_metrics(settings: Settings, port_field: str, groups: Mapping[str, Iterable[str]]) -> None:
    """A role's own metrics port (the setting ``port_field``; 0 = off) and, when served, its groups'
    lag sampler."""
    setting = env_names()[port_field]
    if serve_metrics(getattr(settings, port_field), settings.metrics_host, setting):
        LagSampler(settings.bootstrap_servers, groups, sample_interval(settings)).start()


class _Sampler:
    """Runs ``sample`` every ``interval_s`` on a daemon thread; a failed sample is logged, never raised,
    and tried again after a second (a broker still loading its groups must not leave the gauge empty
    for a whole interval)."""

    def __init__(self, name: str, sample: Callable[[], None], interval_s: float) -> None:
        self._sample = sample
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            wait = self._interval_s
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - metrics must never stop a role
                log.warning("%s: sample failed: %s", self._thread.name, exc)
                wait = min(wait, RETRY_SAMPLE_S)
            if self._stop.wait(wait):
                return


class LagSampler(_Sampler):
    """Consumer-group lag per topic: high watermark minus the group's committed offset, summed over
    partitions (a partition the group never committed counts from its low watermark). Reads offsets
    with a consumer that never joins the group, so it moves nothing; three or four requests a sample
    (``group_offsets``), not one per partition."""

    def __init__(self, bootstrap: str, groups: Mapping[str, Iterable[str]],
                 interval_s: float = DEFAULT_SAMPLE_S) -> None:
        super().__init__("clawr1-lag-sampler", self._sample_all, interval_s)
        self._bootstrap = bootstrap
        self._groups = {group: list(topics) for group, topics in groups.items()}
        self._consumers: dict[str, Consumer] = {}

    def _sample_all(self) -> None:
        for group, topics in self._groups.items():
            for topic, lag in self.lag(group, topics).items():
                CONSUMER_LAG.labels(group=group, topic=topic).set(lag)

    def lag(self, group: str, topics: list[str]) -> dict[str, int]:
        if group not in self._consumers:
            self._consumers[group] = group_reader(self._bootstrap, group)
        lag: dict[str, int] = {}
        for (topic, _), at in group_offsets(self._consumers[group], topics).items():
            lag[topic] = lag.get(topic, 0) + at.lag
        return lag


class PoolRowsSampler(_Sampler):
    """Rows per pool table from the active parts' counters: cheap (no scan) on chDB and a server."""

    QUERY = ("SELECT table, sum(rows) AS rows FROM system.parts "
             "WHERE database = currentDatabase() AND active GROUP BY table")

    def __init__(self, query: Callable[[str], list[dict[str, Any]]],
                 interval_s: float = DEFAULT_SAMPLE_S) -> None:
        super().__init__("clawr1-pool-rows-sampler", self._sample_rows, interval_s)
        self._query = query

    def _sample_rows(self) -> None:
        for row in self._query(self.QUERY):
            POOL_ROWS.labels(table=row["table"]).set(row["rows"])
