"""Benchmark of the Data Pool (embedded chDB): storage per token, insert throughput, lookup latency.

Sections, each with a baseline measured in the same run:

* ``codecs``: bytes on disk per token of multi-turn agent trajectories (8 turns; each prompt is the
  previous prompt + response + a new observation; ids Zipf-distributed over a 151,936-token vocabulary)
  for several column codecs and two sort orders, against the raw 4 bytes per token.
* ``insert``: rows/s and tokens/s through ``PoolStore.insert`` into ``step_versions`` (the sink's path:
  full schema, skip indexes, ZSTD, the materialized views), against the same token arrays inserted into a
  bare two-column MergeTree (LZ4, no indexes); then the same steps as ready versions, which the delivery
  log also copies with their payload.
* ``flush``: CPU of one sink flush's insert into ``step_versions`` by rows per insert (1, 25, 250, 1000),
  the sink's own columnar inserts spaced as its flushes are, counted over every thread of the process (the
  engine inserts and merges in its own). The same inserts after the delivery log's feed is dropped,
  then the step lookup's feed too, against a baseline table of the same columns and codecs without skip
  indexes or feeds; beside them ``prefix_node_versions``, which each flush also writes. Embedded pools
  only: a ClickHouse server spends that CPU in its own process.
* ``merges``: the sink's inserts paced as under black-box load (60 rows every 0.25 s), with the merge
  selector's base at its default (5) and at 20 (fewer, larger merges): CPU per insert with its merges,
  the active parts of ``step_versions``, and read latencies of the pool afterwards. Embedded pools only.
* ``scale``: N steps generated in SQL (trajectories of 8 steps with growing, prefix-sharing prompts);
  id-lookup latency (step, prompt, response, trajectory ids) and curated-scan latency (ready, final,
  one policy version) through the ``steps`` view, against the same lookup with skip indexes disabled;
  bytes on disk per token for the whole table, and for the pool with and without the delivery log's
  payload copy (which expires after ``DELIVERY_PAYLOAD_TTL_HOURS``); last, ``clawr1 prune``'s dry run and
  prune of the first of the four policy versions (a quarter of the steps, with what hangs on them).

Run: ``.venv/bin/python -m bench.bench_pool`` (1M steps, about 6 minutes on 2 cores; ``--flush-only``
runs that section alone, about 2 minutes; ``--merges-only`` the merges, about 3 minutes);
``--steps 1000000 10000000`` adds 10M steps (several minutes on 2 cores and ~1 GB of disk).
Figures are printed and written to ``bench/results/bench_pool.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from clawr1.pool.migrations import DELIVERY_LOG, PAYLOAD_FIELDS, STEP_LOOKUP, id_lookup_sql
from clawr1.pool.prune import PruneFilter, prune
from clawr1.pool.store import PoolStore, is_embedded, quote_identifier
from clawr1.schemas.codec import current_schema, pack_record
from clawr1.sinks.columns import ColumnPlan
from clawr1.sinks.rows import PREFIX_NODES_ROUTE, STEP_COLUMNS, STEPS_ROUTE, Origin, TableRoute, step_row

VOCAB = 151_936
RESULTS = Path(__file__).resolve().parent / "results" / "bench_pool.json"
CODECS = {
    "LZ4": "LZ4",
    "ZSTD(1)": "ZSTD(1)",
    "ZSTD(3)": "ZSTD(3)",
    "Delta+ZSTD(1)": "Delta(4), ZSTD(1)",
    "T64+ZSTD(1)": "T64, ZSTD(1)",
}
ORIGIN = Origin("clawr1.steps", 0, 0, None, None)


# ---------------------------------------------------------------------- data
def zipf_tokens(rng: np.random.Generator, n: int) -> list[int]:
    return (rng.zipf(1.15, n) % VOCAB).astype(np.uint32).tolist()


def schema_defaults(name: str) -> dict[str, Any]:
    return {f["name"]: f.get("default") for f in current_schema(name).raw["fields"]}


def agent_trajectories(trajectories: int, turns: int = 8, seed: int = 7) -> list[dict[str, Any]]:
    """Step records of agent conversations: a shared system prompt, then growing turn histories."""
    rng = np.random.default_rng(seed)
    defaults = schema_defaults("step")
    system = zipf_tokens(rng, 300)
    steps: list[dict[str, Any]] = []
    for t in range(trajectories):
        prompt = system + zipf_tokens(rng, int(rng.integers(50, 300)))
        for i in range(turns):
            response = zipf_tokens(rng, int(rng.integers(30, 400)))
            steps.append({
                **defaults,
                "step_id": f"{rng.integers(1 << 62):016x}", "version": 1, "trajectory_id": f"traj-{t:06d}",
                "step_index": i, "prompt_id": f"{rng.integers(1 << 62):016x}",
                "response_id": f"{rng.integers(1 << 62):016x}", "source_kind": "blackbox_agent",
                "policy_version": t % 4, "created_at_ms": 1_760_000_000_000,
                "updated_at_ms": 1_760_000_000_000, "token_provenance": "engine",
                "prompt_token_ids": prompt, "response_token_ids": response, "terminal": i == turns - 1,
            })
            prompt = prompt + response + zipf_tokens(rng, int(rng.integers(10, 200)))
    return steps


def token_count(steps: list[dict[str, Any]]) -> int:
    return sum(len(s["prompt_token_ids"]) + len(s["response_token_ids"]) for s in steps)


# ---------------------------------------------------------------------- helpers
def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def column_bytes(store: PoolStore, table: str, columns: tuple[str, ...]) -> int:
    names = ", ".join(f"'{c}'" for c in columns)
    rows = store.query(f"SELECT sum(data_compressed_bytes) AS b FROM system.columns WHERE "
                       f"database = currentDatabase() AND table = '{table}' AND name IN ({names})")
    return int(rows[0]["b"])


def insert_batches(store: PoolStore, table: str, rows: list[tuple[Any, ...]], columns: tuple[str, ...],
                   batch: int = 2000) -> None:
    for i in range(0, len(rows), batch):
        store.insert(table, rows[i:i + batch], columns)


def median_ms(store: PoolStore, sqls: list[str], settings: dict[str, Any] | None = None) -> float:
    times = [timed(lambda q=q: store.query(q, settings=settings)) for q in sqls]
    return round(statistics.median(times) * 1000, 2)


# ---------------------------------------------------------------------- sections
def bench_codecs(store: PoolStore, steps: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = token_count(steps)
    rows = [(s["step_id"], s["trajectory_id"], s["step_index"], s["prompt_token_ids"],
             s["response_token_ids"]) for s in steps]
    columns = ("step_id", "trajectory_id", "step_index", "p", "r")
    cases = [(name, codec, "(trajectory_id, step_id)") for name, codec in CODECS.items()]
    cases.append(("ZSTD(1), sorted by step_id", "ZSTD(1)", "step_id"))
    out: dict[str, Any] = {"steps": len(steps), "tokens": tokens, "raw_bytes_per_token": 4.0, "codecs": {}}
    for name, codec, order in cases:
        table = f"codec_{len(out['codecs'])}"
        store.command(f"CREATE TABLE {table} (step_id String, trajectory_id String, step_index Int32, "
                      f"p Array(UInt32) CODEC({codec}), r Array(UInt32) CODEC({codec})) "
                      f"ENGINE = MergeTree ORDER BY {order}")
        seconds = timed(lambda t=table: insert_batches(store, t, rows, columns))
        store.command(f"OPTIMIZE TABLE {table} FINAL")
        per_token = column_bytes(store, table, ("p", "r")) / tokens
        out["codecs"][name] = {"bytes_per_token": round(per_token, 4),
                               "vs_raw": round(4.0 / per_token, 2), "insert_s": round(seconds, 2)}
        print(f"  codec {name:32s} {per_token:6.3f} B/token  ({4.0 / per_token:5.2f}x smaller than raw)")
    return out


def bench_insert(store: PoolStore, steps: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = token_count(steps)
    full_rows = [step_row(s, ORIGIN, 1_760_000_000_000) for s in steps]
    # Ready versions are also copied, with their payload, into the delivery log (a materialized view).
    ready_rows = [step_row({**s, "step_id": f"ready-{s['step_id']}", "ready": True}, ORIGIN,
                           1_760_000_000_000) for s in steps]
    bare_rows = [(s["step_id"], s["prompt_token_ids"], s["response_token_ids"]) for s in steps]
    store.command("CREATE TABLE bare (step_id String, p Array(UInt32), r Array(UInt32)) "
                  "ENGINE = MergeTree ORDER BY tuple()")
    bare_s = timed(lambda: insert_batches(store, "bare", bare_rows, ("step_id", "p", "r")))
    full_s = timed(lambda: insert_batches(store, "step_versions", full_rows, STEP_COLUMNS))
    ready_s = timed(lambda: insert_batches(store, "step_versions", ready_rows, STEP_COLUMNS))
    result = {
        "steps": len(steps), "tokens": tokens, "batch_rows": 2000,
        "rows_per_s": round(len(steps) / full_s), "tokens_per_s": round(tokens / full_s),
        "baseline_bare_rows_per_s": round(len(steps) / bare_s),
        "baseline_bare_tokens_per_s": round(tokens / bare_s),
        "full_schema_vs_bare": round(bare_s / full_s, 3),
        "ready_rows_per_s": round(len(steps) / ready_s), "ready_tokens_per_s": round(tokens / ready_s),
        "ready_vs_not_ready": round(full_s / ready_s, 3),
    }
    print(f"  insert: {result['rows_per_s']} rows/s, {result['tokens_per_s']} tokens/s "
          f"({result['full_schema_vs_bare']}x the bare-table speed); ready versions (copied into the "
          f"delivery log): {result['ready_rows_per_s']} rows/s ({result['ready_vs_not_ready']}x)")
    return result


FLUSH_ROWS = (1, 25, 250, 1000)
FLUSH_INSERTS = {1: 60, 25: 40, 250: 16, 1000: 6}  # inserts per size: more where each is cheap
FLUSH_SPACING_S = 0.05  # between inserts, as the sink's flushes are spaced (shorter, to keep the run short)


def flush_blocks(route: TableRoute, records: list[dict[str, Any]], rows: int,
                 inserts: int | None = None) -> list[Any]:
    """The Arrow blocks the sink's flushes would insert, ``rows`` records each (``sinks/columns.py``)."""
    plan = ColumnPlan.of(route)
    packed = [pack_record(route.schema, r) for r in records[:rows * (inserts or FLUSH_INSERTS[rows])]]
    return [plan.build([(packed[i:i + rows], Origin(route.schema, 0, i, None, None))], 1_760_000_000_000)
            for i in range(0, len(packed), rows)]


