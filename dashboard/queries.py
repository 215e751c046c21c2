"""The dashboard's SQL: one named statement per panel, over the pool's views (docs/pool.md).

Every statement reads views that already apply ``FINAL`` (``steps``, ``feedback``, ``dead_letters``,
``prefix_savings``...), so a step counts once at its newest version. Times leave ClickHouse as epoch
milliseconds, the unit of the wire format. User input only ever reaches a statement through
``{name:Type}`` placeholders bound by the driver; the few statements built in Python
(``steps_page_sql``) assemble fixed fragments chosen from a whitelist, never user text.
Each statement answers an empty pool with no rows or with zero/NULL aggregates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clawr1.pool.consumer_tables import COMMITS_TABLE, POSITIONS_TABLE

# --- collection ------------------------------------------------------------------------------------

SOURCES_SQL = """
SELECT source_kind, source_name, count() AS steps, countIf(status = 'failed') AS failed,
       avg(latency_ms) AS mean_latency_ms,
       toUnixTimestamp64Milli(max(created_at_ms)) AS last_step_ms
FROM steps
GROUP BY source_kind, source_name
ORDER BY source_kind, source_name
"""

TIME_RANGE_SQL = """
SELECT count() AS steps,
       toUnixTimestamp64Milli(min(created_at_ms)) AS first_ms,
       toUnixTimestamp64Milli(max(created_at_ms)) AS last_ms
FROM steps
"""

TIMELINE_SQL = """
SELECT intDiv(toUnixTimestamp64Milli(created_at_ms), {bucket_ms:Int64}) * {bucket_ms:Int64}
           AS bucket_start_ms,
       source_kind, source_name, count() AS steps, countIf(status = 'failed') AS failed
FROM steps
WHERE created_at_ms >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
GROUP BY bucket_start_ms, source_kind, source_name
ORDER BY bucket_start_ms, source_kind, source_name
"""
"""Steps per time bucket and source, from ``since_ms`` (a bucket boundary) on."""

ENGINES_SQL = """
SELECT engine, count() AS steps, countIf(status = 'failed') AS failed,
       countIf(created_at_ms >= now64(3) - INTERVAL 60 SECOND) AS last_minute,
       argMax(policy_version, created_at_ms) AS policy_version,
       toUnixTimestamp64Milli(max(created_at_ms)) AS last_step_ms
