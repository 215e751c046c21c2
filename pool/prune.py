"""``clawr1 prune``: delete step data by age, policy version or channel, and what hangs on it.

A step is pruned whole (every version) when its newest version (the ``steps`` view) matches every filter
given: it landed in the pool longer ago than ``older_than_s`` (``ingested_at``, the pool's clock), its
``policy_version`` is below ``policy_version_below`` (a step without one never is), its ``channel`` is
``channel``. With the steps go, so that nothing points at what is gone:

- their delivery-log entries and the consumer groups' commits of them;
- feedback on them: on a pruned step; on a response no step left holds; on a trajectory none of whose
  steps is left;
- prefix trees (``prefix_node_versions``) of the scopes (trajectory or prompt group) none of whose steps
  is left (a scope that keeps some steps keeps its whole tree);
- the id lookup's rows of trajectories none of whose steps is left.

The keys are chosen once, into ``prune_keys``, before anything is deleted; every deletion then reads
them, not the steps (a deletion whose subquery read the steps would see them change while the engine
rewrites their parts one by one). Deletions are lightweight ``DELETE``s: the log first, so no consumer
is handed a step from the log's payload copy once the step is gone, then the steps, then what hangs on them.
A version of a pruned step that lands after the keys were chosen stays (the step is back with it).

The SQL builders are pure; ``prune`` is the adapter. On the embedded pool ``clawr1 prune`` opens the pool
itself, so the stack that owns it must be stopped (chDB locks its directory); on a ClickHouse server it
runs beside the stack. Not on a cluster (``CLAWR1_CLICKHOUSE_CLUSTER``): its deletions would have to run on
every node's local tables.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from clawr1.pool.consumer_tables import COMMITS_TABLE
from clawr1.pool.migrations import DELIVERY_LOG, PRUNE_KEYS, STEP_LOOKUP

KEY_KINDS: tuple[str, ...] = ("step", "trajectory", "prompt_group", "response")
"""What ``prune_keys`` holds for one prune: the steps it deletes, and the trajectories, prompt groups and
response ids it leaves without any step."""

_GONE_BY: dict[str, str] = {"trajectory": "trajectory_id", "prompt_group": "prompt_group_id",
                            "response": "response_id"}

# In the order they are deleted: the log before the steps (a consumer reads the log first), the steps
# before the rows that hang on them.
TABLES: tuple[str, ...] = (DELIVERY_LOG, "step_versions", COMMITS_TABLE, "feedback_log",
                           "prefix_node_versions", STEP_LOOKUP)

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class PruneError(ValueError):
    """A prune that cannot run as asked; the message says why."""


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    match = _AGE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise PruneError(f"an age is a positive number and a unit (s, m, h, d, w), e.g. 30d; not {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True)
class PruneFilter:
    """Which steps to prune: those matching every filter given (at least one)."""

    older_than_s: float | None = None
    policy_version_below: int | None = None
    channel: str | None = None

    def condition(self) -> tuple[str, dict[str, Any]]:
        """A 0/1 expression over the ``steps`` view (1: prune the step), and its parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if self.older_than_s is not None:
            if self.older_than_s <= 0:
                raise PruneError(f"the age must be positive, not {self.older_than_s} s")
            clauses.append("ingested_at < now64(3) - toIntervalMillisecond({p_age_ms:UInt64})")
            params["p_age_ms"] = round(self.older_than_s * 1000)
        if self.policy_version_below is not None:
            clauses.append("policy_version < {p_policy:Int64}")
            params["p_policy"] = self.policy_version_below
        if self.channel is not None:
            if not self.channel:
                raise PruneError("the channel must not be empty")
            clauses.append("channel = {p_channel:String}")
            params["p_channel"] = self.channel
        if not clauses:
            raise PruneError("prune needs a filter: --older-than, --policy-version-below or --channel "
                             "(it never deletes everything)")
        return f"ifNull({' AND '.join(clauses)}, 0)", params


def chosen_keys_sql(kind: str, matched: str) -> str:
    """``(trajectory_id, id)`` of one kind of key, chosen from the pool as it is now: the steps ``matched``
    holds for, and the trajectories, prompt groups and response ids all of whose steps are among them."""
    if kind == "step":
        return f"SELECT trajectory_id, step_id AS id FROM steps WHERE {matched}"
    if kind not in _GONE_BY:
        raise ValueError(f"no key kind {kind!r}; kinds: {KEY_KINDS}")
    column = _GONE_BY[kind]
    gone = (f"SELECT assumeNotNull({column}) AS id FROM steps "
            f"WHERE {column} IN (SELECT {column} FROM steps WHERE {matched} AND {column} != '') "
            f"GROUP BY {column} HAVING min({matched}) = 1")
    trajectory = "id" if kind == "trajectory" else "''"
    return f"SELECT {trajectory} AS trajectory_id, id FROM ({gone})"


