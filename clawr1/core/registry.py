"""Every ``CLAWR1_*`` environment variable, declared once: name, type, default, help, check, roles.

The model is mitmproxy's ``add_option``: an :class:`Option` knows how to parse and check its value
and how to describe itself, so one table drives ``load_settings`` (the shared ``Settings`` fields),
each role's typed reads (``settings.role_setting(SINK_BATCH_ROWS)``), the refusal of unknown names
(a misspelled variable stops the process at start, naming the closest known one), ``clawr1 config``
and the generated table in ``docs/settings.md``.

Roles: ``shared`` options are fields of ``Settings`` (every process reads them); the others name the
processes that read them (``clawr1`` commands: ``api``, ``worker``, ``sink``, ``rewarder``, ``proxy``,
``up``, ``kafka``; ``demo`` for the demo workload, ``sdk`` for client tools, ``test`` / ``bench`` for
the test-suite and benchmarks). A new variable is added here, or every process refuses it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from clawr1.core import topics

ENV_PREFIX = "CLAWR1_"
SHARED = "shared"
MASK = "****"

V = TypeVar("V", str, int, float, bool, Path)


class SettingsError(ValueError):
    """A ``CLAWR1_*`` variable that is unknown, malformed or out of range; the message names it."""


class UnknownSettingError(SettingsError):
    """``CLAWR1_*`` variables no option declares (usually a typo)."""


def _as_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {value!r}")


def not_negative(value: float) -> str | None:
    """A check: the value must be >= 0."""
    return None if value >= 0 else f"must be 0 or more, got {value}"


def positive(value: float) -> str | None:
    """A check: the value must be > 0."""
    return None if value > 0 else f"must be positive, got {value}"


@dataclass(frozen=True, eq=False)
class Option(Generic[V]):
    """One ``CLAWR1_*`` variable. ``check`` returns a problem (``"must be positive, got 0"``) or None."""

    name: str
    type: type[V]
    default: V
    help: str
    roles: tuple[str, ...]
    secret: bool = False
    check: Callable[[Any], str | None] | None = None
    # How the docs show a default that depends on other settings (e.g. "the pool under the data dir").
    default_text: str = ""

    @property
    def shared(self) -> bool:
        return SHARED in self.roles

    @property
    def field(self) -> str:
        """The ``Settings`` field of a shared option (the name without the prefix, in lower case)."""
        return self.name.removeprefix(ENV_PREFIX).lower()

    def parse(self, raw: str) -> V:
        """The typed, checked value of ``raw``; a malformed one raises SettingsError naming the variable."""
        try:
            if self.type is bool:
                value: Any = _as_bool(raw)
            elif self.type is int:
                value = int(raw)
            elif self.type is float:
                value = float(raw)
            elif self.type is Path:
                value = Path(raw)
            else:
                value = raw
        except ValueError as exc:
            raise SettingsError(f"{self.name}: {exc}") from exc
        self.validate(value)
        return value

    def validate(self, value: Any) -> None:
        problem = self.check(value) if self.check is not None else None
        if problem:
            raise SettingsError(f"{self.name} {problem}")

    def read(self, env: Mapping[str, str]) -> V:
        """A role variable from ``env``: unset or empty means the default."""
        raw = env.get(self.name, "")
        return self.default if raw == "" else self.parse(raw)

    def to_env(self, value: Any) -> str:
        """The string that parses back to ``value``."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, Path):
            return str(value.resolve())
        return str(value)

    def show(self, value: Any) -> str:
        """``value`` for people: secrets masked (a URL keeps all but its password; ``@file`` its path)."""
        text = "true" if value is True else "false" if value is False else str(value)
        if not self.secret or not text or text.startswith("@"):
            return text
        return _mask_url(text) or MASK

    def default_for_docs(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default == "" and self.type is str:
            return "empty"
        return f"`{self.show(self.default)}`"


def _mask_url(text: str) -> str | None:
    """``scheme://user:****@host/...`` for a URL with a password; None for anything else."""
    if "://" not in text:
        return None
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return None
    if not password:
        return text if parts.username is None else None
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


REGISTRY: dict[str, Option[Any]] = {}


def option(name: str, type_: type[V], default: V, help: str, roles: Iterable[str] = (SHARED,), *,
           secret: bool = False, check: Callable[[Any], str | None] | None = None,
           default_text: str = "") -> Option[V]:
    """Declare ``CLAWR1_<name>``; each name once."""
    full = ENV_PREFIX + name
    if full in REGISTRY:
        raise ValueError(f"{full} is declared twice")
    declared = Option(full, type_, default, help, tuple(roles), secret, check, default_text)
    if not isinstance(default, type_):
        raise TypeError(f"{full}: default {default!r} is not a {type_.__name__}")
    REGISTRY[full] = declared
    return declared


# -- shared: the fields of Settings ------------------------------------------------------------------

DATA_DIR = option("DATA_DIR", Path, Path(".clawr1"),
                  "state: Kafka logs, the chDB pool, proxy CA and spool, worker state",
                  default_text="`./.clawr1`")
KAFKA_BOOTSTRAP = option("KAFKA_BOOTSTRAP", str, "",
                         "external Kafka; empty = `clawr1 up` starts its own broker on `CLAWR1_KAFKA_PORT`")
KAFKA_PORT = option("KAFKA_PORT", int, 9092, "port of the local broker `clawr1 up` / `clawr1 kafka` starts")
KAFKA_HEAP = option("KAFKA_HEAP", str, "512m", "JVM heap of the local broker")
KAFKA_NODES = option("KAFKA_NODES", int, 1,
                     "brokers `clawr1 up` / `clawr1 kafka` start, on `CLAWR1_KAFKA_PORT` and the ports after "
                     "it; from 3 on a controller quorum of all of them, topics kept on 3 brokers, 2 in sync "
                     "([scale](scale.md))", check=positive)
CLICKHOUSE_DSN = option("CLICKHOUSE_DSN", str, "",
                        "the pool; `http(s)://user:pass@host:8123/db` for a ClickHouse server; "
                        "empty = the embedded chDB pool", secret=True,
                        default_text="`chdb:///<data dir>/pool`")
CLICKHOUSE_CLUSTER = option("CLICKHOUSE_CLUSTER", str, "",
                            "a ClickHouse server's cluster (`remote_servers`) to create the pool on: "
                            "replicated tables on every node, Distributed tables over them "
                            "([scale](scale.md)); empty = one server")
SQL_DSN = option("SQL_DSN", str, "",
                 "analyst SQL as a server's read-only user (`pool/server/`); empty = the pool DSN",
                 secret=True)
SCHEMA_REGISTRY_URL = option("SCHEMA_REGISTRY_URL", str, "",
                             "Confluent wire format + Schema Registry (`https://user:pass@host:8081` for "
                             "basic auth); empty = Avro single-object encoding", secret=True)
API_HOST = option("API_HOST", str, "127.0.0.1", "host of the HTTP API (gateway, SQL, health)")
API_PORT = option("API_PORT", int, 8000, "port of the HTTP API (gateway, SQL, health)")
COMPAT_PORT = option("COMPAT_PORT", int, 8100,
                     "the seed Claw-R1 gateway's protocol ([compat](compat.md)), served by the API "
                     "process; `0` = off")
PROXY_HOST = option("PROXY_HOST", str, "127.0.0.1", "host of the explicit HTTP(S) capture proxy")
PROXY_PORT = option("PROXY_PORT", int, 8080, "port of the explicit HTTP(S) capture proxy")
REVERSE_PORT = option("REVERSE_PORT", int, 0,
                      "OpenAI-compatible base URL in front of `CLAWR1_UPSTREAM`; `0` = off")
UPSTREAM = option("UPSTREAM", str, "",
                  "the serving engine(s) behind the reverse port and compat `/generate` "
                  "(`http(s)://host[:port]`, comma-separated)")
PROXY_AUTH = option("PROXY_AUTH", str, "", "`user:pass`; required on a non-loopback proxy host", secret=True)
CAPTURE_TOKEN_IDS = option("CAPTURE_TOKEN_IDS", bool, False,
                           "ask vLLM/SGLang-style upstreams for exact token ids and logprobs")
TOKEN_ID_HOSTS = option("TOKEN_ID_HOSTS", str, "",
                        "upstreams (`host[:port]`, comma-separated, `*` = all) that get token-id fields; "
                        "empty = the reverse-mode upstream", default_text="the reverse-mode upstream")
API_KEYS = option("API_KEYS", str, "",
                  "`name:key[:kind|kind]` pairs or `@file` ([kinds](security.md)); required on a "
                  "non-loopback API host", secret=True)
MAX_REQUEST_BYTES = option("MAX_REQUEST_BYTES", int, 4 * 1024 * 1024,
                           "gateway: larger bodies get 413 before parsing")
MAX_BATCH_STEPS = option("MAX_BATCH_STEPS", int, 1000,
                         "gateway: items per request (steps, feedback or events); more get 413")
TOKENIZER = option("TOKENIZER", str, "", "re-tokenize calls without engine ids (tokenizer.json path); "
                   "the dashboard decodes the ids it made")
TOPIC_PARTITIONS = option("TOPIC_PARTITIONS", int, 4, "partitions of the topics the stack creates")
METRICS_HOST = option("METRICS_HOST", str, "127.0.0.1", "where the roles' Prometheus metrics ports listen")
PROXY_METRICS_PORT = option("PROXY_METRICS_PORT", int, 0,
                            "Prometheus metrics of the proxy (its emitter process); `0` = off")
WORKER_METRICS_PORT = option("WORKER_METRICS_PORT", int, 0,
                             "Prometheus metrics of a stream worker; `0` = off")
SINK_METRICS_PORT = option("SINK_METRICS_PORT", int, 0,
                           "Prometheus metrics of a standalone `clawr1 sink`; `0` = off (the API process "
                           "always serves `GET /metrics`)")
REWARDER_METRICS_PORT = option("REWARDER_METRICS_PORT", int, 0,
                               "Prometheus metrics of the rewarder; `0` = off")

# -- the Schema Registry client of every role that writes or reads Kafka -----------------------------

_KAFKA_ROLES = ("api", "worker", "sink", "rewarder", "proxy")
SCHEMA_REGISTRY_CA_FILE = option("SCHEMA_REGISTRY_CA_FILE", str, "",
                                 "PEM bundle trusted for the Schema Registry's TLS; empty = "
                                 "`SSL_CERT_FILE`, else certifi's bundle", _KAFKA_ROLES)
SCHEMA_REGISTRY_CERT_FILE = option("SCHEMA_REGISTRY_CERT_FILE", str, "",
                                   "client certificate (PEM) for a Schema Registry that asks for mutual TLS",
                                   _KAFKA_ROLES)
SCHEMA_REGISTRY_KEY_FILE = option("SCHEMA_REGISTRY_KEY_FILE", str, "",
                                  "private key (PEM) of `CLAWR1_SCHEMA_REGISTRY_CERT_FILE`", _KAFKA_ROLES)

# -- how long Kafka keeps each role's topics (every role that creates topics applies them) ------------


def _hours(value: float) -> str | None:
    return None if value > 0 or value == -1 else f"must be positive hours or -1 (kept forever), got {value}"


_TOPIC_ROLES = ("up", *_KAFKA_ROLES)
KAFKA_INPUT_RETENTION_H = option("KAFKA_INPUT_RETENTION_H", float, 6.0,
                                 "hours Kafka keeps the worker's inputs (the raw topics, its internal work "
                                 "topic): it reads them within seconds, the rest is a margin for a worker "
                                 "that is down or behind; a backlog older than this is lost "
                                 "([scale](scale.md)); `-1` = forever", _TOPIC_ROLES, check=_hours)
KAFKA_OUTPUT_RETENTION_H = option("KAFKA_OUTPUT_RETENTION_H", float, 12.0,
                                  "hours Kafka keeps `clawr1.steps` and `clawr1.prefix_nodes`: what a sink "
                                  "or rewarder that is down or behind still reads, or a pool rebuilt by "
                                  "replay; `-1` = forever", _TOPIC_ROLES, check=_hours)
KAFKA_DLQ_RETENTION_H = option("KAFKA_DLQ_RETENTION_H", float, 168.0,
                               "hours Kafka keeps `clawr1.dlq` (the pool keeps its copy in `dead_letters`); "
                               "`-1` = forever", _TOPIC_ROLES, check=_hours)

# -- api: gateway, idempotency store, compat protocol, analyst SQL -----------------------------------

GATEWAY_MAX_IN_FLIGHT = option("GATEWAY_MAX_IN_FLIGHT", int, 20_000,
                               "records waiting for Kafka's ack, over all requests (at least the batch "
                               "limit)",
                               ("api",), check=positive)
GATEWAY_DELIVERY_TIMEOUT_S = option("GATEWAY_DELIVERY_TIMEOUT_S", float, 15.0,
                                    "a record not acked by then fails its request (503)", ("api",),
                                    check=positive)
IDEMPOTENCY_TTL_S = option("IDEMPOTENCY_TTL_S", float, 3600.0, "how long an answer is replayed", ("api",),
                           check=positive)
IDEMPOTENCY_MAX_KEYS = option("IDEMPOTENCY_MAX_KEYS", int, 100_000, "keys kept by the replay store",
                              ("api",), check=positive)
IDEMPOTENCY_MAX_BYTES = option("IDEMPOTENCY_MAX_BYTES", int, 64 * 1024 * 1024,
                               "bytes kept by the replay store", ("api",), check=positive)
MAX_LAG_S = option("MAX_LAG_S", float, 30.0,
                   "backpressure: the bound on the pipeline's lag (s; the worker's and the sink's): from 40% "
                   "of it the ingest routes answer 429 with Retry-After and the proxy holds its captures in "
                   "its spool, until it is under 20% (0: never)", ("api", "proxy"), check=not_negative)
OTLP_JOIN_WAIT_S = option("OTLP_JOIN_WAIT_S", float, 3.0,
                          "how long a GenAI span whose messages travel as OTLP log events waits for them "
                          "before it lands without content (0: never waits)", ("api",), check=not_negative)
OTLP_MAX_RECORDS = option("OTLP_MAX_RECORDS", int, 10_000,
                          "spans or log records in one OTLP request; more get 413", ("api",), check=positive)
OTLP_JOIN_TTL_S = option("OTLP_JOIN_TTL_S", float, 120.0,
                         "how long OTLP log events wait for their span before they are dropped", ("api",),
                         check=positive)
OTLP_JOIN_MAX_BYTES = option("OTLP_JOIN_MAX_BYTES", int, 32 * 1024 * 1024,
                             "bytes of OTLP log events waiting for their spans, per API key (its oldest "
                             "are dropped beyond)", ("api",), check=positive)
COMPAT_MAX_TRAJECTORIES = option("COMPAT_MAX_TRAJECTORIES", int, 100_000,
                                 "compat: trajectory registrations kept", ("api",))
COMPAT_MAX_METADATA_BYTES = option("COMPAT_MAX_METADATA_BYTES", int, 64 * 1024,
                                   "compat: largest `register_trajectory` metadata (compact JSON); larger "
                                   "gets 413", ("api",), check=positive)
COMPAT_PUBLIC_URL = option("COMPAT_PUBLIC_URL", str, "",
                           "compat: the URL agents reach the compat port at, the start of every "
                           "`init_trajectory` base URL (never the request's Host)", ("api",),
                           default_text="`http://<CLAWR1_API_HOST>:<CLAWR1_COMPAT_PORT>` (loopback for a "
                                        "wildcard host)")
RELAY_SECRET = option("RELAY_SECRET", str, "",
                      "seals the calling key's name on the compat port's relayed calls, so the proxy records "
                      "it as the step's source; set the same on the API and the proxy when they do not share "
                      "a data dir", ("api", "proxy"), secret=True,
                      default_text="a random one kept in `<data dir>/relay-secret`")
COMPAT_TIMEOUT_S = option("COMPAT_TIMEOUT_S", float, 600.0,
                          "compat: how long a relayed call or `/generate` may take", ("api",))
COMPAT_RESPONSE_LENGTH = option("COMPAT_RESPONSE_LENGTH", int, 0,
                                "compat: `max_tokens` for `/generate` when the sampling params give none; "
                                "`0` = the engine's default", ("api",))
SQL_MAX_EXECUTION_TIME = option("SQL_MAX_EXECUTION_TIME", float, 30.0,
                                "analyst SQL: `max_execution_time` (s)", ("api",))
SQL_MAX_MEMORY_USAGE = option("SQL_MAX_MEMORY_USAGE", int, 2 * 1024**3, "analyst SQL: `max_memory_usage`",
                              ("api",))
SQL_MAX_RESULT_ROWS = option("SQL_MAX_RESULT_ROWS", int, 100_000, "analyst SQL: `max_result_rows`", ("api",))
SQL_MAX_RESULT_BYTES = option("SQL_MAX_RESULT_BYTES", int, 256 * 1024**2, "analyst SQL: `max_result_bytes`",
                              ("api",))
SQL_MAX_ROWS_TO_READ = option("SQL_MAX_ROWS_TO_READ", int, 2_000_000_000, "analyst SQL: `max_rows_to_read`",
                              ("api",))
SQL_MAX_CONCURRENT = option("SQL_MAX_CONCURRENT", int, 4,
                            "SQL of analysts (`read` keys, and every caller without keys): sessions running "
                            "at once (more answer 429)", ("api",), check=positive)
SQL_TRAINER_CONCURRENT = option("SQL_TRAINER_CONCURRENT", int, 4,
                                "SQL of trainers (`consume` keys): sessions running at once, a pool apart "
                                "from the analysts' (more answer 429)", ("api",), check=positive)
SQL_KEY_SHARE = option("SQL_KEY_SHARE", float, 0.5,
                       "the share of its pool's sessions one key may hold at once (at least one)", ("api",),
                       check=lambda v: None if 0 < v <= 1 else f"must be in (0, 1], got {v}")
SQL_ANALYST_BLOCK_ROWS = option("SQL_ANALYST_BLOCK_ROWS", int, 8192,
                                "analyst SQL: `max_block_size`; the time limit is checked between blocks, so "
                                "smaller blocks stop an overrunning query sooner; `0` = the engine's default",
                                ("api",))
SQL_OS_THREAD_PRIORITY = option("SQL_OS_THREAD_PRIORITY", int, 19,
                                "analyst SQL: the engine threads' nice value (`os_thread_priority`), so an "
                                "analyst's query only gets the CPU that ingest leaves; `0` = ingest's own",
                                ("api",),
                                check=lambda v: None if 0 <= v <= 19 else f"must be in [0, 19], got {v}")
SQL_ANALYST_SNAPSHOT_S = option("SQL_ANALYST_SNAPSHOT_S", float, 5.0,
                                "embedded pool: keyed analysts' (`read` keys') queries run in processes of "
                                "their own over a snapshot of the pool at most this old (seconds), killed at "
                                "their limit; `0` = in the API process on the live pool", ("api",),
                                check=lambda v: None if v >= 0 else f"must be >= 0, got {v}")
DASHBOARD_LIVE_PER_KEY = option("DASHBOARD_LIVE_PER_KEY", int, 8,
                                "dashboard: `/v1/dashboard/live` streams one key may hold open (more answer "
                                "429)", ("api",), check=positive)
DASHBOARD_LIVE_STREAMS = option("DASHBOARD_LIVE_STREAMS", int, 128,
                                "dashboard: `/v1/dashboard/live` streams open at once, all keys together "
                                "(more answer 429); all share one pulse computation a second", ("api",),
                                check=positive)
METRICS_SAMPLE_S = option("METRICS_SAMPLE_S", float, 10.0,
                          "how often consumer-group lag and pool row counts are sampled (s)",
                          ("api", "worker", "sink", "rewarder"))

# -- sink (standalone `clawr1 sink`, or in the API process) ------------------------------------------

_SINK = ("sink", "api")
SINK_STEPS_TOPIC = option("SINK_STEPS_TOPIC", str, topics.STEPS.name, "topic of finished steps", _SINK)
SINK_PREFIX_NODES_TOPIC = option("SINK_PREFIX_NODES_TOPIC", str, topics.PREFIX_NODES.name,
                                 "topic of prefix-tree nodes", _SINK)
SINK_DLQ_TOPIC = option("SINK_DLQ_TOPIC", str, topics.DLQ.name, "dead-letter topic", _SINK)
SINK_FEEDBACK_TOPIC = option("SINK_FEEDBACK_TOPIC", str, topics.RAW_FEEDBACK.name, "feedback topic", _SINK)
SINK_GROUP = option("SINK_GROUP", str, "clawr1-pool-sink", "Kafka consumer group", _SINK)
SINK_BATCH_ROWS = option("SINK_BATCH_ROWS", int, 5000, "rows per insert at most", _SINK)
SINK_BATCH_SECONDS = option("SINK_BATCH_SECONDS", float, 0.25, "seconds a batch waits for more rows at most",
                            _SINK)
SINK_THIN_BATCH_SECONDS = option("SINK_THIN_BATCH_SECONDS", float, 0.75,
                                "a batch of fewer than CLAWR1_SINK_THIN_BATCH_ROWS rows is inserted no "
                                "sooner than this long after the previous insert (a trickle shares an "
                                "insert's fixed cost; a lone row after a pause goes at once); `0` = off",
                                _SINK, check=not_negative)
SINK_THIN_BATCH_ROWS = option("SINK_THIN_BATCH_ROWS", int, 32,
                              "rows that make a batch go on CLAWR1_SINK_BATCH_SECONDS", _SINK, check=positive)
SINK_SESSION_TIMEOUT_MS = option("SINK_SESSION_TIMEOUT_MS", int, 10_000,
                                 "a crashed sink's partitions wait this long for their next owner", _SINK)
SINK_EXIT_AFTER_INSERT = option("SINK_EXIT_AFTER_INSERT", bool, False,
                                "test hook: exit right after a batch insert, before its commit", _SINK)

# -- pool retention (pool/retention.py: set by the process that migrates the pool, at its start) -------

POOL_STEP_TTL_DAYS = option("POOL_STEP_TTL_DAYS", int, 0,
                            "days the pool keeps step data (steps, feedback, prefix trees, id lookup, "
                            "consumer commits) after it landed; `0` = forever ([pool](pool.md))", _SINK,
                            check=not_negative)
POOL_DELIVERY_LOG_TTL_DAYS = option("POOL_DELIVERY_LOG_TTL_DAYS", int, 30,
                                    "days the delivery log keeps an entry (ready polls deliver steps "
                                    "from it); `0` = forever", _SINK, check=not_negative)
POOL_DEAD_LETTER_TTL_DAYS = option("POOL_DEAD_LETTER_TTL_DAYS", int, 30,
                                   "days the pool keeps a dead letter; `0` = forever", _SINK,
                                   check=not_negative)

# -- stream worker -----------------------------------------------------------------------------------

STALL_S = option("STALL_S", float, 30.0,
                 "a consumer group (worker, sink) with records waiting and no progress for this long is "
                 "unhealthy: /healthz answers 503 naming it, and `clawr1 up` restarts a stuck worker",
                 ("api", "up"), check=positive)
WORKERS = option("WORKERS", int, 1, "stream workers `clawr1 up` runs, one process each (a worker uses one "
                 "core at most; more than the topics' partitions would idle)", ("up",), check=positive)
STREAMS_APP_ID = option("STREAMS_APP_ID", str, "clawr1-streams",
                        "app id / consumer group: workers with one id share the work (the API and the "
                        "proxy watch its lag)", ("worker", "api", "proxy"))
TOPIC_SUFFIX = option("TOPIC_SUFFIX", str, "",
                      "appended to every topic name the worker and rewarder use (tests, side-by-side stacks)",
                      ("worker", "rewarder"))
STREAMS_REPLICATION = option("STREAMS_REPLICATION", int, -1,
                             "replication of the topics the worker creates (`-1`: the cluster's default; its "
                             "state changelog follows its input topics')", ("worker",))
READY_RULE = option("READY_RULE", str, "tokens,final_outcome",
                    "what a step needs to be ready for training (comma-separated requirement words)",
                    ("worker", "sink"))
STREAMS_LINK_HORIZON_MS = option("STREAMS_LINK_HORIZON_MS", int, 24 * 3_600_000,
                                 "event-time age after which link state expires", ("worker",))
STREAMS_MAX_LINKS = option("STREAMS_MAX_LINKS", int, 2048,
                           "steps / assignments kept per raw.llm key within the horizon", ("worker",))
STREAMS_FEEDBACK_WINDOW_MS = option("STREAMS_FEEDBACK_WINDOW_MS", int, 3_600_000,
                                    "a response id naming several steps resolves to the one created this "
                                    "long before the feedback", ("worker",))
STREAMS_GROUP_WINDOW_MS = option("STREAMS_GROUP_WINDOW_MS", int, 60_000,
                                 "first calls without hints that carry the same prompt, model and tools "
                                 "within this long of a group's first call form one inferred prompt group; "
                                 "0 infers none", ("worker",),
                                 check=lambda v: None if v >= 0 else f"must be >= 0, got {v}")
PREFIX_MAX_STEPS = option("PREFIX_MAX_STEPS", int, 128, "steps merged per prefix-tree scope", ("worker",))
PREFIX_MAX_TOKENS = option("PREFIX_MAX_TOKENS", int, 1 << 20, "tokens merged per prefix-tree scope",
                           ("worker",))
STREAMS_SESSION_TIMEOUT_S = option("STREAMS_SESSION_TIMEOUT_S", float, 10.0,
                                   "how long a dead worker holds its partitions (broker minimum 6)",
                                   ("worker",))
STREAMS_INSTANCE_ID = option("STREAMS_INSTANCE_ID", str, "",
                             "the worker's slot: static group membership and its transactional id, so a "
                             "worker restarted with the same id takes its partitions back at once and "
                             "aborts its predecessor's open transaction (empty = dynamic; every worker of a "
                             "group needs its own id)", ("worker",))
STREAMS_COMMIT_INTERVAL_MS = option("STREAMS_COMMIT_INTERVAL_MS", int, 100,
                                    "how often the worker commits its Kafka transaction (outputs, state and "
                                    "input offsets at once): outputs become visible to readers then, so this "
                                    "bounds the worker's share of freshness; longer means fewer, larger "
                                    "envelopes", ("worker",), check=positive)
STREAMS_BUSY_COMMIT_INTERVAL_MS = option(
    "STREAMS_BUSY_COMMIT_INTERVAL_MS", int, 250,
    "how long the worker keeps a checkpoint open while every poll brings input (a backlog, a load): fewer, "
    "larger transactions; the first poll that brings nothing commits at CLAWR1_STREAMS_COMMIT_INTERVAL_MS",
    ("worker",), check=positive)
STREAMS_THIN_COMMIT_INTERVAL_MS = option(
    "STREAMS_THIN_COMMIT_INTERVAL_MS", int, 500,
    "a checkpoint holding fewer than CLAWR1_STREAMS_THIN_COMMIT_RECORDS input records commits no sooner than "
    "this long after the previous commit (a trickle shares a transaction's fixed cost and markers; the first "
    "records after a pause commit at once); `0` = off", ("worker",),
    check=not_negative)
STREAMS_THIN_COMMIT_RECORDS = option("STREAMS_THIN_COMMIT_RECORDS", int, 16,
                                     "input records that make a checkpoint commit on "
                                     "CLAWR1_STREAMS_COMMIT_INTERVAL_MS", ("worker",), check=positive)
STREAMS_COMMIT_EVERY = option("STREAMS_COMMIT_EVERY", int, 5000,
                              "commit early after this many input messages (bounds a checkpoint's memory)",
                              ("worker",), check=positive)
STREAMS_TRANSACTION_TIMEOUT_MS = option("STREAMS_TRANSACTION_TIMEOUT_MS", int, 10_000,
                                        "how long the broker keeps a dead worker's open transaction before "
                                        "aborting it; readers of its outputs wait that long at most after a "
                                        "crash (a restart with the same instance id aborts it at once)",
                                        ("worker",), check=positive)
STREAMS_LINGER_MS = option("STREAMS_LINGER_MS", int, 5,
                           "how long the worker's producer gathers a partition's messages before sending",
                           ("worker",), check=positive)
STREAMS_LOG_LEVEL = option("STREAMS_LOG_LEVEL", str, "warning", "the worker's log level", ("worker",))
STREAMS_STATE_TTL_S = option("STREAMS_STATE_TTL_S", int, 600,
                             "the worker lets go of a trajectory's, a conversation's, a prompt group's and "
                             "an index entry's state this long after its last event (tombstones on the "
                             "changelog); what arrives for it later starts anew, flagged, and feedback for "
                             "a step it no longer holds is joined in the pool", ("worker",), check=positive)
STREAMS_ROCKSDB_CACHE_MB = option("STREAMS_ROCKSDB_CACHE_MB", int, 64,
                                  "RocksDB block cache of the worker's state, one for all its partitions",
                                  ("worker",), check=positive)
STREAMS_ROCKSDB_WRITE_BUFFER_MB = option("STREAMS_ROCKSDB_WRITE_BUFFER_MB", int, 8,
                                         "RocksDB write buffer (memtable) per partition store; at most two "
                                         "are kept per store", ("worker",), check=positive)

# -- rewarder ----------------------------------------------------------------------------------------

REWARD_FN = option("REWARD_FN", str, "",
                   "`module:function` scoring steps (rewarder, compat `/compute_reward`); `clawr1 up` "
                   "starts the rewarder when set", ("rewarder", "api", "up"))
REWARD_NAME = option("REWARD_NAME", str, "", "source name of the rewards in the pool; empty = the spec",
                     ("rewarder",), default_text="the `CLAWR1_REWARD_FN` spec")
REWARD_TARGET = option("REWARD_TARGET", str, "trajectory",
                       "`trajectory` (score a trajectory once, at its terminal step) or `step`",
                       ("rewarder",))
REWARD_GROUP = option("REWARD_GROUP", str, "clawr1-rewarder", "Kafka consumer group", ("rewarder",))
REWARD_SKIP_REWARDED = option("REWARD_SKIP_REWARDED", bool, True,
                              "leave targets that already carry a reward", ("rewarder",))
REWARD_CONCURRENCY = option("REWARD_CONCURRENCY", int, 4, "reward calls in flight (threads)", ("rewarder",))
REWARD_MODEL_URL = option("REWARD_MODEL_URL", str, "",
                          "`clawr1.rewards.http_model:reward_model`: the reward model's URL",
                          ("rewarder", "api"))
REWARD_MODEL_API_KEY = option("REWARD_MODEL_API_KEY", str, "",
                              "`clawr1.rewards.http_model`: sent as `Authorization: Bearer …`",
                              ("rewarder", "api"), secret=True)
REWARD_MODEL_TIMEOUT_S = option("REWARD_MODEL_TIMEOUT_S", float, 30.0,
                                "`clawr1.rewards.http_model`: timeout (s)", ("rewarder", "api"))

# -- proxy -------------------------------------------------------------------------------------------

UPSTREAM_CA_FILE = option("UPSTREAM_CA_FILE", str, "", "PEM bundle the proxy trusts for upstream TLS",
                          ("proxy",))
UPSTREAM_INSECURE = option("UPSTREAM_INSECURE", bool, False,
                           "tests only: skip upstream TLS verification", ("proxy",))
PROXY_INSTANCE = option("PROXY_INSTANCE", str, "",
                        "names this proxy in every event; empty = host name and port", ("proxy",))
PROXY_ALLOW = option("PROXY_ALLOW", str, "*",
                     "where the explicit proxy may connect: comma-separated `host`, `*.domain`, "
                     "`host:port`, or `*` = any host that is not a machine of the stack. This machine (any "
                     "spelling of its addresses) and the Kafka, ClickHouse and schema-registry hosts are "
                     "refused except `CLAWR1_UPSTREAM`'s engines and `host:port` entries naming them "
                     "([security](security.md))",
                     ("proxy",))
PROXY_PROCESSES = option("PROXY_PROCESSES", int, 1,
                         "capture-proxy processes sharing its ports (SO_REUSEPORT), feeding one emitter "
                         "process", ("proxy",))
PROXY_BATCH_MS = option("PROXY_BATCH_MS", float, 25.0,
                        "how long captured calls bound for one partition wait to share a Kafka message "
                        "(an envelope); `0` = each pass sends what it has", ("proxy",),
                        check=lambda v: None if v >= 0 else f"must be >= 0, got {v}")
PROXY_BATCH_CALLS = option("PROXY_BATCH_CALLS", int, 64,
                           "captured calls that fill an envelope (sent then, whatever the wait)", ("proxy",),
                           check=positive)

PROXY_THIN_BATCH_MS = option("PROXY_THIN_BATCH_MS", float, 100.0,
                             "while the emitter holds fewer than CLAWR1_PROXY_THIN_BATCH_CALLS calls, they "
                             "leave no sooner than this long after its last envelopes, every partition's "
                             "together (calls are spooled, durable, meanwhile); `0` = off", ("proxy",),
                             check=not_negative)
PROXY_THIN_BATCH_CALLS = option("PROXY_THIN_BATCH_CALLS", int, 8,
                                "captured calls held (all partitions) that make envelopes leave on "
                                "CLAWR1_PROXY_BATCH_MS",
                                ("proxy",), check=positive)

# -- clawr1 up: supervision and the demo -------------------------------------------------------------

RESTART_BACKOFF_S = option("RESTART_BACKOFF_S", float, 0.5,
                           "first restart delay of a role; doubles per exit within the window", ("up",))
RESTART_MAX_BACKOFF_S = option("RESTART_MAX_BACKOFF_S", float, 30.0, "restart delay cap", ("up",))
RESTART_LIMIT = option("RESTART_LIMIT", int, 5,
                       "more exits of one role within the window is a crash loop: the stack stops (a kill "
                       "of a worker the stall watch found stuck is restarted but not counted)", ("up",))
RESTART_WINDOW_S = option("RESTART_WINDOW_S", float, 300.0, "the crash-loop window", ("up",))
DEMO_ENGINE_PORT = option("DEMO_ENGINE_PORT", int, 8091, "`clawr1 up --demo`: the stand-in engine's port",
                          ("up",))

_DEMO = ("demo",)
DEMO_AGENTS = option("DEMO_AGENTS", int, 2, "black-box openai-SDK agent threads", _DEMO)
DEMO_GROUP_SIZE = option("DEMO_GROUP_SIZE", int, 4, "GRPO rollouts per task", _DEMO, check=positive)
DEMO_ROUNDS = option("DEMO_ROUNDS", int, 2, "user turns per rollout", _DEMO, check=positive)
DEMO_AGENT_PAUSE_S = option("DEMO_AGENT_PAUSE_S", float, 3.0, "pause of each agent between two groups", _DEMO)
DEMO_WHITEBOX_PAUSE_S = option("DEMO_WHITEBOX_PAUSE_S", float, 3.0,
                               "pause of the white-box rollout worker between two groups", _DEMO)
DEMO_EVENT_PAUSE_S = option("DEMO_EVENT_PAUSE_S", float, 2.0,
                            "pause of the black-box service between two posted turns", _DEMO)
DEMO_HUMAN_PAUSE_S = option("DEMO_HUMAN_PAUSE_S", float, 4.0,
                            "how often the simulated human looks at the newest steps", _DEMO)
DEMO_HUMAN_FRACTION = option("DEMO_HUMAN_FRACTION", float, 0.2,
                             "share of the steps the human looked at that it labels", _DEMO,
                             check=lambda v: None if 0 <= v <= 1 else f"must be in [0, 1], got {v}")
DEMO_BATCH_GROUPS = option("DEMO_BATCH_GROUPS", int, 2, "prompt groups per trainer batch", _DEMO,
                           check=positive)
DEMO_BUMP_EVERY = option("DEMO_BUMP_EVERY", int, 3, "batches between two policy-version bumps", _DEMO,
                         check=positive)
DEMO_MAX_STALENESS = option("DEMO_MAX_STALENESS", int, 2,
                            "the trainer takes steps at most this many versions behind", _DEMO)
DEMO_PROGRESS_S = option("DEMO_PROGRESS_S", float, 5.0, "seconds between two progress lines", _DEMO)
DEMO_SEED = option("DEMO_SEED", int, 7, "random seed of the demo workload", _DEMO)

# -- outside the stack's processes: broker files, client tools, tests, benchmarks --------------------

KAFKA_REQUEST_LOG = option("KAFKA_REQUEST_LOG", bool, False,
                           "the local broker logs every request it serves, one JSON line each, to "
                           "`kafka.log.requests` beside its log (what bench/broker_requests.py counts; a "
                           "line per request, for measurements)", ("kafka", "up"))
KAFKA_LIB_DIR = option("KAFKA_LIB_DIR", str, "", "where the Kafka broker's jars are (downloaded once)",
                       ("kafka", "up"), default_text="`.cache/kafka/lib` in the repository")
API_KEY = option("API_KEY", str, "", "the key `clawr1 sql --api` and the consumer SDK send",
                 ("sdk",), secret=True)
SDK_COMMIT_BATCHES = option("SDK_COMMIT_BATCHES", int, 16,
                            "the consumer SDK writes its group's commits and cursor in the background every "
                            "this many `commit()` calls (a crash redelivers at most these)", ("sdk",),
                            check=positive)
SDK_COMMIT_SECONDS = option("SDK_COMMIT_SECONDS", float, 5.0,
                            "the consumer SDK also writes them once the oldest unwritten `commit()` is "
                            "this old (s)", ("sdk",),
                            check=positive)
TEST_KAFKA_BOOTSTRAP = option("TEST_KAFKA_BOOTSTRAP", str, "",
                              "tests: an already running broker instead of a private one", ("test",))
TEST_POOL_DSN = option("TEST_POOL_DSN", str, "", "tests: a ClickHouse server instead of the embedded pool",
                       ("test",), secret=True)
TEST_SCREENSHOTS = option("TEST_SCREENSHOTS", str, "",
                          "tests: `docs` makes the dashboard's browser test refresh the screenshots in docs/ "
                          "(otherwise they go to a temporary folder)", ("test",))
BENCH_KAFKA_BOOTSTRAP = option("BENCH_KAFKA_BOOTSTRAP", str, "",
                               "benchmarks: an already running broker instead of a private one", ("bench",))


# -- using the registry ------------------------------------------------------------------------------


def shared_options() -> list[Option[Any]]:
    return [o for o in REGISTRY.values() if o.shared]


def lookup(name: str) -> Option[Any]:
    """The option named ``name``; unknown names raise UnknownSettingError with the closest known one."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownSettingError(_unknown_message([name])) from None


def closest(name: str) -> str | None:
    """The declared name most like ``name`` (compared without the common prefix), if any is close."""
    short = {known.removeprefix(ENV_PREFIX): known for known in REGISTRY}
    matches = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), list(short), n=1, cutoff=0.6)
    return short[matches[0]] if matches else None


def _unknown_message(names: list[str]) -> str:
    parts = []
    for name in sorted(names):
        guess = closest(name)
        parts.append(f"{name} (did you mean {guess}?)" if guess else name)
    return ("unknown setting " if len(parts) == 1 else "unknown settings ") + ", ".join(parts) + \
        ": every CLAWR1_* variable must be one of those in docs/settings.md"


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse ``CLAWR1_*`` names no option declares, and malformed or out-of-range values of the others."""
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k not in REGISTRY]
    if unknown:
        raise UnknownSettingError(_unknown_message(unknown))
    for name, raw in env.items():
        if name in REGISTRY:
            opt = REGISTRY[name]
            if opt.shared or raw != "":
                opt.parse(raw)


