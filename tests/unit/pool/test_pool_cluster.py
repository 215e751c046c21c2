"""The pool's cluster layout, checked as far as it can be without a ClickHouse server: every statement it
would run parsed by the engine's own parser (chDB's ``formatQuery``), the layout it describes (replicated
local tables, Distributed tables over them, views and feeds per node, sharding keys from each row's
identity), and the servers' config against docker-compose.yml's cluster profile."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawr1.pool import cluster
from clawr1.pool.cluster import (
    LOCAL_SUFFIX,
    SHARDING_KEYS,
    ClickHouseCluster,
    ClusterDdlError,
    access_statements,
    cluster_statements,
)
from clawr1.pool.migrations import _BOOTSTRAP, all_migrations, apply_migrations, split_statements
from clawr1.pool.store import PoolError, PoolStore

ROOT = Path(__file__).resolve().parents[3]
NAME, DB = "clawr1", "pool_db"


def single_node_statements() -> list[str]:
    return [_BOOTSTRAP.strip(), *(s for _, sql in all_migrations() for s in split_statements(sql))]


def cluster_form() -> list[str]:
    return [c for s in single_node_statements() for c in cluster_statements(s, NAME, DB)]


@pytest.fixture(scope="module")
def parser(pool_dsn: str) -> Iterator[PoolStore]:
    """The embedded engine, used only to parse (it has no cluster to run them on)."""
    with PoolStore(pool_dsn) as store:
        yield store


def formatted(store: PoolStore, statement: str) -> str:
    """ClickHouse's own formatting of ``statement``: its parser accepted it (else PoolError)."""
    return str(store.query("SELECT formatQuery({q:String}) AS f", {"q": statement})[0]["f"])


def test_every_cluster_statement_parses(parser: PoolStore) -> None:
    statements = cluster_form()
    assert len(statements) > len(single_node_statements())
    for statement in statements:
        text = formatted(parser, statement)
        assert "ON CLUSTER clawr1" in text or text.startswith("INSERT INTO"), text[:120]


def test_the_parser_refuses_a_broken_statement(parser: PoolStore) -> None:
    """The check above can fail: a statement ClickHouse cannot parse raises."""
    with pytest.raises(PoolError, match="Syntax error"):
        formatted(parser, "CREATE TABLE t ON CLUSTER c ENGINE = Distributed(c, db, t_local, cityHash64(a)")


