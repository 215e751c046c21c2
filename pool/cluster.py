"""The pool on a ClickHouse cluster: the migrations' DDL made cluster-wide, and the servers' config.

With ``CLAWR1_CLICKHOUSE_CLUSTER=<name>`` every migration statement is rewritten (``cluster_statements``)
before it runs, so the single-node DDL in ``migrations.py`` stays the one description of the pool:

- a table ``T`` becomes ``T_local`` on every node (``ON CLUSTER``) with the ``Replicated`` form of its
  engine (Keeper path ``/clickhouse/tables/{shard}/{database}/{table}``, replica ``{replica}``: the
  servers' macros), and ``T`` becomes a ``Distributed`` table over them, sharded by ``SHARDING_KEYS[T]``.
  Everything that reads or writes the pool keeps using ``T``: the sink inserts into the Distributed
  tables, which route each row to its shard (``PoolStore.insert`` waits until the shards hold it);
- every version of a row must land on the shard that holds its earlier versions, or ``FINAL`` (which
  runs per shard) would keep both: each sharding key is part of the row's identity (a step's
  ``trajectory_id`` never changes between its versions, and keeps a trajectory's steps on one shard);
- a materialized view runs on each node from ``T_local`` into the local table of its target, which
  is sharded the same way, so it never crosses shards; views are created on every node, and a view's
  ``MODIFY QUERY`` changes it on every node the same way;
- ``ALTER TABLE T`` alters ``T_local`` and ``T`` alike (a TTL, ``pool/retention.py``, only ``T_local``);
  a backfill (``INSERT ... SELECT``) runs over the Distributed tables with ``distributed_product_mode =
  'local'``: its ``NOT IN`` subquery then reads each shard's own rows, which is exact because source and
  target are sharded alike.

``ClickHouseCluster`` writes the servers' config for a layout (``deploy/clickhouse/``, mounted by the
``cluster`` profile of docker-compose.yml): ``remote_servers``, the Keeper ensemble, the macros (from
each node's environment) and the Keeper nodes' own config.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

SHARDING_KEYS: dict[str, str] = {
    "schema_migrations": "cityHash64(id)",
    "step_versions": "cityHash64(trajectory_id)",
    "feedback_log": "cityHash64(target_id)",
    "prefix_node_versions": "cityHash64(scope_id)",
    "dead_letter_log": "cityHash64(dlq_id)",
    # Fed by materialized views on step_versions: sharded like it, so each shard feeds its own rows.
    "ready_queue": "cityHash64(trajectory_id)",
    # Its sort key's identity; its feeds write beside their step_versions rows (local to local).
    "delivery_log": "cityHash64(step_id)",
    "step_lookup": "cityHash64(trajectory_id)",
    "prune_keys": "cityHash64(trajectory_id)",
    "consumer_commits": "cityHash64(group_name)",
    "consumer_positions": "cityHash64(group_name)",
    "consumer_presets": "cityHash64(name)",
    "consumer_cursors": "cityHash64(group_name)",
}
"""Each pool table's sharding key: an expression of columns that never change between a row's versions."""

LOCAL_SUFFIX = "_local"
REPLICA_PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+) \(", re.IGNORECASE)
_ENGINE = re.compile(r"\bENGINE = (\w*MergeTree)(?:\(([^()]*)\))?", re.IGNORECASE)
_CREATE_VIEW = re.compile(r"^(CREATE (?:OR REPLACE )?VIEW (?:IF NOT EXISTS )?)(\w+)( AS\b)", re.IGNORECASE)
_CREATE_MV = re.compile(r"^(CREATE MATERIALIZED VIEW IF NOT EXISTS )(\w+) TO (\w+)( AS\b)", re.IGNORECASE)
_MODIFY_QUERY = re.compile(r"^ALTER TABLE (\w+) MODIFY QUERY\b", re.IGNORECASE)
_TTL = re.compile(r"^ALTER TABLE (\w+) ((?:MODIFY|REMOVE) TTL\b.*)", re.IGNORECASE | re.DOTALL)
_ALTER = re.compile(r"^ALTER TABLE (\w+) ", re.IGNORECASE)
_INSERT_SELECT = re.compile(r"^INSERT INTO \w+ .*\bSELECT\b", re.IGNORECASE | re.DOTALL)
_DROP = re.compile(r"^DROP (VIEW|TABLE) IF EXISTS (\w+)$", re.IGNORECASE)
# A bare name after FROM (not ``db.x``, not a table function): in the migrations, always the pool's own.
_FROM = re.compile(r"\bFROM (\w+)\b(?!\s*[.(])")


class ClusterDdlError(ValueError):
    """A migration statement this module does not know how to make cluster-wide."""


def _identifier(name: str, what: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ClusterDdlError(f"{what} must be a plain identifier, not {name!r}")
    return name


def _qualified_from(body: str, database: str, local: bool = False) -> str:
    """``FROM x`` -> ``FROM db.x`` (``db.x_local`` with ``local``) for the pool's own tables and views:
    every node then reads the same objects whatever its default database."""
    suffix = LOCAL_SUFFIX if local else ""
    return _FROM.sub(lambda m: f"FROM {database}.{m.group(1)}{suffix}", body)


def cluster_statements(statement: str, cluster: str, database: str) -> list[str]:
    """The statements that do on ``cluster`` what ``statement`` does on one server (see the module doc)."""
    on = f"ON CLUSTER {_identifier(cluster, 'the cluster name')}"
    db = _identifier(database, "the database name")
    if match := _CREATE_TABLE.match(statement):
        table = match.group(1)
        if table not in SHARDING_KEYS:
            raise ClusterDdlError(f"table {table!r} has no sharding key: add it to SHARDING_KEYS "
                                  "in pool/cluster.py")
        engine = _ENGINE.search(statement)
        if engine is None:
            raise ClusterDdlError(f"table {table!r}: only MergeTree-family engines can be replicated")
        args = f"{REPLICA_PATH}, {engine.group(2)}" if engine.group(2) else REPLICA_PATH
        local = (f"CREATE TABLE IF NOT EXISTS {db}.{table}{LOCAL_SUFFIX} {on} ("
                 + statement[match.end():engine.start()]
                 + f"ENGINE = Replicated{engine.group(1)}({args})"
                 + statement[engine.end():].replace("non_replicated_deduplication_window",
                                                   "replicated_deduplication_window"))
        shards = f"Distributed({cluster}, {db}, {table}{LOCAL_SUFFIX}, {SHARDING_KEYS[table]})"
        distributed = (f"CREATE TABLE IF NOT EXISTS {db}.{table} {on} AS {db}.{table}{LOCAL_SUFFIX}\n"
                       f"ENGINE = {shards}")
        return [local, distributed]
    if match := _CREATE_MV.match(statement):
        head, view, target, as_ = match.groups()
        body = _qualified_from(statement[match.end():], db, local=True)
        return [f"{head}{db}.{view} {on} TO {db}.{target}{LOCAL_SUFFIX}{as_}{body}"]
    if match := _CREATE_VIEW.match(statement):
        head, view, as_ = match.groups()
        return [f"{head}{db}.{view} {on}{as_}{_qualified_from(statement[match.end():], db)}"]
    if match := _MODIFY_QUERY.match(statement):  # a feed's query: like its CREATE, over the local tables
        body = _qualified_from(statement[match.end():], db, local=True)
        return [f"ALTER TABLE {db}.{match.group(1)} {on} MODIFY QUERY{body}"]
    if match := _TTL.match(statement):  # rows live in the local tables; a Distributed table has no TTL
        return [f"ALTER TABLE {db}.{match.group(1)}{LOCAL_SUFFIX} {on} {match.group(2)}"]
    if match := _ALTER.match(statement):
        table, change = match.group(1), statement[match.end():]
        return [f"ALTER TABLE {db}.{name} {on} {change}" for name in (f"{table}{LOCAL_SUFFIX}", table)]
    if _INSERT_SELECT.match(statement):
        return [f"{statement}\nSETTINGS distributed_product_mode = 'local'"]
    if match := _DROP.match(statement.strip()):
        kind, name = match.group(1).upper(), match.group(2)
        names = [name, f"{name}{LOCAL_SUFFIX}"] if kind == "TABLE" else [name]  # a table: both layers
        return [f"DROP {kind} IF EXISTS {db}.{n} {on}" for n in names]
    raise ClusterDdlError(f"no cluster form for: {statement.splitlines()[0][:80]}")


def database_statement(cluster: str, database: str) -> str:
    return (f"CREATE DATABASE IF NOT EXISTS {_identifier(database, 'the database name')} "
            f"ON CLUSTER {_identifier(cluster, 'the cluster name')}")


_ACCESS = re.compile(r"^(CREATE (?:SETTINGS PROFILE|USER) OR REPLACE \w+)|^(GRANT)\b", re.IGNORECASE)


def access_statements(sql: str, cluster: str) -> list[str]:
    """``pool/server/analyst.sql`` (the analyst's profile, user and grants) for every node of ``cluster``:
    for servers that keep users in local SQL-managed storage (with users in Keeper, run it as it is)."""
    on = f"ON CLUSTER {_identifier(cluster, 'the cluster name')}"
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    out = []
    for statement in (s.strip() for s in body.split(";") if s.strip()):
        match = _ACCESS.match(statement)
        if match is None:
            raise ClusterDdlError(f"no cluster form for: {statement.splitlines()[0][:80]}")
        out.append(f"{match.group(0)} {on}{statement[match.end():]}")
    return out


@dataclass(frozen=True)
class ClickHouseCluster:
    """A layout of ClickHouse servers (``clickhouse-s<shard>r<replica>``) and Keeper nodes (``keeper-<n>``),
    the host names docker-compose.yml's ``cluster`` profile gives them."""

    name: str = "clawr1"
    shards: int = 2
    replicas: int = 2
    keepers: int = 3
    keeper_port: int = 9181
    raft_port: int = 9234

    def server(self, shard: int, replica: int) -> str:
        return f"clickhouse-s{shard}r{replica}"

    def keeper(self, n: int) -> str:
        return f"keeper-{n}"

    @property
    def servers(self) -> list[tuple[str, int, int]]:
        """(host, shard, replica) of every server."""
        return [(self.server(shard, replica), shard, replica)
                for shard in range(1, self.shards + 1) for replica in range(1, self.replicas + 1)]

    def server_config(self) -> str:
        """config.d for every server: the cluster (nodes talk with a shared secret, so a query runs on
        the shards as the user who sent it), Keeper, the macros (each node's from its environment) and
        the distributed DDL queue."""
        root = ET.Element("clickhouse")
        cluster = ET.SubElement(ET.SubElement(root, "remote_servers"), self.name)
        ET.SubElement(cluster, "secret", from_env="CLICKHOUSE_CLUSTER_SECRET")
        for shard_number in range(1, self.shards + 1):
            shard = ET.SubElement(cluster, "shard")
            _text(shard, "internal_replication", "true")
            for replica_number in range(1, self.replicas + 1):
                replica = ET.SubElement(shard, "replica")
                _text(replica, "host", self.server(shard_number, replica_number))
                _text(replica, "port", "9000")
        keepers = ET.SubElement(root, "zookeeper")
        for n in range(1, self.keepers + 1):
            node = ET.SubElement(keepers, "node")
            _text(node, "host", self.keeper(n))
            _text(node, "port", str(self.keeper_port))
        macros = ET.SubElement(root, "macros")
        _text(macros, "cluster", self.name)
        ET.SubElement(macros, "shard", from_env="CLICKHOUSE_SHARD")
        ET.SubElement(macros, "replica", from_env="CLICKHOUSE_REPLICA")
        _text(ET.SubElement(root, "distributed_ddl"), "path", "/clickhouse/task_queue/ddl")
        return self._document(root, f"{self.shards} shards x {self.replicas} replicas, "
                                    f"{self.keepers} Keeper nodes")

    def keeper_config(self) -> str:
        """The Keeper nodes' config (each node's id from its environment)."""
        root = ET.Element("clickhouse")
        _text(root, "listen_host", "0.0.0.0")
        keeper = ET.SubElement(root, "keeper_server")
        _text(keeper, "tcp_port", str(self.keeper_port))
        ET.SubElement(keeper, "server_id", from_env="KEEPER_ID")
        _text(keeper, "log_storage_path", "/var/lib/clickhouse/coordination/log")
        _text(keeper, "snapshot_storage_path", "/var/lib/clickhouse/coordination/snapshots")
        raft = ET.SubElement(keeper, "raft_configuration")
        for n in range(1, self.keepers + 1):
            server = ET.SubElement(raft, "server")
            _text(server, "id", str(n))
            _text(server, "hostname", self.keeper(n))
            _text(server, "port", str(self.raft_port))
        return self._document(root, f"{self.keepers} Keeper nodes")

    @staticmethod
    def _document(root: ET.Element, layout: str) -> str:
        ET.indent(root, space="    ")
        note = (f"Generated by `python -m clawr1.pool.cluster config` ({layout}); "
                "tests/unit/pool/test_pool_cluster.py checks it.")
        return f"<!-- {note} -->\n{ET.tostring(root, encoding='unicode')}\n"

    def files(self) -> dict[str, str]:
        """File name -> content, as committed in ``deploy/clickhouse/``."""
        return {"cluster.xml": self.server_config(), "keeper.xml": self.keeper_config()}


def _text(parent: ET.Element, tag: str, text: str) -> None:
    ET.SubElement(parent, tag).text = text


def main(argv: list[str] | None = None) -> int:
    """``python -m clawr1.pool.cluster config [--out DIR]`` writes the compose cluster's server config
    (default ``deploy/clickhouse``); ``analyst-sql [--cluster NAME]`` prints ``pool/server/analyst.sql``
    for every node of the cluster."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m clawr1.pool.cluster", description=main.__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("config").add_argument("--out", type=Path, default=Path("deploy/clickhouse"))
    sub.add_parser("analyst-sql").add_argument("--cluster", default=ClickHouseCluster.name)
    args = parser.parse_args(argv)
    if args.what == "config":
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in ClickHouseCluster().files().items():
            (args.out / name).write_text(text)
            print(args.out / name)
    else:
        analyst = Path(__file__).resolve().parent / "server" / "analyst.sql"
        print(";\n".join(access_statements(analyst.read_text(), args.cluster)) + ";")
    return 0


if __name__ == "__main__":
    sys.exit(main())
