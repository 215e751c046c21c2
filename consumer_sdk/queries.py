"""The SQL a consumer runs, built as text with ``{name:Type}`` placeholders plus the values they bind.

A poll of ready steps (the default ``ready=True``) reads the pool's delivery log (``delivery_log``, every
step version in the order it landed, ready ones with their training payload) after the member's position,
by primary key: one contiguous read per page, no ``FINAL`` over the pool (see :func:`delivery_page_sql`).
Other polls (``ready=False``/``None``), ``whole_groups`` and ``fetch_batch`` read the ``steps`` view in
one query each, a single snapshot:

* a step is eligible when it matches the filters, its current version landed at or after the
  group's floor, it is not in the group's committed set for the current epoch, not in flight in
  this consumer, and (with static membership) it hashes to this member;
* ``whole_groups`` first picks complete GRPO prompt groups (every trajectory of the group present,
  terminal, with contiguous step indices, every step ready and matching the filters, none taken),
  then returns all their steps.

A group's trajectories are all present when there are ``prompt_group_size`` of them; an *inferred*
group (``prompt_group_inferred``: the linker grouped rollouts without hints by their first prompt)
has no declared size, and holds all of its trajectories once its window has closed
(``prompt_group_closes_at_ms`` has passed): no rollout joins it after that. Superseded steps (retries
the agent threw away) belong to no group or trajectory here: they are never ready and never delivered
with a group.

Batches stop at ``max_steps`` and ``max_tokens`` (prompt + response tokens) but always hold at
least one step (one group), so a single oversized step or group cannot stall a group forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clawr1.pool.consumer_tables import COMMITS_TABLE, CURSORS_TABLE, POSITIONS_TABLE, PRESETS_TABLE
from clawr1.pool.migrations import DELIVERY_FIELDS, DELIVERY_LOG, STEP_FIELDS

STEPS_VIEW = "steps"

TEXT_COLUMNS: tuple[str, ...] = ("prompt_messages", "response_text", "tool_calls_json")
"""Wide text a trainer rarely needs; left out unless asked for (``with_text=True``)."""


def select_list(with_text: bool) -> str:
    """Every column of the steps view (so new step fields reach ``Step.metadata`` on their own)."""
    return "*" if with_text else f"* EXCEPT ({', '.join(TEXT_COLUMNS)})"


def version_columns(with_text: bool) -> str:
    """The ``steps`` view's columns, named, for reading ``step_versions`` itself."""
    names = [*STEP_FIELDS, "ingested_at"]
    return ", ".join(n for n in names if with_text or n not in TEXT_COLUMNS)


_TOKENS = "length(prompt_token_ids) + length(response_token_ids)"
_KEPT = "link_status != 'superseded'"
_GROUP_FACTS = ("max(ifNull(prompt_group_size, 0)) AS {size}, max(prompt_group_inferred) AS inferred, "
                "max(prompt_group_closes_at_ms) AS closes_at")
_CLOSED = "ifNull({closes_at} <= now64(3), 0)"
_ORDER = "ingested_at, step_id"


@dataclass(frozen=True)
class Scope:
    """Where one member of a group stands: its epoch, floor, in-flight steps and hash partition."""

    group: str
    epoch: str
    floor_ms: int
    in_flight: tuple[str, ...]
    member: int = 0
    members: int = 1

    def params(self, in_flight: bool = True) -> dict[str, Any]:
        """The values the scope's clauses bind (the member ones only when there are members to split, the
        in-flight ids only when asked: the pool API refuses parameters a query does not use)."""
        params: dict[str, Any] = {"c_group": self.group, "c_epoch": self.epoch, "c_floor": self.floor_ms}
        if in_flight:
            params["c_in_flight"] = list(self.in_flight)
        if self.members > 1:
            params.update(c_member=self.member, c_members=self.members)
        return params


_NOT_COMMITTED = (
    f"step_id NOT IN (SELECT step_id FROM {COMMITS_TABLE} "
    "WHERE group_name = {c_group:String} AND epoch = {c_epoch:String})"
)
_NOT_IN_FLIGHT = "step_id NOT IN {c_in_flight:Array(String)}"
_AFTER_FLOOR = "fromUnixTimestamp64Milli({c_floor:Int64}, 'UTC')"


def _partition(key: str, scope: Scope) -> list[str]:
    return [f"cityHash64({key}) % {{c_members:UInt64}} = {{c_member:UInt64}}"] if scope.members > 1 else []


def _and(clauses: list[str]) -> str:
    return " AND ".join(f"({c})" for c in clauses) if clauses else "1"


