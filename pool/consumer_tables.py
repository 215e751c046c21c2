"""Pool tables owned by the consumer SDK (group commits, group positions, curation presets).

The pool's migration runner executes ``CONSUMER_MIGRATIONS`` in order; the pool API lets SDK clients
write only the tables in ``CONSUMER_WRITABLE_TABLES``. The SDK never updates a row: every change is a
new row, so the tables work the same on chDB and on a ClickHouse server, and over an insert-only API.

* ``consumer_commits``: one row per (group, epoch, step) a consumer committed. A group's committed
  set is the rows of its current epoch; ``seek`` starts a new epoch, which forgets older commits.
* ``consumer_positions``: one row per ``seek``: the group's epoch and its floor (steps whose current
  version landed in the pool before the floor are skipped). The newest row by ``set_at_ns`` wins.
* ``consumer_presets``: named curation filter sets (JSON); the newest row per name by ``saved_at_ns``.
* ``consumer_cursors``: where a member of a group stands in the delivery log (``pool/migrations.py``,
  ``DELIVERY_LOG``) in the group's current epoch, for one set of curation filters (``filters_key``, a hash
  of their JSON: an entry one set passed over may qualify for another): every entry up to the position
  ``(logged_at_ms, step_id, step_version)`` was delivered and committed or did not qualify. The newest row
  by ``set_at_ns`` wins. ``checked_ms``: the member's checked time for entries that became visible late
  (``clawr1.consumer_sdk.delivery``); a member resuming there goes back to it (0: unknown, a row written
  before the column).

``*_ns`` orderings are client clock nanoseconds: two saves in the same millisecond still order.
"""

COMMITS_TABLE = "consumer_commits"
POSITIONS_TABLE = "consumer_positions"
PRESETS_TABLE = "consumer_presets"
CURSORS_TABLE = "consumer_cursors"

CONSUMER_WRITABLE_TABLES: frozenset[str] = frozenset({COMMITS_TABLE, POSITIONS_TABLE, PRESETS_TABLE,
                                                      CURSORS_TABLE})
OWNER_COLUMNS: dict[str, str] = {
    COMMITS_TABLE: "group_name", POSITIONS_TABLE: "group_name", PRESETS_TABLE: "name",
    CURSORS_TABLE: "group_name",
}
"""The column naming whose row it is: a consume key may write only rows of its own groups and presets."""

CONSUMER_MIGRATIONS: list[tuple[str, str]] = [
    (
        "consumer_0001_commits",
        f"""
        CREATE TABLE IF NOT EXISTS {COMMITS_TABLE} (
            group_name String,
            epoch String,
            step_id String,
            step_version Int64,
            consumer_id String DEFAULT '',
            committed_at DateTime64(3, 'UTC') DEFAULT now64(3)
        ) ENGINE = ReplacingMergeTree(committed_at)
        ORDER BY (group_name, epoch, step_id)
        """,
    ),
    (
        "consumer_0002_positions",
        f"""
        CREATE TABLE IF NOT EXISTS {POSITIONS_TABLE} (
            group_name String,
            epoch String,
            floor_ms Int64,
            set_at_ns Int64,
            consumer_id String DEFAULT ''
        ) ENGINE = MergeTree
        ORDER BY (group_name, set_at_ns)
        """,
    ),
    (
        "consumer_0003_presets",
        f"""
        CREATE TABLE IF NOT EXISTS {PRESETS_TABLE} (
            name String,
            filters_json String,
            saved_at_ns Int64
        ) ENGINE = ReplacingMergeTree(saved_at_ns)
        ORDER BY name
        """,
    ),
    (
        "consumer_0004_cursors",
        f"""
        CREATE TABLE IF NOT EXISTS {CURSORS_TABLE} (
            group_name String,
            epoch String,
            member UInt32,
            members UInt32,
            filters_key String,
            logged_at_ms Int64,
            step_id String,
            step_version Int64,
            set_at_ns Int64,
            consumer_id String DEFAULT ''
        ) ENGINE = ReplacingMergeTree(set_at_ns)
        ORDER BY (group_name, epoch, member, members, filters_key)
        """,
    ),
    (
        "consumer_0005_cursor_checked",
        f"ALTER TABLE {CURSORS_TABLE} ADD COLUMN IF NOT EXISTS checked_ms Int64 DEFAULT 0",
    ),
]
