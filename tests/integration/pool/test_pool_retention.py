"""Retention on a real pool: prune by each filter deletes exactly the chosen steps and what hangs on them
(dry runs delete nothing and count the same), and the TTL settings show in the tables' DDL."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from clawr1.cli import main
from clawr1.core.settings import load_settings
from clawr1.pool.migrations import DELIVERY_LOG, STEP_LOOKUP
from clawr1.pool.prune import TABLES, PruneError, PruneFilter, prune
from clawr1.pool.retention import Retention, apply_retention, migrate_with_retention
from clawr1.pool.store import PoolStore

# step: (trajectory, prompt group, response, [channel of each version], policy version, age in days)
STEPS: dict[str, tuple[str, str | None, str, list[str], int | None, int]] = {
    "o1": ("t-old", "g-old", "r-o1", ["train", "train"], 1, 40),
    "o2": ("t-old", "g-old", "r-o2", ["train"], 1, 40),
    "m1": ("t-mix", None, "r-shared", ["train"], 1, 1),
    "m2": ("t-mix", None, "r-shared", ["train"], 5, 1),
    "v1": ("t-val", "g-val", "r-v1", ["val"], 5, 1),
    "c1": ("t-val", None, "r-c1", ["train", "val"], 5, 1),  # registered as val after its first version
    "n1": ("t-new", "g-val", "r-n1", ["train"], None, 1),
}
FEEDBACK = {"f-o1": ("step", "o1"), "f-told": ("trajectory", "t-old"), "f-ro2": ("response", "r-o2"),
            "f-m1": ("step", "m1"), "f-shared": ("response", "r-shared"), "f-tmix": ("trajectory", "t-mix"),
            "f-v1": ("step", "v1"), "f-tval": ("trajectory", "t-val"), "f-n1": ("step", "n1")}
NODES = {"g-old": ("prompt_group", 2), "t-mix": ("trajectory", 1), "g-val": ("prompt_group", 1),
         "t-val": ("trajectory", 1)}
COMMITTED = ["o1", "m1", "v1", "n1"]


STEP_COLUMNS = ["step_id", "version", "trajectory_id", "prompt_group_id", "prompt_id", "response_id",
                "source_kind", "created_at_ms", "updated_at_ms", "token_provenance", "reward_status", "ready",
                "status", "trajectory_reward_status", "channel", "policy_version", "ingested_at"]


def fill(store: PoolStore) -> None:
    """The steps in one insert, without collapsing versions: one part, which no background merge changes
    (a merge would collapse a step's versions, or the id lookup's repeated ids, between two counts)."""
    now = datetime.now(UTC)
    rows = [[step_id, version, trajectory, group, f"p-{step_id}", response, "whitebox_agent", now, now,
             "engine", "final", 1, "ok", "final", channel, policy,
             now - timedelta(days=age) + timedelta(seconds=version)]
            for step_id, (trajectory, group, response, channels, policy, age) in STEPS.items()
            for version, channel in enumerate(channels, 1)]
    store.insert("step_versions", rows, STEP_COLUMNS, settings={"optimize_on_insert": 0})
    for feedback_id, (kind, target) in FEEDBACK.items():
        store.command("INSERT INTO feedback_log (feedback_id, target_kind, target_id, final, source, "
                      "source_name, received_at_ms) VALUES ({f:String}, {k:String}, {t:String}, 1, 'human', "
                      "'test', now64(3))", parameters={"f": feedback_id, "k": kind, "t": target})
    for scope, (kind, nodes) in NODES.items():
        for node in range(nodes):
            store.command("INSERT INTO prefix_node_versions (scope_id, scope_kind, node_id, depth_start, "
                          "version, updated_at_ms) VALUES ({s:String}, {k:String}, {n:String}, 0, 1, "
                          "now64(3))",
                          parameters={"s": scope, "k": kind, "n": f"{scope}-{node}"})
    for step_id in COMMITTED:
        store.command("INSERT INTO consumer_commits (group_name, epoch, step_id, step_version) "
                      "VALUES ('trainer', 'e1', {s:String}, 1)", parameters={"s": step_id})


def contents(store: PoolStore) -> dict[str, object]:
    """What each table prune touches holds, by natural keys (with a count of rows, versions included)."""
    def column(sql: str) -> list[object]:
        return sorted(row["k"] for row in store.query(sql))

    return {
        "steps": column("SELECT step_id AS k FROM steps"),
        "step_versions": column("SELECT concat(step_id, '@', toString(version)) AS k FROM step_versions"),
        DELIVERY_LOG: column(f"SELECT concat(step_id, '@', toString(version)) AS k FROM {DELIVERY_LOG}"),
        "feedback_log": column("SELECT feedback_id AS k FROM feedback_log"),
        "prefix_node_versions": column("SELECT node_id AS k FROM prefix_node_versions"),
        STEP_LOOKUP: column(f"SELECT DISTINCT trajectory_id AS k FROM {STEP_LOOKUP}"),
        "consumer_commits": column("SELECT step_id AS k FROM consumer_commits"),
        "rows": {table: store.query(f"SELECT count() AS n FROM {table}")[0]["n"] for table in TABLES},
    }


def versions(*steps: str) -> list[str]:
    return [f"{s}@{v}" for s in steps for v in range(1, len(STEPS[s][3]) + 1)]


CASES = {
    "older than 30 days": (PruneFilter(older_than_s=30 * 86400),
                           {"steps": ["o1", "o2"], "feedback": ["f-o1", "f-ro2", "f-told"],
                            "nodes": ["g-old"], "trajectories": ["t-old"], "commits": ["o1"]}),
    # m1 goes, m2 keeps its trajectory (tree, lookup, feedback) and the response id they share; n1 has no
    # policy version and stays.
    "policy version below 3": (PruneFilter(policy_version_below=3),
                               {"steps": ["m1", "o1", "o2"], "feedback": ["f-m1", "f-o1", "f-ro2", "f-told"],
                                "nodes": ["g-old"], "trajectories": ["t-old"], "commits": ["m1", "o1"]}),
    # c1's newest version is val: both of its versions go; g-val keeps n1, so its tree stays.
    "channel val": (PruneFilter(channel="val"),
                    {"steps": ["c1", "v1"], "feedback": ["f-tval", "f-v1"], "nodes": ["t-val"],
                     "trajectories": ["t-val"], "commits": ["v1"]}),
    "channel train": (PruneFilter(channel="train"),
                      {"steps": ["m1", "m2", "n1", "o1", "o2"],
                       "feedback": ["f-m1", "f-n1", "f-o1", "f-ro2", "f-shared", "f-tmix", "f-told"],
                       "nodes": ["g-old", "t-mix"], "trajectories": ["t-mix", "t-new", "t-old"],
                       "commits": ["m1", "n1", "o1"]}),
    "every filter together": (PruneFilter(older_than_s=12 * 3600, policy_version_below=3, channel="train"),
                              {"steps": ["m1", "o1", "o2"], "feedback": ["f-m1", "f-o1", "f-ro2", "f-told"],
                               "nodes": ["g-old"], "trajectories": ["t-old"], "commits": ["m1", "o1"]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prune_deletes_exactly_the_chosen_steps_and_what_hangs_on_them(pool_store: PoolStore,
                                                                       case: str) -> None:
    where, gone = CASES[case]
    fill(pool_store)
    before = contents(pool_store)

    planned = prune(pool_store, where, dry_run=True)
    assert contents(pool_store) == before, "a dry run deletes nothing"

    deleted = prune(pool_store, where)
    after = contents(pool_store)
    assert deleted == planned
    assert deleted == {table: before["rows"][table] - after["rows"][table] for table in TABLES}  # type: ignore[index]

    def kept(name: str, removed: list[str]) -> list[object]:
        return [k for k in before[name] if k not in removed]  # type: ignore[attr-defined]

    assert after["steps"] == kept("steps", gone["steps"])
    assert after["step_versions"] == after[DELIVERY_LOG] == kept("step_versions", versions(*gone["steps"]))
    assert after["feedback_log"] == kept("feedback_log", gone["feedback"])
    assert after["prefix_node_versions"] == [n for n in before["prefix_node_versions"]  # type: ignore[attr-defined]
                                             if n.rsplit("-", 1)[0] not in gone["nodes"]]
    assert after[STEP_LOOKUP] == kept(STEP_LOOKUP, gone["trajectories"])
    assert after["consumer_commits"] == kept("consumer_commits", gone["commits"])
    assert prune(pool_store, where) == dict.fromkeys(TABLES, 0), "a second prune finds nothing"
    assert pool_store.query("SELECT count() AS n FROM prune_keys")[0]["n"] == 0


def test_prune_refuses_to_run_without_a_filter(pool_store: PoolStore) -> None:
    with pytest.raises(PruneError, match="needs a filter"):
        prune(pool_store, PruneFilter(), dry_run=True)


def ddl(store: PoolStore, table: str) -> str:
    return str(store.query(f"SHOW CREATE TABLE {table}")[0]["statement"])


STEP_DATA = ("step_versions", "feedback_log", "prefix_node_versions", "consumer_commits")


def test_step_data_is_kept_forever_and_transient_tables_are_bounded_by_default(
        pool_store: PoolStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STEP", "DELIVERY_LOG", "DEAD_LETTER"):
        monkeypatch.delenv(f"CLAWR1_POOL_{name}_TTL_DAYS", raising=False)
    migrate_with_retention(pool_store, load_settings())
    for table in (*STEP_DATA, STEP_LOOKUP):
        assert "\nTTL" not in ddl(pool_store, table), table
    assert "TTL toDateTime(logged_at) + toIntervalDay(30)" in ddl(pool_store, DELIVERY_LOG)
    assert "TTL toDateTime(ingested_at) + toIntervalDay(30)" in ddl(pool_store, "dead_letter_log")
    # The payload's column TTL stays as it was.
    assert "TTL toDateTime(logged_at) + toIntervalHour(24)" in ddl(pool_store, DELIVERY_LOG)


def test_ttl_settings_show_in_the_tables_and_zero_removes_them(pool_store: PoolStore) -> None:
    # A fresh pool's dead letters have no TTL yet: six tables change.
    retention = Retention(step_days=14, delivery_log_days=7, dead_letter_days=0)
    assert len(apply_retention(pool_store, retention)) == 6
    for table in ("step_versions", "feedback_log", "prefix_node_versions"):
        assert "TTL toDateTime(ingested_at) + toIntervalDay(14)" in ddl(pool_store, table), table
    assert "TTL toDateTime(committed_at) + toIntervalDay(14)" in ddl(pool_store, "consumer_commits")
    assert "TTL indexed_on + toIntervalDay(15)" in ddl(pool_store, STEP_LOOKUP)
    assert "TTL toDateTime(logged_at) + toIntervalDay(7)" in ddl(pool_store, DELIVERY_LOG)
    assert "\nTTL" not in ddl(pool_store, "dead_letter_log")
    assert apply_retention(pool_store, retention) == [], "a start with the same settings alters nothing"
    apply_retention(pool_store, Retention(step_days=0, delivery_log_days=7, dead_letter_days=0))
    for table in (*STEP_DATA, STEP_LOOKUP):
        assert "\nTTL" not in ddl(pool_store, table), table


def test_an_expired_step_goes_at_the_next_merge(pool_store: PoolStore) -> None:
    fill(pool_store)
    apply_retention(pool_store, Retention(step_days=30))
    pool_store.command("OPTIMIZE TABLE step_versions FINAL")
    assert sorted(r["step_id"] for r in pool_store.query("SELECT step_id FROM steps")) == \
        sorted(s for s, spec in STEPS.items() if spec[5] < 30)


def test_the_prune_command_counts_then_deletes_and_refuses_without_a_filter(
        pool_store: PoolStore, pool_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    fill(pool_store)
    dsn = f"{pool_dsn}?database={pool_store.database}"
    assert main(["prune", "--dsn", dsn, "--channel", "val", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dry run, nothing deleted") and re.search(r"step_versions +3\n", out)
    assert len(pool_store.query("SELECT step_id FROM steps")) == len(STEPS)
    assert main(["prune", "--dsn", dsn, "--channel", "val"]) == 0
    assert re.search(r"step_versions +3\n", capsys.readouterr().out)
    assert len(pool_store.query("SELECT step_id FROM steps")) == len(STEPS) - 2

    assert main(["prune", "--dsn", dsn]) == 2
    assert "prune needs a filter" in capsys.readouterr().err
    assert main(["prune", "--dsn", dsn, "--older-than", "30 days"]) == 2
    assert "e.g. 30d" in capsys.readouterr().err


def test_the_prune_command_says_to_stop_the_stack_that_holds_the_embedded_pool(tmp_path: Path) -> None:
    path = tmp_path / "pool"
    hold = ("import time; from clawr1.pool.store import PoolStore; "
            f"s = PoolStore('chdb://{path}'); s.migrate(); print('open', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        done = subprocess.run([sys.executable, "-m", "clawr1.cli", "prune", "--dsn", f"chdb://{path}",
                               "--channel", "val"], capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2
    assert "stop the stack that owns it first" in done.stderr