def _created_tables() -> list[str]:
    return [m.group(1) for s in single_node_statements()
            if (m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", s))]


def test_each_table_becomes_replicated_locals_under_a_distributed_table(parser: PoolStore) -> None:
    texts = [formatted(parser, s) for s in cluster_form()]
    tables = _created_tables()
    assert set(tables) == set(SHARDING_KEYS), "every pool table has a sharding key, and only they"
    for table in tables:
        local_head = f"CREATE TABLE IF NOT EXISTS {DB}.{table}{LOCAL_SUFFIX} "
        [local] = [t for t in texts if t.startswith(local_head)]
        assert re.search(r"ENGINE = Replicated\w*MergeTree\('/clickhouse/tables/\{shard\}/\{database\}/"
                         r"\{table\}', '\{replica\}'", local), local
        assert "non_replicated_deduplication_window" not in local
        [distributed] = [t for t in texts if t.startswith(f"CREATE TABLE IF NOT EXISTS {DB}.{table} ")]
        assert distributed.endswith(
            f"ENGINE = Distributed(clawr1, {DB}, {table}{LOCAL_SUFFIX}, {SHARDING_KEYS[table]})"), distributed


def test_replacing_engines_keep_their_version_column(parser: PoolStore) -> None:
    local = next(formatted(parser, s) for s in cluster_form() if f"{DB}.step_versions{LOCAL_SUFFIX} ON" in s)
    engine = f"ReplicatedReplacingMergeTree({cluster.REPLICA_PATH}, version)"
    assert engine in local


def _order_by(statement: str) -> str:
    match = re.search(r"ORDER BY (\([^)]*\)|\w+)", statement)
    assert match, statement
    return match.group(1)


# ready_queue's identity is (ingested_at, step_id); a step's trajectory never changes, so every copy of
# one identity has the same trajectory_id and lands on the same shard.
_KEYED_BY_A_FUNCTION_OF_THE_IDENTITY = {"ready_queue": "trajectory_id"}


def test_sharding_keys_come_from_each_rows_identity() -> None:
    """FINAL and insert deduplication work per shard: every version of a row must reach the same one."""
    for statement in single_node_statements():
        if match := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement):
            table = match.group(1)
            column = re.fullmatch(r"cityHash64\((\w+)\)", SHARDING_KEYS[table])
            assert column, SHARDING_KEYS[table]
            if table not in _KEYED_BY_A_FUNCTION_OF_THE_IDENTITY:
                assert column.group(1) in _order_by(statement), (table, _order_by(statement))


def test_feeds_and_views_run_on_every_node() -> None:
    statements = cluster_form()
    feeds = [s for s in statements if s.startswith("CREATE MATERIALIZED VIEW")]
    assert len(feeds) == 4  # ready queue (dropped later), step lookup, delivery log (ready, others)
    for feed in feeds:
        # Each node feeds its own shard's rows into its own shard's target: never across shards.
        assert re.search(rf"TO {DB}\.\w+{LOCAL_SUFFIX} AS\b", feed), feed
        assert re.search(rf"FROM {DB}\.step_versions{LOCAL_SUFFIX}\b", feed), feed
    (changed,) = [s for s in statements if " MODIFY QUERY" in s]  # the delivery log's feeds made one
    assert changed.startswith(f"ALTER TABLE {DB}.delivery_log_feed ON CLUSTER clawr1 MODIFY QUERY\nSELECT ")
    assert re.search(rf"FROM {DB}\.step_versions{LOCAL_SUFFIX}$", changed), changed
    views = [s for s in statements if re.match(r"CREATE (OR REPLACE )?VIEW", s)]
    assert views and all(" ON CLUSTER clawr1 AS" in v for v in views)
    for view in views:  # over the Distributed tables, named with the database on every node
        assert not re.search(r"\bFROM (?!\(|" + DB + r"\.)", view), view
        assert LOCAL_SUFFIX not in view


def test_alters_change_local_and_distributed_tables_alike() -> None:
    statement = "ALTER TABLE step_versions ADD COLUMN IF NOT EXISTS x UInt8 DEFAULT 0"
    assert cluster_statements(statement, NAME, DB) == [
        f"ALTER TABLE {DB}.step_versions_local ON CLUSTER clawr1 ADD COLUMN IF NOT EXISTS x UInt8 DEFAULT 0",
        f"ALTER TABLE {DB}.step_versions ON CLUSTER clawr1 ADD COLUMN IF NOT EXISTS x UInt8 DEFAULT 0"]


def test_backfills_compare_each_shard_with_itself() -> None:
    backfills = [s for s in cluster_form() if s.startswith("INSERT INTO")]
    assert len(backfills) == 3  # ready queue, step lookup, delivery log
    assert all(b.endswith("SETTINGS distributed_product_mode = 'local'") for b in backfills)


def test_what_has_no_cluster_form_is_refused() -> None:
    with pytest.raises(ClusterDdlError, match="no sharding key"):
        cluster_statements("CREATE TABLE IF NOT EXISTS novel (a String) ENGINE = MergeTree ORDER BY a",
                           NAME, DB)
    with pytest.raises(ClusterDdlError, match="only MergeTree-family"):
        cluster_statements("CREATE TABLE IF NOT EXISTS step_versions (a String) ENGINE = Memory", NAME, DB)
    with pytest.raises(ClusterDdlError, match="no cluster form"):
        cluster_statements("DROP TABLE step_versions", NAME, DB)
    with pytest.raises(ClusterDdlError, match="plain identifier"):
        cluster_statements("ALTER TABLE steps DELETE WHERE 1", "c; DROP", DB)


class RecordingStore:
    """Stands in for the server: records what migrations would run (unit tests may isolate)."""

    database = DB

    def __init__(self) -> None:
        self.commands: list[str] = []

    def command(self, sql: str, parameters: Any = None, settings: Any = None) -> None:
        self.commands.append(sql)

    def query(self, sql: str, parameters: Any = None, settings: Any = None) -> list[dict[str, Any]]:
        return []

    def insert(self, table: str, rows: Any, column_names: Any, dedup_token: Any = None,
               settings: Any = None) -> int:
        self.commands.append(f"insert into {table}: {rows}")
        return len(rows)


def test_migrating_onto_a_cluster_creates_the_database_everywhere_first() -> None:
    store = RecordingStore()
    applied = apply_migrations(store, cluster=NAME)
    assert applied == [m for m, _ in all_migrations()]
    assert store.commands[0] == f"CREATE DATABASE IF NOT EXISTS {DB} ON CLUSTER clawr1"
    ddl = [c for c in store.commands if not c.startswith("insert into schema_migrations")]
    assert ddl[1:] == cluster_form()


def test_the_embedded_pool_cannot_be_a_cluster(tmp_path: Path) -> None:
    with pytest.raises(PoolError, match="needs a server DSN"):
        PoolStore(f"chdb://{tmp_path}", cluster=NAME)


def test_the_analyst_is_created_on_every_node(parser: PoolStore) -> None:
    statements = access_statements((ROOT / "pool" / "server" / "analyst.sql").read_text(), NAME)
    kinds = [s.split()[1] for s in statements]
    assert kinds.count("SETTINGS") == 1 and kinds.count("USER") == 1 and statements[-1].startswith("GRANT")
    for statement in statements:
        assert "ON CLUSTER clawr1" in formatted(parser, statement), statement


# -- the servers' config ------------------------------------------------------------------------------

def _cluster_services() -> dict[str, Any]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return {name: s for name, s in services.items() if "cluster" in s.get("profiles", [])}


def test_the_committed_config_is_the_generated_one() -> None:
    for name, text in ClickHouseCluster().files().items():
        assert (ROOT / "deploy" / "clickhouse" / name).read_text() == text, \
            f"deploy/clickhouse/{name} is stale: run `python -m clawr1.pool.cluster config`"


def test_remote_servers_and_macros_match_the_compose_servers() -> None:
    layout = ClickHouseCluster()
    root = ET.fromstring(layout.server_config())
    shards = root.findall(f"remote_servers/{layout.name}/shard")
    assert len(shards) == 2 and all(s.findtext("internal_replication") == "true" for s in shards)
    services = _cluster_services()
    seen: set[tuple[str, str]] = set()
    for number, shard in enumerate(shards, start=1):
        hosts = [r.findtext("host") for r in shard.findall("replica")]
        assert len(hosts) == 2
        for host in hosts:
            env = services[str(host)]["environment"]
            assert env["CLICKHOUSE_SHARD"] == str(number) and env["CLICKHOUSE_REPLICA"] == host
            seen.add((env["CLICKHOUSE_SHARD"], env["CLICKHOUSE_REPLICA"]))
            mounts = services[str(host)]["volumes"]
            assert "./deploy/clickhouse/cluster.xml:/etc/clickhouse-server/config.d/cluster.xml:ro" in mounts
    assert len(seen) == 4, "every server has macros of its own"
    assert root.find("macros/shard").get("from_env") == "CLICKHOUSE_SHARD"  # type: ignore[union-attr]
    assert root.find("macros/replica").get("from_env") == "CLICKHOUSE_REPLICA"  # type: ignore[union-attr]
    assert root.find(f"remote_servers/{layout.name}/secret").get("from_env") == "CLICKHOUSE_CLUSTER_SECRET"  # type: ignore[union-attr]
    for service in services.values():
        if service.get("command", [None, None])[:2] == ["clawr1", "api"]:
            assert service["environment"]["CLAWR1_CLICKHOUSE_CLUSTER"] == layout.name


def test_keeper_ensemble_matches_the_compose_keepers() -> None:
    layout = ClickHouseCluster()
    services = _cluster_services()
    clients = [(n.findtext("host"), n.findtext("port"))
               for n in ET.fromstring(layout.server_config()).findall("zookeeper/node")]
    keeper = ET.fromstring(layout.keeper_config())
    raft = [(s.findtext("id"), s.findtext("hostname"))
            for s in keeper.findall("keeper_server/raft_configuration/server")]
    assert [host for host, _ in clients] == [host for _, host in raft] == ["keeper-1", "keeper-2", "keeper-3"]
    assert {port for _, port in clients} == {keeper.findtext("keeper_server/tcp_port")}
    for server_id, host in raft:
        assert services[str(host)]["environment"] == {"KEEPER_ID": server_id}
        assert "./deploy/clickhouse/keeper.xml:/etc/clickhouse-keeper/keeper_config.xml:ro" in \
            services[str(host)]["volumes"]


def test_the_config_writer_writes_what_is_committed(tmp_path: Path) -> None:
    assert cluster.main(["config", "--out", str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == ClickHouseCluster().files()


def test_the_analyst_sql_printer_prints_runnable_statements(capsys: pytest.CaptureFixture[str],
                                                           parser: PoolStore) -> None:
    assert cluster.main(["analyst-sql", "--cluster", "other"]) == 0
    printed = [s.strip() for s in capsys.readouterr().out.split(";") if s.strip()]
    assert len(printed) == 5
    assert all("ON CLUSTER other" in formatted(parser, s) for s in printed)
