"""Versioned, idempotent schema migrations of the pool, recorded in ``schema_migrations``.

Each migration is ``(id, sql)``; ``sql`` may hold several statements, each ending with ``;`` at the end
of a line. A migration runs once per database (its id is recorded after all its statements succeed) and
every statement is written to be re-runnable (``IF NOT EXISTS``), so a crash between a statement and the
record only repeats harmless work. The consumer SDK's own tables (``clawr1.pool.consumer_tables``) run after
the pool's, in the order listed.

Layout (why it looks like this):
- Every table the sink writes is a ReplacingMergeTree keyed by the logical row's identity, so a replayed
  Kafka message or a newer version collapses into one row; analysts read views that apply ``FINAL``.
- Replacement happens only within a partition, so no table is partitioned by anything that may differ
  between versions of a row (for steps: neither ``created_at_ms`` nor ``updated_at_ms``).
- ``step_versions`` is sorted by ``(trajectory_id, step_id)``: the steps of a trajectory share long token
  prefixes, and keeping them adjacent lets ZSTD find the repeats (measured in bench/bench_pool.py:
  about 2.8x fewer bytes per token than sorting by step id alone). A step's ``trajectory_id`` is part of
  its identity and must not change between its versions.
- ``non_replicated_deduplication_window`` makes the sink's insert deduplication tokens effective.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from clawr1.pool.cluster import cluster_statements, database_statement
from clawr1.pool.consumer_tables import CONSUMER_MIGRATIONS


class MigrationStore(Protocol):
    """What migrations need from a store (``clawr1.pool.store.PoolStore`` is one); declared here so this
    module does not import the store, which imports it to migrate."""

    database: str

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> Any: ...

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None,
              settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str],
               dedup_token: str | None = None, settings: Mapping[str, Any] | None = None) -> int: ...


DEDUP_WINDOW = 10_000
TOKEN_CODEC = "CODEC(ZSTD(1))"
TEXT_CODEC = "CODEC(ZSTD(1))"

READY_QUEUE = "ready_queue"
"""Keys of every ready step version, ordered by ``(ingested_at, step_id)``: what consumers polled until the
delivery log replaced it (migration 0011 drops it)."""

DELIVERY_LOG = "delivery_log"
"""Every step version in the order it landed, ready ones with their training payload: read by ready polls."""

DELIVERY_PAYLOAD_TTL_HOURS = 24
"""How long the delivery log keeps a ready version's payload copy (then it is read from ``step_versions``)."""

STEP_LOOKUP = "step_lookup"
"""32-bit hashes of every step_id, prompt_id and response_id, each with the trajectory holding it."""
_ID_HASH = "toUInt32(cityHash64({id}) % 4294967296)"

PRUNE_KEYS = "prune_keys"
"""The keys one ``clawr1 prune`` deletes (``clawr1.pool.prune``), fixed before anything is deleted."""

_SINK_TABLE_SETTINGS = f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"

# Columns mirror schemas/step.avsc field by field; see docs/pool.md for the type mapping.
_STEP_COLUMNS = f"""
    step_id String,
    version Int64,
    trajectory_id String,
    step_index Int32,
    parent_step_id Nullable(String),
    prompt_group_id Nullable(String),
    prompt_group_size Nullable(Int32),
    prompt_id String,
    response_id String,
    source_kind LowCardinality(String),
    source_name LowCardinality(String),
    agent LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    policy_version Nullable(Int64),
    sampling_params_json String {TEXT_CODEC},
    created_at_ms DateTime64(3, 'UTC'),
    latency_ms Nullable(Int64),
    usage_prompt_tokens Nullable(Int64),
    usage_completion_tokens Nullable(Int64),
    prompt_messages String {TEXT_CODEC},
    response_text String {TEXT_CODEC},
    tool_calls_json String {TEXT_CODEC},
    prompt_token_ids Array(UInt32) {TOKEN_CODEC},
    response_token_ids Array(UInt32) {TOKEN_CODEC},
    response_logprobs Array(Float64) {TEXT_CODEC},
    token_provenance LowCardinality(String),
    tokenizer LowCardinality(Nullable(String)),
    reward Nullable(Float64),
    reward_components Map(LowCardinality(String), Float64),
    reward_source LowCardinality(Nullable(String)),
    reward_status LowCardinality(String),
    trajectory_reward Nullable(Float64),
    terminal UInt8,
    feedback_json String {TEXT_CODEC},
    quality_labels Array(LowCardinality(String)),
    quality_score Nullable(Float64),
    status LowCardinality(String),
    error Nullable(String) {TEXT_CODEC},
    ready UInt8,
    metadata_json String {TEXT_CODEC},
    updated_at_ms DateTime64(3, 'UTC'),
    trajectory_reward_status LowCardinality(String),
    channel LowCardinality(String) DEFAULT 'train',
    link_status LowCardinality(String) DEFAULT 'linked',
    link_candidate_step_id Nullable(String),
    prompt_group_inferred UInt8 DEFAULT 0,
    prompt_group_closes_at_ms Nullable(DateTime64(3, 'UTC')),
    engine LowCardinality(Nullable(String))"""

