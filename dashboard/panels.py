"""The dashboard's data: runs ``clawr1.dashboard.queries`` on a pool store, shapes the JSON each panel draws.

The shaping is a set of small pure functions (bucket widths, zero-filled time series, histogram edges,
JSON-safe values) so that the numbers a panel shows can be checked without a browser. The pool is read
through ``PoolStore`` only, so the same code serves an embedded chDB pool and a ClickHouse server.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clawr1.dashboard import queries as q
from clawr1.dashboard.conversation import feedback_by_target, trajectory_totals, turns
from clawr1.dashboard.curation import scope_tree
from clawr1.dashboard.decoding import TokenDecoder
from clawr1.pool.store import PoolStore
from clawr1.proxy.engine_files import snapshot

CHANNELS: Mapping[str, str] = {
    "blackbox_agent": "proxy",
    "whitebox_agent": "gateway",
    "blackbox_service": "service",
    "otel": "otel",
}
"""How each source kind reaches the pool: black-box agents through the proxy, white-box agents and
black-box services through the gateway's step and event routes, OpenTelemetry GenAI spans through
its OTLP routes."""

PROVENANCE_KINDS: tuple[str, ...] = ("engine", "retokenized", "none")

_SECOND = 1000
BUCKET_WIDTHS_MS: tuple[int, ...] = tuple(
    s * _SECOND for s in (1, 5, 10, 30, 60, 300, 900, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
)
MAX_BUCKETS = 60
REWARD_BINS = 10
LIST_LIMIT = 20
DEAD_LETTER_REASONS = 50
STEPS_PER_TRAJECTORY_ROWS = 200
TRAJECTORY_STEP_ROWS = 500
TREE_NODES = 500
TREE_STEPS = 64
TRAJECTORY_TURNS = 200
TRAJECTORY_FEEDBACK_ROWS = 2000
GROUP_TRAJECTORIES = 256
JSON_COLUMNS: Mapping[str, str] = {
    "prompt_messages": "prompt_messages",
    "tool_calls_json": "tool_calls",
    "sampling_params_json": "sampling_params",
    "feedback_json": "feedback",
    "metadata_json": "metadata",
}
"""The pool's JSON text columns and the key each is shown under, parsed."""


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (ClickHouse's avg of nothing is NaN; JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def bucket_width_ms(span_ms: int, max_buckets: int = MAX_BUCKETS) -> int:
    """The smallest round width that covers ``span_ms`` in at most ``max_buckets`` buckets (the widest
    round width when none does: the timeline then shows the newest ``max_buckets`` buckets)."""
    for width in BUCKET_WIDTHS_MS:
        if span_ms // width + 1 <= max_buckets:
            return width
    return BUCKET_WIDTHS_MS[-1]


def timeline_window(first_ms: int, last_ms: int, max_buckets: int = MAX_BUCKETS) -> tuple[int, int, int]:
    """``(width, since, count)``: bucket width, start of the first bucket shown and how many buckets,
    ending with the bucket of the newest step."""
    width = bucket_width_ms(max(0, last_ms - first_ms), max_buckets)
    last_bucket = last_ms // width * width
    count = min(max_buckets, (last_bucket - first_ms // width * width) // width + 1)
    return width, last_bucket - (count - 1) * width, count


def fill_timeline(
    rows: Iterable[Mapping[str, Any]], since_ms: int, width_ms: int, count: int
) -> dict[str, Any]:
    """Zero-filled series over ``count`` buckets: one per source (kind, name) and one per source kind."""
    buckets = [since_ms + i * width_ms for i in range(count)]
    by_source: dict[tuple[str, str], dict[str, list[int]]] = {}
    by_kind: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        index = (int(row["bucket_start_ms"]) - since_ms) // width_ms
        if not 0 <= index < count:
            continue
        for series in (
            by_source.setdefault((row["source_kind"], row["source_name"]), _empty_series(count)),
            by_kind.setdefault(row["source_kind"], _empty_series(count)),
        ):
            series["steps"][index] += int(row["steps"])
            series["failed"][index] += int(row["failed"])
    return {
        "bucket_ms": width_ms,
        "buckets": buckets,
        "by_kind": [
            {"source_kind": kind, "channel": channel_of(kind), **series}
            for kind, series in sorted(by_kind.items())
        ],
        "by_source": [
            {"source_kind": kind, "source_name": name, **series}
            for (kind, name), series in sorted(by_source.items())
        ],
    }


def _empty_series(count: int) -> dict[str, list[int]]:
    return {"steps": [0] * count, "failed": [0] * count}


def channel_of(source_kind: str) -> str:
    return CHANNELS.get(source_kind, "other")


def channel_totals(sources: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Steps and failed calls per ingest channel (proxy, gateway, service), every channel listed."""
    names = dict.fromkeys([*CHANNELS.values(), *(channel_of(row["source_kind"]) for row in sources)])
    totals: dict[str, dict[str, Any]] = {name: {"channel": name, "steps": 0, "failed": 0} for name in names}
    for row in sources:
        entry = totals[channel_of(row["source_kind"])]
        entry["steps"] += int(row["steps"])
        entry["failed"] += int(row["failed"])
    return list(totals.values())


def provenance_mix(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Steps and tokens per token provenance; the three known kinds always listed, others after them."""
    found = {row["token_provenance"]: dict(row) for row in rows}
    empty = {"steps": 0, "prompt_tokens": 0, "response_tokens": 0}
    ordered = [*PROVENANCE_KINDS, *sorted(set(found) - set(PROVENANCE_KINDS))]
    return [found.get(kind, {"token_provenance": kind, **empty}) for kind in ordered]


def histogram_edges(low: float, high: float, bins: int) -> list[float]:
    """``bins + 1`` edges of equal bins over [low, high] (one bin of width zero when low == high)."""
    if high <= low:
        return [low] * bins + [high]
    step = (high - low) / bins
    return [low + i * step for i in range(bins)] + [high]


def reward_histogram(
    rows: Iterable[Mapping[str, Any]], low: float | None, high: float | None, bins: int
) -> dict[str, Any]:
    """Per policy version, the count of rewarded steps in each bin (a version with no rewards is absent)."""
    if low is None or high is None:
        return {"low": None, "high": None, "bins": bins, "edges": [], "versions": []}
    versions: dict[Any, list[int]] = {}
    for row in rows:
        versions.setdefault(row["policy_version"], [0] * bins)[int(row["bin"])] += int(row["steps"])
    return {
        "low": low,
        "high": high,
        "bins": bins,
        "edges": histogram_edges(low, high, bins),
        "versions": [{"policy_version": version, "counts": counts} for version, counts in versions.items()],
    }


def prefix_overall(totals: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``all`` rollup row of ``prefix_savings_total``, or zeros when nothing was merged yet."""
    for row in totals:
        if row["scope_kind"] == "all":
            return dict(row)
    return {
        "scope_kind": "all",
        "scopes": 0,
        "total_tokens": 0,
        "tree_tokens": 0,
        "saved_tokens": 0,
        "savings_ratio": 1.0,
        "forks": 0,
    }


def engine_rows(pooled: Sequence[Mapping[str, Any]], live: Sequence[Mapping[str, Any]]
                ) -> list[dict[str, Any]]:
    """Each engine: what the proxy holds now (state, calls in flight, its policy version), where the
    dashboard can read it (the stack's data dir), beside what the pool holds (steps, calls/s over the
    last minute, the newest step's policy version). An engine the proxy lists that served nothing yet is
    there too."""
    by_engine: dict[str, dict[str, Any]] = {}
    for row in pooled:
        by_engine[row["engine"]] = {"engine": row["engine"], "state": None, "in_flight": None,
                                    "steps": row["steps"], "failed": row["failed"],
                                    "calls_per_s": round(row["last_minute"] / 60, 2),
                                    "policy_version": row["policy_version"],
                                    "last_step_ms": row["last_step_ms"]}
    for row in live:
        known = by_engine.setdefault(row["engine"], {
            "engine": row["engine"], "steps": 0, "failed": 0, "calls_per_s": 0.0, "policy_version": None,
            "last_step_ms": None})
        known.update(state=row.get("state"), in_flight=row.get("in_flight"))
        if row.get("policy_version") is not None:
            known["policy_version"] = row["policy_version"]
    return [by_engine[engine] for engine in sorted(by_engine)]


def consumer_group(row: Mapping[str, Any]) -> dict[str, Any]:
    """A group's row with "never" as ``None`` (the LEFT JOINs yield 0 for a group without commits)."""
    return {**row, "last_commit_ms": row["last_commit_ms"] or None}


def parse_json_text(text: str) -> Any:
    """A JSON column's value, or the text itself when it is not JSON (shown as captured, never dropped)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def parse_json_columns(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each JSON text column it holds parsed, under its shown name (``JSON_COLUMNS``)."""
    for column, key in JSON_COLUMNS.items():
        if column in row:
            row[key] = parse_json_text(row.pop(column))
    return row


class Dashboard:
    """Reads the panels from one pool store; every method is one consistent unit the API serves."""

    def __init__(self, store: PoolStore, decoder: TokenDecoder | None = None,
                 engines_dir: Path | None = None) -> None:
        self.store = store
        self.decoder = decoder
        """The tokenizer the trajectory view decodes ids with (``clawr1.dashboard.decoding``), if any."""
        self.engines_dir = engines_dir
        """Where the proxy's processes write their engine tables (``clawr1.proxy.engine_files``), when
        the dashboard shares the stack's data dir."""

    def _rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        return self.store.query(sql, parameters=params or None)

    def _one(self, sql: str, **params: Any) -> dict[str, Any]:
        return self._rows(sql, **params)[0]

    def summary(self) -> dict[str, Any]:
        body = {
            "generated_ms": int(time.time() * 1000),
            "collection": self.collection(),
            "representation": self.representation(),
            "curation": self.curation(),
            "optimization": self.optimization(),
            "consumption": self.consumption(),
        }
        body["totals"] = _headline(body)
        return json_safe(body)

    def collection(self) -> dict[str, Any]:
        sources = self._rows(q.SOURCES_SQL)
        span = self._one(q.TIME_RANGE_SQL)
        if span["steps"]:
            width, since, count = timeline_window(span["first_ms"], span["last_ms"])
            rows = self._rows(q.TIMELINE_SQL, bucket_ms=width, since_ms=since)
        else:
            width, since, count, rows = BUCKET_WIDTHS_MS[0], 0, 0, []
        return {
            "channels": channel_totals(sources),
            "sources": [{**row, "channel": channel_of(row["source_kind"])} for row in sources],
            "first_step_ms": span["first_ms"] if span["steps"] else None,
            "last_step_ms": span["last_ms"] if span["steps"] else None,
            "timeline": fill_timeline(rows, since, width, count),
            "recent_failures": self._rows(q.RECENT_FAILURES_SQL, limit=LIST_LIMIT),
            "engines": engine_rows(self._rows(q.ENGINES_SQL),
                                   snapshot(self.engines_dir) if self.engines_dir is not None else []),
        }

    def representation(self) -> dict[str, Any]:
        return {
            "trajectories": self._one(q.TRAJECTORY_TOTALS_SQL),
            "steps_per_trajectory": self._rows(q.STEPS_PER_TRAJECTORY_SQL, limit=STEPS_PER_TRAJECTORY_ROWS),
            "provenance": provenance_mix(self._rows(q.PROVENANCE_SQL)),
            "prompt_groups": {
                **self._one(q.PROMPT_GROUP_TOTALS_SQL),
                "latest": self._rows(q.PROMPT_GROUPS_SQL, limit=LIST_LIMIT),
            },
        }

    def curation(self) -> dict[str, Any]:
        bounds = self._one(q.REWARD_RANGE_SQL)
        low, high = bounds["low"], bounds["high"]
        histogram_rows = (
            [] if low is None else self._rows(q.REWARD_HISTOGRAM_SQL, bins=REWARD_BINS, low=low, high=high)
        )
        return {
            "totals": self._one(q.CURATION_TOTALS_SQL),
            "reward_by_version": self._rows(q.REWARD_BY_VERSION_SQL),
            "reward_histogram": reward_histogram(histogram_rows, low, high, REWARD_BINS),
            "quality_labels": self._rows(q.QUALITY_LABELS_SQL, limit=LIST_LIMIT),
            "feedback": self._rows(q.FEEDBACK_SQL),
            "dead_letters": {
                "total": self._one(q.DEAD_LETTER_TOTAL_SQL)["letters"],
                "by_reason": self._rows(q.DEAD_LETTERS_SQL, limit=DEAD_LETTER_REASONS),
            },
        }

    def optimization(self) -> dict[str, Any]:
        totals = self._rows(q.PREFIX_TOTALS_SQL)
        return {
            "overall": prefix_overall(totals),
            "by_kind": [row for row in totals if row["scope_kind"] != "all"],
            "scopes": self._rows(q.PREFIX_SCOPES_SQL, limit=LIST_LIMIT),
        }

    def consumption(self) -> dict[str, Any]:
        return {"groups": [consumer_group(row) for row in self._rows(q.CONSUMER_GROUPS_SQL)],
                "policy_drift": self._rows(q.POLICY_DRIFT_SQL)}

    def pulse(self) -> dict[str, Any]:
        """The few figures that move whenever anything lands in the pool (the live stream's trigger)."""
        return json_safe(self._one(q.PULSE_SQL))

    def curate_ids(self, filters: Mapping[str, Any], limit: int) -> list[str]:
        """The steps a whole-filter curation reaches; ``ValueError`` when more than ``limit``."""
        sql, params = q.curate_ids_sql(filters, limit)
        ids = [row["step_id"] for row in self.store.query(sql, parameters=params)]
        if len(ids) > limit:
            raise ValueError(f"the filter matches more than {limit} steps: narrow it")
        return ids

    def tree(self, scope_kind: str, scope_id: str) -> dict[str, Any] | None:
        """One merge scope: savings, its stored tree and its steps packed as a trainer would."""
        found = self._rows(q.SCOPE_SAVINGS_SQL, scope_kind=scope_kind, scope_id=scope_id)
        if not found:
            return None
        nodes = self._rows(q.SCOPE_NODES_SQL, scope_kind=scope_kind, scope_id=scope_id, limit=TREE_NODES)
        steps = self._rows(q.SCOPE_STEPS_SQL, scope_kind=scope_kind, scope_id=scope_id, limit=TREE_STEPS)
        return json_safe({"scope": found[0], **scope_tree(nodes, steps)})

    def steps(self, filters: Mapping[str, Any], limit: int, offset: int) -> dict[str, Any]:
        page_sql, page_params = q.steps_page_sql(filters, limit, offset)
        count_sql, count_params = q.steps_count_sql(filters)
        return json_safe(
            {
                "total": self.store.query(count_sql, parameters=count_params)[0]["steps"],
                "limit": limit,
                "offset": offset,
                "steps": self.store.query(page_sql, parameters=page_params),
            }
        )

    def step(self, step_id: str) -> dict[str, Any] | None:
        """One step with its text, parsed JSON fields, feedback records, trajectory and merge scopes."""
        rows = self._rows(q.STEP_DETAIL_SQL, step_id=step_id)
        if not rows:
            return None
        step = parse_json_columns(rows[0])
        return json_safe(
            {
                "step": step,
                "feedback_records": self._rows(
                    q.STEP_FEEDBACK_SQL,
                    step_id=step_id,
                    response_id=step["response_id"],
                    trajectory_id=step["trajectory_id"],
                ),
                "trajectory_steps": self._rows(
                    q.TRAJECTORY_STEPS_SQL, trajectory_id=step["trajectory_id"], limit=TRAJECTORY_STEP_ROWS
                ),
                "prefix_scopes": self._rows(q.STEP_PREFIX_SCOPES_SQL, step_id=step_id),
            }
        )


    def trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        """A trajectory as its conversation (``clawr1.dashboard.conversation``): the first
        ``TRAJECTORY_TURNS`` steps with what each added, their replies, tokens, rewards and feedback."""
        rows = self._rows(q.TRAJECTORY_TURNS_SQL, trajectory_id=trajectory_id, limit=TRAJECTORY_TURNS + 1)
        if not rows:
            return None
        shown = [parse_json_columns(row) for row in rows[:TRAJECTORY_TURNS]]
        records = self._rows(q.TRAJECTORY_FEEDBACK_SQL, trajectory_id=trajectory_id,
                             step_ids=[row["step_id"] for row in shown],
                             response_ids=[row["response_id"] for row in shown],
                             limit=TRAJECTORY_FEEDBACK_ROWS)
        per_step, whole = feedback_by_target(records, shown)
        return json_safe({
            "trajectory": trajectory_totals(trajectory_id, shown),
            "more_steps": len(rows) > len(shown),
            "decoder": self.decoder.identity if self.decoder else None,
            "feedback_records": whole,
            "steps": turns(shown, per_step, self.decoder),
        })

    def prompt_group(self, prompt_group_id: str) -> dict[str, Any] | None:
        """A prompt group's rollouts side by side, with the prompt they share (the first one's)."""
        rows = self._rows(q.GROUP_TRAJECTORIES_SQL, prompt_group_id=prompt_group_id, limit=GROUP_TRAJECTORIES)
        if not rows:
            return None
        prompts = [row.pop("first_prompt") for row in rows]
        return json_safe({"prompt_group_id": prompt_group_id, "prompt_messages": parse_json_text(prompts[0]),
                          "trajectories": rows})


def _headline(body: Mapping[str, Any]) -> dict[str, Any]:
    """The figures the page's header shows, picked from the panels (no extra query)."""
    curation = body["curation"]["totals"]
    return {
        "steps": curation["steps"],
        "ready_steps": curation["ready_steps"],
        "failed_steps": curation["failed"],
        "trajectories": body["representation"]["trajectories"]["trajectories"],
        "prompt_groups": body["representation"]["prompt_groups"]["groups"],
        "dead_letters": body["curation"]["dead_letters"]["total"],
        "savings_ratio": body["optimization"]["overall"]["savings_ratio"],
        "consumer_groups": len(body["consumption"]["groups"]),
        "last_step_ms": body["collection"]["last_step_ms"],
    }