def steps_sql(
    select: str,
    filter_clauses: list[str],
    scope: Scope,
    max_steps: int,
    max_tokens: int | None,
) -> tuple[str, dict[str, Any]]:
    """The next eligible steps in pool order (ingested_at, step_id)."""
    where = _and([
        *filter_clauses,
        f"ingested_at >= {_AFTER_FLOOR}",
        _NOT_COMMITTED,
        _NOT_IN_FLIGHT,
        *_partition("step_id", scope),
    ])
    params = {**scope.params(), "c_max_steps": max_steps}
    inner = (
        f"SELECT {select}, {_TOKENS} AS _tokens FROM {STEPS_VIEW} WHERE {where} "
        f"ORDER BY {_ORDER} LIMIT {{c_max_steps:UInt64}}"
    )
    if max_tokens is None:
        return f"SELECT * EXCEPT (_tokens) FROM ({inner}) ORDER BY {_ORDER}", params
    params["c_max_tokens"] = max_tokens
    windowed = (
        f"SELECT *, sum(_tokens) OVER (ORDER BY {_ORDER} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) "
        f"AS _cum, row_number() OVER (ORDER BY {_ORDER}) AS _rn FROM ({inner})"
    )
    sql = (f"SELECT * EXCEPT (_tokens, _cum, _rn) FROM ({windowed}) "
           f"WHERE _rn = 1 OR _cum <= {{c_max_tokens:UInt64}} ORDER BY {_ORDER}")
    return sql, params


Position = tuple[int, str, int]
"""A point in the pool's delivery log: ``(logged_at ms, step_id, version)``, the log's sort key."""

_LOG_ORDER = "logged_at, step_id, version"
_START_AT = "fromUnixTimestamp64Milli({c_start_ms:Int64}, 'UTC')"
_AFTER_START = (f"logged_at >= {_START_AT} AND (logged_at > {_START_AT} "
                "OR (step_id, version) > ({c_start_id:String}, {c_start_version:Int64}))")


def delivery_columns(with_text: bool) -> str:
    """What a ready poll reads from the delivery log: its step columns, or (``with_text``, which the log
    does not carry) just the keys, the rest then coming from ``step_versions``."""
    names = ("step_id", "trajectory_id", "version") if with_text else (*DELIVERY_FIELDS, "ingested_at")
    return ", ".join(names)


def delivery_page_sql(
    columns: str, filter_clauses: list[str], scope: Scope, start: Position, scan: int, exclude: list[str]
) -> tuple[str, dict[str, Any]]:
    """One page of a ready poll: the next ``scan`` delivery-log entries after ``start`` that pass the
    filters, the floor and the member split (``exclude``: step ids this consumer already holds), read by
    primary key, in log order, each with ``logged_at``, ``has_payload``, ``_committed`` and ``_newest``.

    ``_committed``: the group's current epoch committed the step. ``_newest``: no later entry of the step,
    ready or not, is in the log; judged on 64-bit hashes of the step ids (far cheaper to group and match
    than the strings), so a 1 is certain and a 0 may be another step's entry under the same hash: the
    caller checks those few with :data:`NEWEST_SQL`. Later entries are looked for from ``start`` on, so
    the check costs what lies between the page and the log's end, not the pool.
    """
    selected = _and([
        _AFTER_START,
        *filter_clauses,
        f"ingested_at >= {_AFTER_FLOOR}",
        *_partition("step_id", scope),
        "step_id NOT IN {c_exclude:Array(String)}",
    ])
    page = (f"SELECT logged_at, step_id, version FROM {DELIVERY_LOG} WHERE {selected} "
            f"ORDER BY {_LOG_ORDER} LIMIT {{c_scan:UInt64}}")
    newest = (f"SELECT cityHash64(step_id) AS h, max((version, logged_at)) FROM {DELIVERY_LOG} "
              f"WHERE logged_at >= {_START_AT} AND h IN (SELECT cityHash64(step_id) FROM page) GROUP BY h")
    committed = (f"SELECT step_id FROM {COMMITS_TABLE} WHERE group_name = {{c_group:String}} "
                 "AND epoch = {c_epoch:String} AND step_id IN (SELECT step_id FROM page)")
    sql = (
        f"WITH page AS ({page}) "
        f"SELECT {columns}, logged_at, has_payload, toUInt8(step_id IN ({committed})) AS _committed, "
        f"toUInt8((cityHash64(step_id), (version, logged_at)) IN ({newest})) AS _newest FROM {DELIVERY_LOG} "
        f"WHERE logged_at >= {_START_AT} AND (logged_at, step_id, version) IN (SELECT * FROM page) "
        f"ORDER BY {_LOG_ORDER}"
    )
    params = {**scope.params(in_flight=False), "c_start_ms": start[0], "c_start_id": start[1],
              "c_start_version": start[2], "c_scan": scan, "c_exclude": exclude}
    return sql, params