STEP_FIELDS: tuple[str, ...] = tuple(
    line.strip().split(" ", 1)[0] for line in _STEP_COLUMNS.strip().splitlines()
)
"""The ``steps`` view's columns before ``ingested_at``: exactly the fields of step.avsc, in order."""

_COLUMN_TYPES: dict[str, str] = {
    line.strip().split(" ", 1)[0]: line.strip().rstrip(",").split(" ", 1)[1]
    for line in _STEP_COLUMNS.strip().splitlines()
}
DELIVERY_FIELDS: tuple[str, ...] = tuple(
    name for name in STEP_FIELDS[: STEP_FIELDS.index("prompt_group_closes_at_ms") + 1]
    if name not in ("prompt_messages", "response_text", "tool_calls_json")
)
"""The step columns the delivery log carries: every field of step.v3 but the wide text a trainer rarely
reads. Fixed here, so a column added to the steps later reaches ready polls only once the log has it."""
DELIVERY_KEYS: tuple[str, ...] = ("step_id", "version", "trajectory_id", "ready")
"""What every entry keeps, ready or not: enough to tell that a step has a newer version."""
DELIVERY_FILTER_FIELDS: tuple[str, ...] = (
    "link_status", "quality_labels", "reward_status", "reward", "quality_score", "source_kind", "source_name",
    "token_provenance", "channel", "created_at_ms", "policy_version",
)
"""The columns the consumer SDK's curation filters read (``clawr1.consumer_sdk.filters.filter_sql``): a
ready entry keeps them as long as the pool, so a read picks its range in the log alone."""
PAYLOAD_FIELDS: tuple[str, ...] = tuple(
    name for name in DELIVERY_FIELDS if name not in (*DELIVERY_KEYS, *DELIVERY_FILTER_FIELDS)
)
"""The rest of a ready entry, token ids, logprobs and JSON among it: kept ``DELIVERY_PAYLOAD_TTL_HOURS``
(then read from ``step_versions``)."""

_PAYLOAD_KEPT_SINCE = f"now64(3) - INTERVAL {DELIVERY_PAYLOAD_TTL_HOURS} HOUR"


def _delivery_feed(ready: bool) -> str:
    """What 0012's feeds wrote to the delivery log for the ready (or not ready) versions of an insert: all
    of an entry, or its keys (the log's defaults stand for the rest). 0013 made them one feed."""
    columns = ", ".join([*DELIVERY_FIELDS, "toUInt8(1) AS has_payload"] if ready else DELIVERY_KEYS)
    return (f"SELECT now64(3) AS logged_at, {columns}, ingested_at FROM step_versions "
            f"WHERE ready = {int(ready)}")


def _delivery_select(logged_at: str, with_payload: str) -> str:
    """The delivery log's row of a ``step_versions`` row (the backfill's): the filter columns where it is
    ready, the payload where ``with_payload`` holds, defaults elsewhere (as the feeds write them)."""
    def value(name: str) -> str:
        if name in DELIVERY_KEYS:
            return name
        when = "ready = 1" if name in DELIVERY_FILTER_FIELDS else with_payload
        declared = re.search(r" DEFAULT (.+)$", _COLUMN_TYPES[name])  # the log's own, as a feed leaves it
        default = declared.group(1) if declared else f"defaultValueOfArgumentType({name})"
        return f"if({when}, {name}, {default}) AS {name}"

    values = ", ".join(value(name) for name in DELIVERY_FIELDS)
    return (f"SELECT {logged_at} AS logged_at, {values}, toUInt8({with_payload}) AS has_payload, "
            "ingested_at FROM step_versions")