def spent(work: Callable[[], None]) -> tuple[float, float]:
    """(CPU seconds of every thread of this process, wall seconds) over ``work`` and a settle after it
    for the merges it started."""
    start, began = time.process_time(), time.monotonic()
    work()
    time.sleep(1.0)
    return time.process_time() - start, time.monotonic() - began


def insert_cost(store: PoolStore, table: str, blocks_by_rows: dict[int, list[Any]],
                tag: str) -> dict[str, float]:
    """Milliseconds of process CPU per insert, by rows per insert, less what the process spends idle."""
    out: dict[str, float] = {}
    for rows, blocks in blocks_by_rows.items():
        def run(bs: list[Any] = blocks, r: int = rows) -> None:
            for n, block in enumerate(bs):
                store.insert_arrow(table, block, dedup_token=f"{tag}-{r}-{n}")
                time.sleep(FLUSH_SPACING_S)

        idle, idle_wall = spent(lambda: time.sleep(0.5))
        busy, wall = spent(run)
        out[str(rows)] = round(1000 * (busy - idle * wall / idle_wall) / len(blocks), 2)
    return out


def prefix_nodes(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A trajectory-scope node per step, 64 of its response's ids (node rows are small)."""
    defaults = schema_defaults("prefix_node")
    return [{**defaults, "scope_id": s["trajectory_id"], "scope_kind": "trajectory", "node_id": f"node-{i}",
             "depth_start": 0, "token_ids": s["response_token_ids"][:64], "step_ids": [s["step_id"]],
             "version": 1, "total_tokens": 640, "tree_tokens": 64, "forks": 0,
             "updated_at_ms": 1_760_000_000_000} for i, s in enumerate(steps)]


def half_ready(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A flush mixes versions that are ready (the delivery log copies their payload) and not (their keys)."""
    return [{**s, "ready": i % 2 == 0} for i, s in enumerate(steps)]


def bench_flush(store: PoolStore, steps: list[dict[str, Any]]) -> dict[str, Any]:
    records = half_ready(steps)
    blocks = {rows: flush_blocks(STEPS_ROUTE, records, rows) for rows in FLUSH_ROWS}
    baseline = "baseline: same columns, no skip indexes, no feed"
    cases: dict[str, dict[str, float]] = {}
    cases["step_versions"] = insert_cost(store, "step_versions", blocks, "full")
    store.command(f"DROP VIEW {DELIVERY_LOG}_feed")
    cases["without the delivery log's feed"] = insert_cost(store, "step_versions", blocks, "no-delivery")
    store.command(f"DROP VIEW {STEP_LOOKUP}_feed")
    cases["without any feed"] = insert_cost(store, "step_versions", blocks, "no-feed")
    store.command("CREATE TABLE bare_steps AS step_versions")
    for index in store.query("SELECT name FROM system.data_skipping_indices "
                             "WHERE database = currentDatabase() AND table = 'bare_steps'"):
        store.command(f"ALTER TABLE bare_steps DROP INDEX {index['name']}")
    cases[baseline] = insert_cost(store, "bare_steps", blocks, "bare")
    node_blocks = {rows: flush_blocks(PREFIX_NODES_ROUTE, prefix_nodes(steps), rows) for rows in FLUSH_ROWS}
    cases["prefix_node_versions"] = insert_cost(store, "prefix_node_versions", node_blocks, "nodes")
    result = {"rows_per_insert": list(FLUSH_ROWS), "spacing_s": FLUSH_SPACING_S, "ms_per_insert": cases,
              "step_versions_vs_baseline": {r: round(cases["step_versions"][r] / ms, 2)
                                            for r, ms in cases[baseline].items()}}
    for name, costs in cases.items():
        print(f"  flush {name:50s} " + "  ".join(f"{r:>4} rows {ms:7.2f} ms" for r, ms in costs.items()))
    return result


MERGE_SELECTOR_BASES = (5, 20)  # the engine's default; merging about four times as many parts, later
MERGE_PACE = (60, 160, 0.25)  # rows per insert, inserts, seconds between them: the sink under black-box load
ACTIVE_PARTS = ("SELECT count() AS n FROM system.parts WHERE active AND database = currentDatabase() "
                "AND table = 'step_versions'")
MERGE_READS = {
    "steps count": "SELECT count() FROM steps",
    "steps filtered": "SELECT count() FROM steps WHERE ready = 1 AND reward > 0.5",
    "delivery log range": f"SELECT step_id, version FROM {DELIVERY_LOG} ORDER BY logged_at DESC LIMIT 100",
}


def bench_merges(dsn: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Merging later trades the merges' CPU against parts every ``FINAL`` read must combine: sink-paced
    inserts with the merge selector's base at its default and raised, alternating, two rounds each; CPU
    per insert with the merges it starts, active parts of ``step_versions``, and reads afterwards."""
    rows, inserts, spacing = MERGE_PACE
    blocks = flush_blocks(STEPS_ROUTE, half_ready(steps), rows, inserts)
    runs: dict[str, list[dict[str, Any]]] = {str(base): [] for base in MERGE_SELECTOR_BASES}
    for round_ in range(2):
        for base in MERGE_SELECTOR_BASES:
            store = fresh_store(dsn, f"bench_merges_{base}_{round_}")
            for table in ("step_versions", DELIVERY_LOG, STEP_LOOKUP):
                store.command(f"ALTER TABLE {table} MODIFY SETTING merge_selector_base = {base}")
            parts: list[int] = []

            def run(store: PoolStore = store, parts: list[int] = parts) -> None:
                for n, block in enumerate(blocks):
                    store.insert_arrow("step_versions", block, dedup_token=f"merges-{n}")
                    if n % 8 == 7:
                        parts.append(int(store.query(ACTIVE_PARTS)[0]["n"]))
                    time.sleep(spacing)

            cpu, _ = spent(run)
            runs[str(base)].append({
                "ms_per_insert": round(1000 * cpu / len(blocks), 2),
                "parts_mean": round(statistics.mean(parts), 1), "parts_max": max(parts),
                "read_ms": {name: median_ms(store, [sql] * 5) for name, sql in MERGE_READS.items()}})
            drop(store)
    for base, results in runs.items():
        for r in results:
            print(f"  merges: merge_selector_base {base:>2}: {r['ms_per_insert']:6.2f} ms a {rows}-row "
                  f"insert, parts {r['parts_mean']} (max {r['parts_max']}), reads {r['read_ms']}")
    return {"rows_per_insert": rows, "inserts": inserts, "spacing_s": spacing, "by_merge_selector_base": runs}


GENERATE = """
INSERT INTO step_versions (step_id, version, trajectory_id, step_index, prompt_group_id, prompt_id,
    response_id, source_kind, source_name, model, policy_version, created_at_ms, updated_at_ms,
    prompt_token_ids, response_token_ids, token_provenance, reward, reward_status, ready, status,
    trajectory_reward_status)
SELECT concat('step-', toString(number)), 1, concat('traj-', toString(intDiv(number, 8))), number % 8,
       concat('group-', toString(intDiv(number, 64))), hex(sipHash64(number, 'p')),
       hex(sipHash64(number, 'r')),
       'blackbox_agent', 'bench', 'm', intDiv(number, {per_version}),
       fromUnixTimestamp64Milli(toInt64(1760000000000 + number)),
       fromUnixTimestamp64Milli(toInt64(1760000000000 + number)),
       arrayMap(i -> toUInt32(sipHash64(intDiv(number, 8), i) % 50000), range(32 + 16 * (number % 8))),
       arrayMap(i -> toUInt32(sipHash64(number, i) % 50000), range(32)),
       'engine', (number % 1000) / 1000, if(number % 10 = 0, 'pending', 'final'), number % 10 != 0, 'ok',
       'pending'
FROM numbers({start}, {count})
"""


def bench_scale(store: PoolStore, steps: int, rng: np.random.Generator) -> dict[str, Any]:
    chunk = 1_000_000
    generate_s = 0.0
    for start in range(0, steps, chunk):
        sql = GENERATE.format(start=start, count=min(chunk, steps - start), per_version=max(steps // 4, 1))
        generate_s += timed(lambda s=sql: store.command(s))
    store.command("OPTIMIZE TABLE step_versions FINAL")
    tokens = int(store.query("SELECT sum(length(prompt_token_ids) + length(response_token_ids)) AS n "
                             "FROM step_versions")[0]["n"])
    ids = [int(i) for i in rng.integers(0, steps, 15)]
    hashed = store.query("SELECT groupArray(hex(sipHash64(n, 'p'))) AS p, groupArray(hex(sipHash64(n, 'r'))) "
                         "AS r FROM (SELECT arrayJoin({ids:Array(UInt64)}) AS n)", parameters={"ids": ids})[0]
    values = {"step_id": [f"step-{i}" for i in ids], "prompt_id": hashed["p"], "response_id": hashed["r"]}
    no_index = {"use_skip_indexes": 0}
    latency: dict[str, Any] = {}
    for name, keys in values.items():
        # The documented lookup (step_lookup, then the view by primary key) against the view filtered by
        # the id (skip indexes), and that without skip indexes: same ids, same run.
        lookup = [id_lookup_sql(name).replace("{id:String}", f"'{k}'") for k in keys]
        view = [f"SELECT * FROM steps WHERE {name} = '{k}'" for k in keys]
        store.query(lookup[0])  # warm caches once per kind
        store.query(view[0])
        figures = {"median_ms": median_ms(store, lookup), "view_skip_index_ms": median_ms(store, view),
                   "view_without_skip_indexes_ms": median_ms(store, view[:3], no_index)}
        figures["speedup_vs_view"] = round(figures["view_skip_index_ms"] / figures["median_ms"], 1)
        latency[name] = figures
        print(f"  {steps:>9} steps: lookup by {name:13s} {figures['median_ms']:8.2f} ms via {STEP_LOOKUP} "
              f"(view with skip indexes {figures['view_skip_index_ms']:.2f} ms, "
              f"without {figures['view_without_skip_indexes_ms']:.2f} ms)")
    by_trajectory = [f"SELECT * FROM steps WHERE trajectory_id = 'traj-{i // 8}' ORDER BY step_index"
                     for i in ids]
    store.query(by_trajectory[0])
    latency["trajectory_id"] = {"median_ms": median_ms(store, by_trajectory)}
    print(f"  {steps:>9} steps: lookup by trajectory_id {latency['trajectory_id']['median_ms']:8.2f} ms "
          "(primary key)")
    scan_sql = ("SELECT step_id, prompt_token_ids, response_token_ids, reward FROM steps "
                "WHERE ready = 1 AND reward_status = 'final' AND policy_version = 2 LIMIT 10000")
    scan_ms = median_ms(store, [scan_sql] * 3)
    scan_tokens = int(store.query("SELECT sum(length(prompt_token_ids) + length(response_token_ids)) AS n "
                                  f"FROM ({scan_sql})")[0]["n"])
    count_ms = median_ms(store, ["SELECT count() FROM steps WHERE ready = 1 AND policy_version = 2"] * 3)
    store.command(f"OPTIMIZE TABLE {DELIVERY_LOG} FINAL")
    store.command(f"OPTIMIZE TABLE {STEP_LOOKUP} FINAL")
    disk = {row["table"]: int(row["b"]) for row in store.query(
        "SELECT table, sum(bytes_on_disk) AS b FROM system.parts WHERE database = currentDatabase() "
        "AND active GROUP BY table")}
    token_bytes = column_bytes(store, "step_versions", ("prompt_token_ids", "response_token_ids"))
    # The delivery log's payload copy lasts DELIVERY_PAYLOAD_TTL_HOURS; the rest of it stays.
    payload_bytes = column_bytes(store, DELIVERY_LOG, (*PAYLOAD_FIELDS, "has_payload"))
    result = {
        "steps": steps, "tokens": tokens, "generate_s": round(generate_s, 1),
        "generated_rows_per_s": round(steps / generate_s),
        "generated_tokens_per_s": round(tokens / generate_s),
        "lookups": latency,
        "curated_scan_10k_rows_ms": scan_ms, "curated_scan_tokens": scan_tokens,
        "curated_count_ms": count_ms,
        "token_column_bytes_per_token": round(token_bytes / tokens, 4),
        "table_bytes_per_token": round(disk["step_versions"] / tokens, 4),
        "delivery_log_bytes_per_token": round(disk.get(DELIVERY_LOG, 0) / tokens, 4),
        "delivery_log_payload_bytes_per_token": round(payload_bytes / tokens, 4),
        "step_lookup_bytes_per_token": round(disk.get(STEP_LOOKUP, 0) / tokens, 4),
        "pool_bytes_per_token": round(sum(disk.values()) / tokens, 4),
        "pool_bytes_per_token_after_payload_ttl": round((sum(disk.values()) - payload_bytes) / tokens, 4),
        "raw_bytes_per_token": 4.0,
    }
    print(f"  {steps:>9} steps: curated scan of 10k rows {scan_ms} ms, count {count_ms} ms; "
          f"{result['token_column_bytes_per_token']} B/token in token columns, "
          f"{result['table_bytes_per_token']} B/token for step_versions, "
          f"{result['pool_bytes_per_token']} B/token with {DELIVERY_LOG} and {STEP_LOOKUP} (raw: 4), "
          f"{result['pool_bytes_per_token_after_payload_ttl']} once the log's payload copy expired")
    where = PruneFilter(policy_version_below=1)
    planned: dict[str, int] = {}
    deleted: dict[str, int] = {}
    dry_run_s = timed(lambda: planned.update(prune(store, where, dry_run=True)))
    prune_s = timed(lambda: deleted.update(prune(store, where)))
    assert planned == deleted, (planned, deleted)
    result["prune_policy_version_0"] = {"dry_run_s": round(dry_run_s, 2), "prune_s": round(prune_s, 2),
                                        "rows": deleted}
    print(f"  {steps:>9} steps: prune of policy version 0 ({deleted['step_versions']} steps): dry run "
          f"{dry_run_s:.2f} s, prune {prune_s:.2f} s; rows {deleted}")
    return result


# ---------------------------------------------------------------------- main
def fresh_store(dsn: str, name: str) -> PoolStore:
    store = PoolStore(dsn, database=name)
    store.migrate()
    return store


def drop(store: PoolStore) -> None:
    store.command(f"DROP DATABASE IF EXISTS {quote_identifier(store.database)}")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1_000_000], help="table sizes for lookups")
    parser.add_argument("--trajectories", type=int, default=1500, help="agent trajectories for codecs/insert")
    parser.add_argument("--dsn", default="", help="pool DSN (default: a temporary chDB directory)")
    parser.add_argument("--scale-only", action="store_true", help="skip the codec and insert sections")
    parser.add_argument("--flush-only", action="store_true", help="run the flush section alone")
    parser.add_argument("--merges-only", action="store_true", help="run the merges section alone")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the figures are written")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        dsn = args.dsn or f"chdb://{tmp}/pool"
        results: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
        sections = {"flush"} if args.flush_only else {"merges"} if args.merges_only else {
            "scale"} if args.scale_only else {"flush", "merges", "codecs", "insert", "scale"}
        for section in ("flush", "merges"):
            if section in sections and not is_embedded(dsn):
                print(f"  {section}: skipped, it counts the engine's CPU in this process (chdb:// only)")
                sections.discard(section)
        if "flush" in sections:
            store = fresh_store(dsn, "bench_flush")
            results["flush"] = bench_flush(store, agent_trajectories(750))
            drop(store)
        if "merges" in sections:
            results["merges"] = bench_merges(dsn, agent_trajectories(1200))
        if "codecs" in sections:
            steps = agent_trajectories(args.trajectories)
            print(f"agent workload: {len(steps)} steps, {token_count(steps)} tokens")
            store = fresh_store(dsn, "bench_codecs")
            results["codecs"] = bench_codecs(store, steps)
            drop(store)

            store = fresh_store(dsn, "bench_insert")
            results["insert"] = bench_insert(store, steps)
            drop(store)

        if "scale" in sections:
            rng = np.random.default_rng(11)
            results["scale"] = []
            for n in args.steps:
                store = fresh_store(dsn, f"bench_scale_{n}")
                results["scale"].append(bench_scale(store, n, rng))
                drop(store)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