SIZES_SQL = (
    "SELECT avg(tokens) AS tokens, count() AS entries FROM (SELECT length(prompt_token_ids) + "
    f"length(response_token_ids) AS tokens FROM {DELIVERY_LOG} WHERE {_AFTER_START} AND ready = 1 "
    f"AND has_payload = 1 ORDER BY {_LOG_ORDER} LIMIT {{c_sample:UInt64}})"
)
"""The mean tokens of the next ready entries after a position (their sizes only): sizes a first read."""

NEWEST_SQL = (
    "SELECT step_id, newest.1 AS newest_version, toUnixTimestamp64Milli(newest.2) AS at_ms FROM ("
    f"SELECT step_id, max((version, logged_at)) AS newest FROM {DELIVERY_LOG} "
    f"WHERE logged_at >= {_START_AT} AND step_id IN {{c_steps:Array(String)}} GROUP BY step_id)"
)
"""The newest entry from a page's start on of each of the given steps, compared by step id itself."""


def stored_versions_sql(columns: str) -> str:
    """Every stored version of the given steps (by primary key): for entries whose payload the delivery log
    no longer holds, or columns it never held."""
    return (f"SELECT {columns} FROM step_versions WHERE trajectory_id IN {{c_trajectories:Array(String)}} "
            "AND step_id IN {c_steps:Array(String)}")


def whole_groups_sql(
    select: str,
    filter_clauses: list[str],
    scope: Scope,
    max_steps: int,
    max_tokens: int | None,
    max_groups: int | None,
) -> tuple[str, dict[str, Any]]:
    """All steps of the next complete prompt groups, a group never split across batches."""
    match = _and(["ready = 1", *filter_clauses])
    grouped = _and(["prompt_group_id IS NOT NULL", _KEPT, *_partition("prompt_group_id", scope)])
    per_trajectory = (
        "SELECT prompt_group_id, trajectory_id, count() AS n, "
        f"sum({_TOKENS}) AS tokens, max(ingested_at) AS last_at, "
        "max(toUInt8(terminal)) AS has_terminal, "
        "uniqExact(step_index) = count() AND max(step_index) - min(step_index) + 1 = count() AS contiguous, "
        f"min(ifNull({match}, 0)) AS all_match, {_GROUP_FACTS.format(size='group_size')}, "
        f"countIf(({_NOT_COMMITTED}) = 0 OR ({_NOT_IN_FLIGHT}) = 0) AS taken "
        f"FROM {STEPS_VIEW} WHERE {grouped} "
        "GROUP BY prompt_group_id, trajectory_id"
    )
    closed = _CLOSED.format(closes_at="max(closes_at)")
    present = f"if(max(inferred) = 1, {closed}, count() = max(group_size))"
    per_group = (
        "SELECT prompt_group_id, sum(n) AS steps, sum(tokens) AS group_tokens, max(last_at) AS group_last_at "
        f"FROM ({per_trajectory}) GROUP BY prompt_group_id "
        f"HAVING {present} AND min(has_terminal) = 1 AND min(contiguous) = 1 "
        f"AND min(all_match) = 1 AND sum(taken) = 0 AND max(last_at) >= {_AFTER_FLOOR}"
    )
    group_order = "group_last_at, prompt_group_id"
    fits = ["_cum_steps <= {c_max_steps:UInt64}"]
    params = {**scope.params(), "c_max_steps": max_steps}
    if max_tokens is not None:
        fits.append("_cum_tokens <= {c_max_tokens:UInt64}")
        params["c_max_tokens"] = max_tokens
    if max_groups is not None:
        fits.append("_rn <= {c_max_groups:UInt64}")
        params["c_max_groups"] = max_groups
    running = f"OVER (ORDER BY {group_order} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    ranked = (
        f"SELECT prompt_group_id, sum(steps) {running} AS _cum_steps, "
        f"sum(group_tokens) {running} AS _cum_tokens, "
        f"row_number() OVER (ORDER BY {group_order}) AS _rn FROM ({per_group})"
    )
    chosen = f"SELECT prompt_group_id FROM ({ranked}) WHERE _rn = 1 OR ({_and(fits)})"
    sql = (
        f"SELECT {select} FROM {STEPS_VIEW} WHERE prompt_group_id IN ({chosen}) AND {_KEPT} "
        "ORDER BY prompt_group_id, trajectory_id, step_index"
    )
    return sql, params