def _delivery_log_columns() -> str:
    expires = f"TTL toDateTime(logged_at) + INTERVAL {DELIVERY_PAYLOAD_TTL_HOURS} HOUR"
    columns = [f"{name} {_COLUMN_TYPES[name]}{' ' + expires if name in PAYLOAD_FIELDS else ''}"
               for name in DELIVERY_FIELDS]
    return ",\n    ".join(["logged_at DateTime64(3, 'UTC')", *columns, f"has_payload UInt8 {expires}",
                            "ingested_at DateTime64(3, 'UTC')"])


_SOURCE_COLUMNS = """
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3),
    source_topic LowCardinality(String) DEFAULT '',
    source_partition Int32 DEFAULT -1,
    source_offset Int64 DEFAULT -1"""



def _prompt_groups_view(create: str, more: tuple[str, ...] = ()) -> str:
    """The ``prompt_groups`` view, with ``more`` columns after the first version's."""
    columns = ",\n       ".join(["min(created_at_ms) AS started_at", *more])
    return f"""{create} prompt_groups AS
SELECT assumeNotNull(prompt_group_id) AS prompt_group_id,
       max(prompt_group_size) AS group_size,
       count() AS num_steps,
       uniqExact(trajectory_id) AS num_trajectories,
       uniqExact(prompt_id) AS distinct_prompts,
       avg(reward) AS mean_reward,
       stddevPop(reward) AS reward_std,
       countIf(reward_status = 'final') AS final_rewards,
       min(ready) AS all_ready,
       {columns}
FROM (SELECT * FROM steps WHERE prompt_group_id IS NOT NULL)
GROUP BY prompt_group_id;
"""