FROM steps
WHERE engine IS NOT NULL
GROUP BY engine
ORDER BY engine
"""
"""The serving engines as the pool knows them (``engine``: the proxy's, per captured step)."""

RECENT_FAILURES_SQL = """
SELECT step_id, trajectory_id, source_kind, source_name, model, error,
       toUnixTimestamp64Milli(created_at_ms) AS created_ms
FROM steps
WHERE status = 'failed'
ORDER BY created_ms DESC, step_id
LIMIT {limit:UInt32}
"""

# --- representation --------------------------------------------------------------------------------

TRAJECTORY_TOTALS_SQL = """
SELECT count() AS trajectories, sum(num_steps) AS steps, avg(num_steps) AS mean_steps,
       max(num_steps) AS max_steps, countIf(terminal = 1) AS terminal_trajectories,
       countIf(all_ready = 1) AS ready_trajectories
FROM trajectories
"""

STEPS_PER_TRAJECTORY_SQL = """
SELECT num_steps, count() AS trajectories
FROM trajectories
GROUP BY num_steps
ORDER BY num_steps
LIMIT {limit:UInt32}
"""

PROVENANCE_SQL = """
SELECT token_provenance, count() AS steps,
       sum(length(prompt_token_ids)) AS prompt_tokens, sum(length(response_token_ids)) AS response_tokens
FROM steps
GROUP BY token_provenance
ORDER BY token_provenance
"""

_REAL_GROUPS = "prompt_group_id IN (SELECT prompt_group_id FROM steps WHERE prompt_group_id IS NOT NULL)"
# The prompt_groups view's WHERE sees its own assumeNotNull alias, so steps without a group show up there
# as a group named ''; keeping only ids that some step really carries reads the same before and after
# the view is fixed.

PROMPT_GROUP_TOTALS_SQL = f"""
SELECT (SELECT count() FROM prompt_groups WHERE {_REAL_GROUPS}) AS groups,
       (SELECT countIf(ifNull(num_trajectories >= group_size, 0)) FROM prompt_groups WHERE {_REAL_GROUPS})
           AS complete,
       (SELECT countIf(prompt_group_id IS NULL) FROM steps) AS ungrouped_steps
"""
"""``complete``: groups holding at least as many trajectories as their declared size."""

PROMPT_GROUPS_SQL = f"""
SELECT prompt_group_id, group_size, num_trajectories, num_steps, distinct_prompts,
       mean_reward, reward_std, final_rewards, all_ready,
       toUnixTimestamp64Milli(started_at) AS started_at_ms
FROM prompt_groups
WHERE {_REAL_GROUPS}
ORDER BY started_at DESC, prompt_group_id
LIMIT {{limit:UInt32}}
"""

# --- curation --------------------------------------------------------------------------------------

CURATION_TOTALS_SQL = """
SELECT count() AS steps, countIf(ready = 1) AS ready_steps,
       countIf(reward_status = 'final') AS reward_final, countIf(reward_status = 'pending') AS reward_pending,
       countIf(reward IS NOT NULL) AS rewarded, countIf(status = 'failed') AS failed,
       countIf(quality_score IS NOT NULL) AS scored, avg(quality_score) AS mean_quality_score
FROM steps
"""

REWARD_BY_VERSION_SQL = """
SELECT policy_version, count() AS steps, countIf(reward IS NOT NULL) AS rewarded,
       countIf(reward_status = 'final') AS final_rewards, countIf(ready = 1) AS ready_steps,
       avg(reward) AS mean_reward, min(reward) AS min_reward, max(reward) AS max_reward
FROM steps
GROUP BY policy_version
ORDER BY policy_version
"""
"""One row per policy version; steps without a version form the NULL row, sorted last."""

REWARD_RANGE_SQL = "SELECT min(reward) AS low, max(reward) AS high FROM steps"

REWARD_HISTOGRAM_SQL = """
SELECT policy_version,
       toUInt32(greatest(0, least({bins:Int64} - 1,
           if({high:Float64} > {low:Float64},
              toInt64(floor((assumeNotNull(reward) - {low:Float64}) / ({high:Float64} - {low:Float64})
                            * {bins:Int64})),
              0)))) AS bin,
       count() AS steps
FROM steps
WHERE reward IS NOT NULL
GROUP BY policy_version, bin
ORDER BY policy_version, bin
"""
"""Rewards in ``bins`` equal bins over [low, high] (the bounds of ``REWARD_RANGE_SQL``, bound again so a
step landing between the two statements is clamped into the edge bins instead of shifting the bins)."""

QUALITY_LABELS_SQL = """
SELECT label, count() AS steps
FROM steps
ARRAY JOIN quality_labels AS label
GROUP BY label
ORDER BY steps DESC, label
LIMIT {limit:UInt32}
"""

FEEDBACK_SQL = """
SELECT source, target_kind, count() AS items, countIf(reward IS NOT NULL) AS rewards,
       countIf(final = 1) AS final_items, countIf(label IS NOT NULL) AS labelled,
       countIf(correction IS NOT NULL) AS corrections
FROM feedback
GROUP BY source, target_kind
ORDER BY source, target_kind
"""

DEAD_LETTER_TOTAL_SQL = "SELECT count() AS letters FROM dead_letters"

DEAD_LETTERS_SQL = """
SELECT stage, reason, count() AS letters,
       toUnixTimestamp64Milli(max(failed_at_ms)) AS last_failed_ms
FROM dead_letters
GROUP BY stage, reason
ORDER BY letters DESC, stage, reason
LIMIT {limit:UInt32}
"""

# --- optimization ----------------------------------------------------------------------------------

PREFIX_TOTALS_SQL = """
SELECT scope_kind, scopes, total_tokens, tree_tokens, saved_tokens, savings_ratio, forks
FROM prefix_savings_total
ORDER BY scope_kind
"""
"""One row per scope kind plus the ``all`` rollup row; no rows at all on an empty pool."""

PREFIX_SCOPES_SQL = """
SELECT scope_kind, scope_id, total_tokens, tree_tokens, saved_tokens, savings_ratio, forks, num_nodes,
       version
FROM prefix_savings
ORDER BY saved_tokens DESC, scope_id
LIMIT {limit:UInt32}
"""

# --- consumption -----------------------------------------------------------------------------------

_CURRENT_POSITIONS = f"""
    SELECT group_name, argMax(epoch, set_at_ns) AS epoch, argMax(floor_ms, set_at_ns) AS floor_ms,
           count() AS seeks
    FROM {POSITIONS_TABLE}
    GROUP BY group_name"""

_GROUPS = f"""
    SELECT g.group_name AS group_name, p.epoch AS epoch, p.floor_ms AS floor_ms, p.seeks AS seeks
    FROM (SELECT group_name FROM {COMMITS_TABLE} UNION DISTINCT SELECT group_name FROM {POSITIONS_TABLE}) AS g
    LEFT JOIN ({_CURRENT_POSITIONS}) AS p ON p.group_name = g.group_name"""
# A group never sought has no position row: the LEFT JOIN's defaults ('' and 0) are exactly the SDK's
# reading of such a group (epoch '', floor 0: from the start).

CONSUMER_GROUPS_SQL = f"""
WITH groups AS ({_GROUPS}),
committed AS (
    SELECT c.group_name AS group_name, uniqExact(c.step_id) AS committed,
           uniqExact(c.consumer_id) AS consumers,
           toUnixTimestamp64Milli(max(c.committed_at)) AS last_commit_ms
    FROM {COMMITS_TABLE} AS c
    INNER JOIN groups AS gr ON c.group_name = gr.group_name AND c.epoch = gr.epoch
    GROUP BY c.group_name),
behind AS (
    SELECT gr.group_name AS group_name, count() AS behind, countIf(s.ready = 1) AS behind_ready
    FROM groups AS gr
    CROSS JOIN (SELECT step_id, ingested_at, ready FROM steps) AS s
    WHERE s.ingested_at >= fromUnixTimestamp64Milli(gr.floor_ms, 'UTC')
      AND (gr.group_name, gr.epoch, s.step_id) NOT IN (SELECT group_name, epoch, step_id FROM {COMMITS_TABLE})
    GROUP BY gr.group_name)
SELECT gr.group_name AS group_name, gr.epoch AS epoch, gr.floor_ms AS floor_ms, gr.seeks AS seeks,
       c.committed AS committed, c.consumers AS consumers, c.last_commit_ms AS last_commit_ms,
       b.behind AS behind, b.behind_ready AS behind_ready
FROM groups AS gr
LEFT JOIN committed AS c ON c.group_name = gr.group_name
LEFT JOIN behind AS b ON b.group_name = gr.group_name
ORDER BY group_name
"""
"""Per consumer group: steps committed in its current epoch, and steps it has not taken yet (``behind``:
every step whose current version landed at or after the group's floor and that the current epoch has not
committed; ``behind_ready``: those of them that are ready). ``behind`` ignores the group's own filters,
which live in the trainer, so it is an upper bound of what the group's next polls can return."""

# --- latest steps and one step ---------------------------------------------------------------------

STEP_ROW_COLUMNS = """
    step_id, version, trajectory_id, step_index, prompt_group_id, source_kind, source_name, agent, model,
    policy_version, toUnixTimestamp64Milli(created_at_ms) AS created_ms,
    toUnixTimestamp64Milli(ingested_at) AS ingested_ms, latency_ms, status, reward, reward_status,
    ready, terminal, token_provenance, length(prompt_token_ids) AS prompt_tokens,
    length(response_token_ids) AS response_tokens, quality_labels, quality_score"""


@dataclass(frozen=True)
class StepFilter:
    """A filter the latest-steps table accepts: its column and the placeholder type it binds."""

    column: str
    ch_type: str


STEP_FILTERS: Mapping[str, StepFilter] = {
    "source_kind": StepFilter("source_kind", "String"),
    "source_name": StepFilter("source_name", "String"),
    "trajectory_id": StepFilter("trajectory_id", "String"),
    "prompt_group_id": StepFilter("prompt_group_id", "String"),
    "policy_version": StepFilter("policy_version", "Int64"),
    "status": StepFilter("status", "String"),
    "reward_status": StepFilter("reward_status", "String"),
    "token_provenance": StepFilter("token_provenance", "String"),
    "ready": StepFilter("ready", "UInt8"),
    "channel": StepFilter("channel", "String"),
    "engine": StepFilter("engine", "String"),
}


def steps_where(filters: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``WHERE`` text and bound values for equality filters on whitelisted columns (booleans bind as 0/1)."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    for name in sorted(filters):
        spec = STEP_FILTERS.get(name)
        if spec is None:
            raise ValueError(f"unknown step filter {name!r}; known: {', '.join(STEP_FILTERS)}")
        clauses.append(f"{spec.column} = {{f_{name}:{spec.ch_type}}}")
        value = filters[name]
        params[f"f_{name}"] = int(value) if isinstance(value, bool) else value
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def steps_page_sql(filters: Mapping[str, Any], limit: int, offset: int) -> tuple[str, dict[str, Any]]:
    """The newest steps first (by creation time), one page, with the filters applied."""
    where, params = steps_where(filters)
    sql = (
        f"SELECT {STEP_ROW_COLUMNS}\nFROM steps {where}\n"
        "ORDER BY created_at_ms DESC, trajectory_id, step_index DESC, step_id\n"
        "LIMIT {limit:UInt32} OFFSET {offset:UInt64}"
    )
    return sql, {**params, "limit": limit, "offset": offset}


def steps_count_sql(filters: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    where, params = steps_where(filters)
    return f"SELECT count() AS steps FROM steps {where}", params


STEP_DETAIL_SQL = f"""
SELECT {STEP_ROW_COLUMNS},
       parent_step_id, prompt_group_size, prompt_id, response_id, sampling_params_json,
       usage_prompt_tokens, usage_completion_tokens, prompt_messages, response_text, tool_calls_json,
       length(response_logprobs) AS logprob_count, arraySum(response_logprobs) AS logprob_sum,
       tokenizer, reward_components, reward_source, trajectory_reward, trajectory_reward_status,
       feedback_json, error, metadata_json, toUnixTimestamp64Milli(updated_at_ms) AS updated_ms,
       link_status, link_candidate_step_id, channel, response_token_ids, response_logprobs
FROM steps
WHERE step_id = {{step_id:String}}
"""

FEEDBACK_COLUMNS = """
    feedback_id, target_kind, target_id, reward, components, final, source, source_name, label, comment,
    correction, toUnixTimestamp64Milli(received_at_ms) AS received_ms"""

STEP_FEEDBACK_SQL = f"""
SELECT {FEEDBACK_COLUMNS}
FROM feedback
WHERE (target_kind = 'step' AND target_id = {{step_id:String}})
   OR (target_kind = 'response' AND target_id = {{response_id:String}})
   OR (target_kind = 'trajectory' AND target_id = {{trajectory_id:String}})
ORDER BY received_at_ms, feedback_id
"""
"""Every feedback record aimed at the step, at its response or at its whole trajectory."""

TRAJECTORY_STEPS_SQL = """
SELECT step_id, step_index, status, reward, reward_status, ready
FROM steps
WHERE trajectory_id = {trajectory_id:String}
ORDER BY step_index, step_id
LIMIT {limit:UInt32}
"""

TRAJECTORY_TURNS_SQL = f"""
SELECT {STEP_ROW_COLUMNS},
       parent_step_id, prompt_group_size, prompt_id, response_id, error, reward_components, reward_source,
       trajectory_reward, trajectory_reward_status, tokenizer, link_status, link_candidate_step_id, channel,
       prompt_messages, response_text, tool_calls_json, prompt_token_ids, response_token_ids
FROM steps
WHERE trajectory_id = {{trajectory_id:String}}
ORDER BY step_index, created_at_ms, step_id
LIMIT {{limit:UInt32}}
"""
"""A trajectory's steps in conversation order, with their text and token ids (the trajectory view)."""

TRAJECTORY_FEEDBACK_SQL = f"""
SELECT {FEEDBACK_COLUMNS}
FROM feedback
WHERE (target_kind = 'trajectory' AND target_id = {{trajectory_id:String}})
   OR (target_kind = 'step' AND target_id IN {{step_ids:Array(String)}})
   OR (target_kind = 'response' AND target_id IN {{response_ids:Array(String)}})
ORDER BY received_at_ms, feedback_id
LIMIT {{limit:UInt32}}
"""
"""Feedback aimed at a trajectory, at any of its steps or at their responses."""

GROUP_TRAJECTORIES_SQL = """
SELECT trajectory_id, count() AS num_steps, sum(reward) AS reward_sum,
       max(trajectory_reward) AS trajectory_reward, countIf(status = 'failed') AS failed,
       min(ready) AS all_ready, max(terminal) AS terminal,
       max(policy_version) AS policy_version, toUnixTimestamp64Milli(min(created_at_ms)) AS started_ms,
       argMax(response_text, step_index) AS last_response, argMin(prompt_messages, step_index) AS first_prompt
FROM steps
WHERE prompt_group_id = {prompt_group_id:String}
GROUP BY trajectory_id
ORDER BY started_ms, trajectory_id
LIMIT {limit:UInt32}
"""
"""A prompt group's trajectories (its rollouts) side by side: rewards, readiness, the final reply."""

STEP_PREFIX_SCOPES_SQL = """
SELECT scope_kind, scope_id, total_tokens, tree_tokens, saved_tokens, savings_ratio, forks, num_nodes
FROM prefix_savings
WHERE (scope_kind, scope_id) IN (
    SELECT scope_kind, scope_id FROM prefix_nodes WHERE has(step_ids, {step_id:String}))
ORDER BY scope_kind, scope_id
"""
"""The prefix-merge scopes whose tree holds the step."""

# --- curation, tree view, live pulse -----------------------------------------------------------------


def curate_ids_sql(filters: Mapping[str, Any], limit: int) -> tuple[str, dict[str, Any]]:
    """The ids of the steps a whole-filter curation reaches (one more than ``limit``, to see an overflow)."""
    where, params = steps_where(filters)
    return f"SELECT step_id FROM steps {where}\nORDER BY step_id\nLIMIT {{limit:UInt32}}", {
        **params, "limit": limit + 1}


SCOPE_NODES_SQL = """
SELECT node_id, parent_node_id, depth_start, token_ids, step_ids
FROM prefix_nodes
WHERE scope_kind = {scope_kind:String} AND scope_id = {scope_id:String}
ORDER BY depth_start, node_id
LIMIT {limit:UInt32}
"""
"""The nodes of a scope's tree, each at its newest version (a node keeps the version it last changed in)."""

SCOPE_STEPS_SQL = """
SELECT step_id, parent_step_id, prompt_token_ids, response_token_ids
FROM steps
WHERE if({scope_kind:String} = 'prompt_group', prompt_group_id = {scope_id:String},
         trajectory_id = {scope_id:String} AND prompt_group_id IS NULL)
  AND status = 'ok' AND token_provenance != 'none' AND link_status != 'superseded'
ORDER BY trajectory_id, step_index, step_id
LIMIT {limit:UInt32}
"""
"""The steps merged into a scope (``clawr1.streams.join.scope_of`` and ``mergeable``)."""

SCOPE_SAVINGS_SQL = """
SELECT scope_kind, scope_id, total_tokens, tree_tokens, saved_tokens, savings_ratio, forks, num_nodes
FROM prefix_savings
WHERE scope_kind = {scope_kind:String} AND scope_id = {scope_id:String}
"""

PULSE_SQL = f"""
SELECT (SELECT count() FROM steps) AS steps,
       (SELECT toUnixTimestamp64Milli(max(updated_at_ms)) FROM steps) AS last_update_ms,
       (SELECT count() FROM feedback) AS feedback,
       (SELECT count() FROM {COMMITS_TABLE}) AS commits
"""
"""What changes when anything arrives: the live stream pushes a pulse when this row changes."""

POLICY_DRIFT_SQL = f"""
SELECT policy_version, count() AS steps, countIf(ready = 1) AS ready_steps,
       countIf(step_id IN (SELECT step_id FROM {COMMITS_TABLE})) AS consumed,
       toUnixTimestamp64Milli(min(created_at_ms)) AS first_ms,
       toUnixTimestamp64Milli(max(created_at_ms)) AS last_ms
FROM steps
WHERE policy_version IS NOT NULL
GROUP BY policy_version
ORDER BY policy_version
"""
"""Per policy version: how much was collected, became ready and was consumed (by any group)."""