def stored_keys_sql(kind: str) -> str:
    """``(trajectory_id, id)`` of one kind of key of the prune ``{p_id:String}``, from ``prune_keys``."""
    return f"SELECT trajectory_id, id FROM {PRUNE_KEYS} WHERE prune_id = {{p_id:String}} AND kind = '{kind}'"


def fill_keys_sql(matched: str) -> str:
    """Every key of the prune ``{p_id:String}`` into ``prune_keys``, in one statement (one ``now``)."""
    selects = " UNION ALL ".join(f"SELECT '{kind}' AS kind, trajectory_id, id FROM "
                                 f"({chosen_keys_sql(kind, matched)})" for kind in KEY_KINDS)
    return (f"INSERT INTO {PRUNE_KEYS} (prune_id, kind, trajectory_id, id) "
            f"SELECT {{p_id:String}}, kind, trajectory_id, id FROM ({selects})")


def doomed_sql(table: str, keys: Callable[[str], str]) -> str:
    """The condition on ``table``'s rows that a prune deletes, given each kind's ``keys`` query."""
    def ids(kind: str) -> str:
        return f"(SELECT id FROM ({keys(kind)}))"

    if table in ("step_versions", DELIVERY_LOG):
        return f"(trajectory_id, step_id) IN ({keys('step')})"
    if table == COMMITS_TABLE:
        return f"step_id IN {ids('step')}"
    if table == "feedback_log":
        return (f"(target_kind = 'step' AND target_id IN {ids('step')}) OR (target_kind = 'response' AND "
                f"target_id IN {ids('response')}) OR (target_kind = 'trajectory' AND target_id IN "
                f"{ids('trajectory')})")
    if table == "prefix_node_versions":
        return (f"(scope_kind = 'trajectory' AND scope_id IN {ids('trajectory')}) OR "
                f"(scope_kind = 'prompt_group' AND scope_id IN {ids('prompt_group')})")
    if table == STEP_LOOKUP:
        return f"trajectory_id IN {ids('trajectory')}"
    raise ValueError(f"prune does not delete from {table!r}")


def count_sql(keys: Callable[[str], str]) -> str:
    """One row: for each table, how many of its rows the prune deletes."""
    return "SELECT " + ", ".join(f"(SELECT count() FROM {table} WHERE {doomed_sql(table, keys)}) AS {table}"
                                 for table in TABLES)


def delete_sql(table: str) -> str:
    return f"DELETE FROM {table} WHERE {doomed_sql(table, stored_keys_sql)}"


class PruneStore(Protocol):
    cluster: str

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> Any: ...

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None,
              settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...


def prune(store: PruneStore, where: PruneFilter, dry_run: bool = False) -> dict[str, int]:
    """Delete the steps ``where`` chooses and what hangs on them; returns the rows deleted per table
    (with ``dry_run``, the rows it would delete, and nothing is deleted)."""
    matched, params = where.condition()
    if store.cluster:
        raise PruneError(f"prune does not run on a ClickHouse cluster ({store.cluster!r}) yet; use the "
                         "TTLs (CLAWR1_POOL_STEP_TTL_DAYS), or DELETE on every node's local tables")
    if dry_run:
        counts = store.query(count_sql(lambda kind: chosen_keys_sql(kind, matched)), parameters=params)[0]
        return {table: int(counts[table]) for table in TABLES}
    params = {**params, "p_id": uuid.uuid4().hex}
    store.command(fill_keys_sql(matched), parameters=params)
    counts = store.query(count_sql(stored_keys_sql), parameters=params)[0]
    for table in TABLES:
        if counts[table]:
            store.command(delete_sql(table), parameters=params)
    store.command(f"DELETE FROM {PRUNE_KEYS} WHERE prune_id = {{p_id:String}}", parameters=params)
    return {table: int(counts[table]) for table in TABLES}


def report(counts: Mapping[str, int], dry_run: bool) -> str:
    """``clawr1 prune``'s answer: the rows each table lost (or would lose)."""
    head = "dry run, nothing deleted; rows a prune would delete:" if dry_run else "rows deleted:"
    width = max(len(table) for table in counts)
    return "\n".join([head, *(f"  {table:<{width}}  {n}" for table, n in counts.items())])