POOL_MIGRATIONS: list[tuple[str, str]] = [
    ("0001_step_versions", f"""
CREATE TABLE IF NOT EXISTS step_versions ({_STEP_COLUMNS},{_SOURCE_COLUMNS},
    INDEX idx_step_id step_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_prompt_id prompt_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_response_id response_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_prompt_group_id prompt_group_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_parent_step_id parent_step_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_reward reward TYPE minmax GRANULARITY 1,
    INDEX idx_reward_status reward_status TYPE set(8) GRANULARITY 1,
    INDEX idx_ready ready TYPE minmax GRANULARITY 1,
    INDEX idx_status status TYPE set(8) GRANULARITY 1,
    INDEX idx_policy_version policy_version TYPE minmax GRANULARITY 1,
    INDEX idx_source_kind source_kind TYPE set(8) GRANULARITY 1,
    INDEX idx_source_name source_name TYPE set(256) GRANULARITY 1,
    INDEX idx_model model TYPE set(256) GRANULARITY 1,
    INDEX idx_token_provenance token_provenance TYPE set(8) GRANULARITY 1,
    INDEX idx_quality_labels quality_labels TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_created_at created_at_ms TYPE minmax GRANULARITY 1
) ENGINE = ReplacingMergeTree(version)
ORDER BY (trajectory_id, step_id)
{_SINK_TABLE_SETTINGS};
"""),
    ("0002_steps_view", f"""
CREATE VIEW IF NOT EXISTS steps AS
SELECT {', '.join(STEP_FIELDS)}, ingested_at
FROM step_versions FINAL;
"""),
    ("0003_feedback", f"""
CREATE TABLE IF NOT EXISTS feedback_log (
    feedback_id String,
    target_kind LowCardinality(String),
    target_id String,
    reward Nullable(Float64),
    components Map(LowCardinality(String), Float64),
    final UInt8,
    source LowCardinality(String),
    source_name LowCardinality(String),
    label LowCardinality(Nullable(String)),
    comment Nullable(String) {TEXT_CODEC},
    correction Nullable(String) {TEXT_CODEC},
    received_at_ms DateTime64(3, 'UTC'),{_SOURCE_COLUMNS},
    INDEX idx_feedback_id feedback_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_source source TYPE set(64) GRANULARITY 1,
    INDEX idx_received_at received_at_ms TYPE minmax GRANULARITY 1
) ENGINE = ReplacingMergeTree
ORDER BY (target_kind, target_id, feedback_id)
{_SINK_TABLE_SETTINGS};
CREATE VIEW IF NOT EXISTS feedback AS SELECT * EXCEPT (source_topic, source_partition, source_offset)
FROM feedback_log FINAL;
"""),
    ("0004_prefix_nodes", f"""
CREATE TABLE IF NOT EXISTS prefix_node_versions (
    scope_id String,
    scope_kind LowCardinality(String),
    node_id String,
    parent_node_id Nullable(String),
    depth_start Int32,
    token_ids Array(UInt32) {TOKEN_CODEC},
    step_ids Array(String),
    version Int64,
    total_tokens Int64,
    tree_tokens Int64,
    forks Int32,
    updated_at_ms DateTime64(3, 'UTC'),{_SOURCE_COLUMNS},
    INDEX idx_step_ids step_ids TYPE bloom_filter(0.01) GRANULARITY 1
) ENGINE = ReplacingMergeTree(version)
ORDER BY (scope_id, node_id)
{_SINK_TABLE_SETTINGS};
CREATE VIEW IF NOT EXISTS prefix_nodes AS SELECT * EXCEPT (source_topic, source_partition, source_offset)
FROM prefix_node_versions FINAL;
CREATE VIEW IF NOT EXISTS prefix_savings AS
SELECT scope_kind, scope_id,
       if(scope_kind = 'prompt_group', scope_id, NULL) AS prompt_group_id,
       if(scope_kind = 'trajectory', scope_id, NULL) AS trajectory_id,
       newest_total AS total_tokens,
       newest_tree AS tree_tokens,
       newest_total - newest_tree AS saved_tokens,
       if(newest_tree = 0, 1.0, newest_total / newest_tree) AS savings_ratio,
       newest_forks AS forks,
       num_nodes, newest_version AS version
FROM (
    SELECT scope_kind, scope_id,
           argMax(total_tokens, (version, updated_at_ms)) AS newest_total,
           argMax(tree_tokens, (version, updated_at_ms)) AS newest_tree,
           argMax(forks, (version, updated_at_ms)) AS newest_forks,
           count() AS num_nodes,
           max(version) AS newest_version
    FROM prefix_node_versions FINAL
    GROUP BY scope_kind, scope_id
);
CREATE VIEW IF NOT EXISTS prefix_savings_total AS
SELECT kind AS scope_kind, scopes, total AS total_tokens, tree AS tree_tokens, total - tree AS saved_tokens,
       if(tree = 0, 1.0, total / tree) AS savings_ratio, fork_count AS forks
FROM (
    SELECT if(grouping(scope_kind) = 1, 'all', scope_kind) AS kind, count() AS scopes,
           sum(total_tokens) AS total, sum(tree_tokens) AS tree, sum(forks) AS fork_count
    FROM prefix_savings
    GROUP BY scope_kind WITH ROLLUP
);
"""),
    ("0005_dead_letters", f"""
CREATE TABLE IF NOT EXISTS dead_letter_log (
    dlq_id String,
    reason String {TEXT_CODEC},
    stage LowCardinality(String),
    source_topic LowCardinality(String),
    source_partition Nullable(Int32),
    source_offset Nullable(Int64),
    original_key Nullable(String) {TEXT_CODEC},
    original_value Nullable(String) {TEXT_CODEC},
    failed_at_ms DateTime64(3, 'UTC'),
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3),
    dlq_topic LowCardinality(String) DEFAULT '',
    dlq_partition Int32 DEFAULT -1,
    dlq_offset Int64 DEFAULT -1,
    INDEX idx_failed_at failed_at_ms TYPE minmax GRANULARITY 1
) ENGINE = ReplacingMergeTree
ORDER BY dlq_id
{_SINK_TABLE_SETTINGS};
CREATE VIEW IF NOT EXISTS dead_letters AS SELECT * FROM dead_letter_log FINAL;
"""),
    ("0006_trajectories_and_groups", f"""
CREATE VIEW IF NOT EXISTS trajectories AS
SELECT trajectory_id,
       count() AS num_steps,
       max(step_index) + 1 AS length,
       any(source_kind) AS source_kind,
       any(source_name) AS source_name,
       groupUniqArray(model) AS models,
       groupUniqArray(policy_version) AS policy_versions,
       any(prompt_group_id) AS prompt_group_id,
       min(created_at_ms) AS started_at,
       max(created_at_ms) AS last_step_at,
       sum(length(prompt_token_ids)) AS prompt_tokens,
       sum(length(response_token_ids)) AS response_tokens,
       sum(reward) AS reward_sum,
       max(trajectory_reward) AS trajectory_reward,
       if(countIf(trajectory_reward_status = 'final') > 0, 'final', 'pending') AS trajectory_reward_status,
       countIf(reward_status = 'final') AS final_rewards,
       max(terminal) AS terminal,
       min(ready) AS all_ready
FROM steps
GROUP BY trajectory_id;
{_prompt_groups_view("CREATE VIEW IF NOT EXISTS")}"""),
    # Pools made before step.v2: add its columns, then widen the view (a view's column list is fixed when
    # it is created). On a fresh pool 0001 already made them and the ALTERs do nothing.
    ("0007_step_channel_and_link_status", f"""
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS channel LowCardinality(String) DEFAULT 'train';
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS link_status LowCardinality(String) DEFAULT 'linked';
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS link_candidate_step_id Nullable(String);
CREATE OR REPLACE VIEW steps AS
SELECT {', '.join(STEP_FIELDS)}, ingested_at
FROM step_versions FINAL;
"""),
    # A view's columns are fixed when it is created: recreated to show the new column.
    ("0008_feedback_terminal", """
ALTER TABLE feedback_log ADD COLUMN IF NOT EXISTS terminal UInt8 DEFAULT 0 AFTER received_at_ms;
CREATE OR REPLACE VIEW feedback AS SELECT * EXCEPT (source_topic, source_partition, source_offset)
FROM feedback_log FINAL;
"""),
    # Consumers poll ready steps in the order they became ready without reading `step_versions FINAL`:
    # every ready version written also lands here (the sink is unchanged: a materialized view feeds it),
    # sorted by readiness time, so a poll reads the next keys by primary key and then only the newest
    # version of those steps (consumer_sdk/queries.py). Append-only; a step may have several entries.
    # The backfill copies the ready versions of older pools once (what is already here is skipped).
    ("0009_ready_queue", f"""
CREATE TABLE IF NOT EXISTS {READY_QUEUE} (
    ingested_at DateTime64(3, 'UTC'),
    step_id String,
    trajectory_id String,
    version Int64
) ENGINE = ReplacingMergeTree
ORDER BY (ingested_at, step_id);
CREATE MATERIALIZED VIEW IF NOT EXISTS {READY_QUEUE}_feed TO {READY_QUEUE} AS
SELECT ingested_at, step_id, trajectory_id, version FROM step_versions WHERE ready = 1;
INSERT INTO {READY_QUEUE} (ingested_at, step_id, trajectory_id, version)
SELECT ingested_at, step_id, trajectory_id, version FROM step_versions
WHERE ready = 1
  AND (ingested_at, step_id, version) NOT IN (SELECT ingested_at, step_id, version FROM {READY_QUEUE});
"""),
    # Lookups by step_id, prompt_id or response_id without scanning skip indexes over the whole pool: a
    # 32-bit hash of each id points at the step's trajectory_id, and the step is then read by primary
    # key (the query is ID_LOOKUP_SQL; docs/pool.md shows it). The hash is short on purpose: sorted, its
    # gaps compress to about a byte, and a rare collision only adds a trajectory the query then filters
    # out by the exact id. Fed by a materialized view; the backfill copies older pools' ids once.
    ("0010_step_lookup", f"""
CREATE TABLE IF NOT EXISTS {STEP_LOOKUP} (
    id_hash UInt32 CODEC(Delta, ZSTD(1)),
    trajectory_id String CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree
ORDER BY (id_hash, trajectory_id);
CREATE MATERIALIZED VIEW IF NOT EXISTS {STEP_LOOKUP}_feed TO {STEP_LOOKUP} AS
SELECT {_ID_HASH.format(id="id")} AS id_hash, trajectory_id
FROM step_versions ARRAY JOIN [step_id, prompt_id, response_id] AS id;
INSERT INTO {STEP_LOOKUP} (id_hash, trajectory_id)
SELECT DISTINCT {_ID_HASH.format(id="id")} AS id_hash, trajectory_id
FROM step_versions ARRAY JOIN [step_id, prompt_id, response_id] AS id
WHERE (id_hash, trajectory_id) NOT IN (SELECT id_hash, trajectory_id FROM {STEP_LOOKUP});
"""),
    # Pools made before step.v3 (inferred prompt groups): add its columns, then recreate the views that
    # show them (a view's column list is fixed when it is created). An inferred group has no declared size:
    # ``prompt_groups`` shows when it closes instead (consumer_sdk/queries.py judges it whole after that).
    ("0011_inferred_prompt_groups", f"""
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS prompt_group_inferred UInt8 DEFAULT 0;
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS prompt_group_closes_at_ms Nullable(DateTime64(3, 'UTC'));
CREATE OR REPLACE VIEW steps AS
SELECT {', '.join(STEP_FIELDS)}, ingested_at
FROM step_versions FINAL;
{_prompt_groups_view("CREATE OR REPLACE VIEW", ("max(prompt_group_inferred) AS inferred",
                                                 "max(prompt_group_closes_at_ms) AS closes_at"))}"""),
    # The delivery log (docs/consumer_sdk.md, "Delivery log"): every step version in the order it landed in
    # the pool (`logged_at`, the pool's clock when the sink's insert ran), so a group's position is a point
    # in it and a ready poll reads the next range by primary key. Ready versions carry the training payload
    # (token ids, logprobs, JSON), so a batch is one contiguous read instead of a read of every granule of
    # `step_versions` its steps sit in; the payload expires after DELIVERY_PAYLOAD_TTL_HOURS (then read from
    # `step_versions`), the keys and the filters' columns stay. Versions that are not ready are kept as keys
    # only: they tell a reader that an earlier ready version is no longer the step's newest. Fed by two
    # materialized views, for ready versions and for the others (the sink is unchanged); the backfill copies
    # older pools once, at their own ingest times. It replaces the ready queue (0009), whose view and table
    # are dropped.
    ("0012_delivery_log", f"""
CREATE TABLE IF NOT EXISTS {DELIVERY_LOG} (
    {_delivery_log_columns()}
) ENGINE = MergeTree
ORDER BY (logged_at, step_id, version)
SETTINGS merge_with_ttl_timeout = 3600;
CREATE MATERIALIZED VIEW IF NOT EXISTS {DELIVERY_LOG}_feed TO {DELIVERY_LOG} AS
{_delivery_feed(ready=True)};
CREATE MATERIALIZED VIEW IF NOT EXISTS {DELIVERY_LOG}_moves TO {DELIVERY_LOG} AS
{_delivery_feed(ready=False)};
INSERT INTO {DELIVERY_LOG} {_delivery_select("ingested_at",
                                              f"ready = 1 AND ingested_at >= {_PAYLOAD_KEPT_SINCE}")}
WHERE (step_id, version, ingested_at) NOT IN (SELECT step_id, version, ingested_at FROM {DELIVERY_LOG});
DROP VIEW IF EXISTS {READY_QUEUE}_feed;
DROP TABLE IF EXISTS {READY_QUEUE};
"""),
    # One feed for the delivery log instead of 0012's two (ready versions, the others): every insert into
    # step_versions ran both, each analysing its query and writing its own part of the log, about a fifth
    # of the insert's CPU. The one feed writes the same rows as the two did (what the backfill writes,
    # stamped now), and one insert's entries now share one `logged_at`. Its query changes in place before
    # the second feed goes, so a sink inserting meanwhile logs a version that is not ready twice at most
    # (keys only, delivered never), a ready one never twice and no version not at all.
    ("0013_delivery_log_one_feed", f"""
ALTER TABLE {DELIVERY_LOG}_feed MODIFY QUERY
{_delivery_select("now64(3)", "ready = 1")};
DROP VIEW IF EXISTS {DELIVERY_LOG}_moves;
"""),
    # Retention (pool/retention.py) and prune (pool/prune.py). The id lookup gets the day each row was
    # indexed, so it can expire with the steps it points at (rows written before carry the day of their
    # first merge or TTL rewrite after this). Prune gets a table for the keys it deletes, filled before it
    # deletes anything, so every table's deletion reads the same keys: a subquery over the steps themselves
    # would change while their parts are rewritten one by one. Its rows expire after a day.
    ("0014_retention", f"""
ALTER TABLE {STEP_LOOKUP} ADD COLUMN IF NOT EXISTS indexed_on Date DEFAULT today();
CREATE TABLE IF NOT EXISTS {PRUNE_KEYS} (
    prune_id String,
    kind LowCardinality(String),
    trajectory_id String,
    id String,
    added_at DateTime DEFAULT now()
) ENGINE = MergeTree
ORDER BY (prune_id, kind, trajectory_id, id)
TTL added_at + INTERVAL 1 DAY;
"""),
    # Pools made before step.v4 (the engine that served a captured step): add its column and recreate the
    # view that shows it. The delivery log's columns are fixed (DELIVERY_FIELDS): read it from ``steps``.
    ("0015_step_engine", f"""
ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS engine LowCardinality(Nullable(String));
CREATE OR REPLACE VIEW steps AS
SELECT {', '.join(STEP_FIELDS)}, ingested_at
FROM step_versions FINAL;
"""),
]