def markdown_table() -> str:
    """``docs/settings.md``: every variable, grouped as declared (tests keep the committed file equal)."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from clawr1/core/registry.py by `clawr1 config --markdown > docs/settings.md`;",
        "     tests/unit/core/test_settings_docs.py fails when this file and the registry differ. -->",
        "",
        "Every Claw-R1 process reads these `CLAWR1_*` environment variables (command-line flags override",
        "the shared ones). A `CLAWR1_*` variable not listed here stops every process at start, naming the",
        "closest known one. `clawr1 config` prints the effective values (secrets masked) and where each",
        "comes from.",
        "",
        "Roles: `shared` = every process (fields of `Settings`); otherwise the `clawr1` command that reads",
        "it (`up` = the local stack's supervisor), `demo` = the `clawr1 up --demo` workload, `sdk` = client",
        "tools, `test` / `bench` = the test-suite and benchmarks. Booleans take `1/true/yes/on` and",
        "`0/false/no/off`; an empty role variable means its default.",
        "",
        "| variable | type | default | roles | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for opt in REGISTRY.values():
        flags = " (secret: masked by `clawr1 config`)" if opt.secret else ""
        check = "; must be positive" if opt.check is positive else ""
        meaning = (opt.help + check + flags).replace("|", "\\|")
        lines.append(f"| `{opt.name}` | {opt.type.__name__} | {opt.default_for_docs()} | "
                     f"{', '.join(opt.roles)} | {meaning} |")
    return "\n".join(lines) + "\n"