def rollout_groups_sql(
    filter_clauses: list[str], scope: Scope, batch_size: int, n_rollouts: int | None
) -> tuple[str, dict[str, Any]]:
    """The trajectories ``fetch_batch`` takes: ``n_rollouts`` complete ones from each of the first
    ``batch_size`` prompt groups that have that many, groups first come first served.

    A trajectory is complete when it has its terminal step, contiguous step indices, every step
    matching the filters and none taken; the group's place in line is its first step's
    ``created_at_ms`` (the rollout order, stable across step versions). Within a group the trajectories
    that completed first (landed in the pool first) are taken. ``n_rollouts`` None means the group's
    declared ``prompt_group_size``; for an inferred group, all its trajectories once its window closed.
    Rows come in batch order: group, then trajectory id.
    """
    match = _and(filter_clauses)
    grouped = _and(["prompt_group_id IS NOT NULL", _KEPT, *_partition("prompt_group_id", scope)])
    per_trajectory = (
        "SELECT prompt_group_id, trajectory_id, min(created_at_ms) AS first_at, max(ingested_at) AS last_at, "
        f"{_GROUP_FACTS.format(size='declared')}, "
        "max(toUInt8(terminal)) = 1 "
        "AND uniqExact(step_index) = count() AND max(step_index) - min(step_index) + 1 = count() "
        f"AND min(ifNull({match}, 0)) = 1 "
        f"AND countIf(({_NOT_COMMITTED}) = 0 OR ({_NOT_IN_FLIGHT}) = 0) = 0 "
        f"AND max(ingested_at) >= {_AFTER_FLOOR} AS usable "
        f"FROM {STEPS_VIEW} WHERE {grouped} GROUP BY prompt_group_id, trajectory_id"
    )
    group = "OVER (PARTITION BY prompt_group_id)"
    closed = _CLOSED.format(closes_at=f"max(closes_at) {group}")
    size = (f"if(max(inferred) {group} = 1, if({closed}, count() {group}, 0), "
            f"toUInt64(greatest(max(declared) {group}, 0)))")
    counted = (
        f"SELECT *, min(first_at) {group} AS group_first_at, countIf(usable) {group} AS usable_in_group, "
        f"if({{c_n:UInt64}} = 0, {size}, {{c_n:UInt64}}) AS wanted "
        f"FROM ({per_trajectory})"
    )
    ranked = (
        "SELECT prompt_group_id, trajectory_id, "
        "row_number() OVER (PARTITION BY prompt_group_id ORDER BY last_at, trajectory_id) AS _nth, "
        "dense_rank() OVER (ORDER BY group_first_at, prompt_group_id) AS _group_rank, wanted "
        f"FROM ({counted}) WHERE usable AND wanted > 0 AND usable_in_group >= wanted"
    )
    sql = (
        f"SELECT prompt_group_id, trajectory_id FROM ({ranked}) "
        "WHERE _nth <= wanted AND _group_rank <= {c_batch:UInt64} ORDER BY _group_rank, trajectory_id"
    )
    return sql, {**scope.params(), "c_n": n_rollouts or 0, "c_batch": batch_size}


def trajectories_sql(select: str) -> str:
    """Every kept step of the given trajectories, in the order the ids are listed, then by step index."""
    return (
        f"SELECT {select} FROM {STEPS_VIEW} "
        f"WHERE trajectory_id IN {{c_trajectories:Array(String)}} AND {_KEPT} "
        "ORDER BY indexOf({c_trajectories:Array(String)}, trajectory_id), step_index"
    )


POSITION_SQL = (
    "SELECT argMax(epoch, set_at_ns) AS epoch, argMax(floor_ms, set_at_ns) AS floor_ms, "
    f"toUnixTimestamp64Milli(now64(3)) AS now_ms FROM {POSITIONS_TABLE} WHERE group_name = {{group:String}}"
)
"""The group's current epoch and floor (a group never sought reads ('', 0): epoch zero, from the start),
and the pool's clock (the delivery log's positions are stamped by it)."""

CURSOR_SQL = (
    "SELECT count() AS cursors, argMax(logged_at_ms, set_at_ns) AS at_ms, "
    "argMax(step_id, set_at_ns) AS step_id, argMax(step_version, set_at_ns) AS step_version, "
    "argMax(checked_ms, set_at_ns) AS checked_ms "
    f"FROM {CURSORS_TABLE} WHERE group_name = {{group:String}} "
    "AND epoch = {epoch:String} AND member = {member:UInt32} AND members = {members:UInt32} "
    "AND filters_key = {filters:String}"
)
"""A member's cursor in an epoch of its group, under its filters (``cursors`` 0: none yet), and its checked
time then (0: unknown)."""

LATEST_FLOOR_SQL = f"SELECT toUnixTimestamp64Milli(max(ingested_at)) + 1 AS floor_ms FROM {STEPS_VIEW}"
"""Just past the newest step version in the pool: ``seek('latest')`` skips everything there now."""

PRESETS_SQL = (
    f"SELECT name, argMax(filters_json, saved_at_ns) AS filters_json FROM {PRESETS_TABLE} "
    "WHERE empty({names:Array(String)}) OR has({names:Array(String)}, name) GROUP BY name ORDER BY name"
)