ID_COLUMNS: tuple[str, ...] = ("step_id", "prompt_id", "response_id")


def id_lookup_sql(column: str) -> str:
    """The steps (newest versions, all columns) whose ``column`` equals the ``{{id:String}}`` parameter:
    the lookup table narrows the read to the trajectories holding that id, then the ``steps`` view is
    read by primary key. Analysts, the dashboard and the SDK use this rather than ``WHERE step_id = ...``
    on the view, which checks a skip index in every granule of the pool."""
    if column not in ID_COLUMNS:
        raise ValueError(f"ids are looked up by one of {ID_COLUMNS}, not {column!r}")
    hashed = _ID_HASH.format(id="{id:String}")
    return (f"SELECT * FROM steps WHERE trajectory_id IN (SELECT trajectory_id FROM {STEP_LOOKUP} "
            f"WHERE id_hash = {hashed}) AND {column} = {{id:String}}")


def all_migrations() -> list[tuple[str, str]]:
    """The pool's migrations, then the consumer SDK's; ids must be unique across both."""
    seen: set[str] = set()
    ordered = [*POOL_MIGRATIONS, *CONSUMER_MIGRATIONS]
    for migration_id, _ in ordered:
        if migration_id in seen:
            raise ValueError(f"duplicate migration id {migration_id!r}")
        seen.add(migration_id)
    return ordered


_STATEMENT_END = re.compile(r";[ \t]*(?:\n|$)")


def split_statements(sql: str) -> list[str]:
    """Statements of a migration: each ends with ``;`` at the end of a line."""
    return [part.strip() for part in _STATEMENT_END.split(sql) if part.strip()]


_BOOTSTRAP = f"""
CREATE TABLE IF NOT EXISTS schema_migrations (
    id String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree ORDER BY id
{_SINK_TABLE_SETTINGS}"""


def applied_ids(store: MigrationStore) -> set[str]:
    return {row["id"] for row in store.query("SELECT DISTINCT id FROM schema_migrations")}


def apply_migrations(store: MigrationStore, migrations: list[tuple[str, str]] | None = None,
                     cluster: str = "") -> list[str]:
    """Run the migrations not yet recorded, in order; returns their ids. On a ClickHouse ``cluster``
    each statement runs in its cluster form (``clawr1.pool.cluster``)."""

    def run(statement: str) -> None:
        for each in cluster_statements(statement, cluster, store.database) if cluster else [statement]:
            store.command(each)

    if cluster:
        store.command(database_statement(cluster, store.database))
    run(_BOOTSTRAP.strip())
    done = applied_ids(store)
    applied: list[str] = []
    for migration_id, sql in migrations if migrations is not None else all_migrations():
        if migration_id in done:
            continue
        for statement in split_statements(sql):
            run(statement)
        store.insert("schema_migrations", [[migration_id]], ["id"], dedup_token=f"migration:{migration_id}")
        applied.append(migration_id)
    return applied
