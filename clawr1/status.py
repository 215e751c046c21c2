"""``clawr1 status``: is the stack healthy, which roles is ``clawr1 up`` restarting, how is its Kafka
cluster (each broker, under-replicated partitions), and what does its pool hold?"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

_SUMMARY = (
    "SELECT count() AS steps, countIf(ready = 1) AS ready, uniqExact(trajectory_id) AS trajectories, "
    "countIf(reward_status = 'final') AS rewarded FROM steps"
)
BOOTSTRAP_FILE = Path("run") / "kafka_bootstrap"
"""Where ``clawr1 up`` records the brokers it started, so ``status`` looks at the stack's own cluster."""
_SHOWN_PARTITIONS = 10


def _print_roles(state_file: Path | None) -> None:
    """The supervisor's view: the only witness while the API process itself is down."""
    if state_file is None or not state_file.exists():
        return
    for role in json.loads(state_file.read_text())["roles"]:
        last = f", last {role['last_exit']}" if role["last_exit"] else ""
        print(f"role {role['role']}: {role['state']} (pid {role['pid']}, restarts {role['restarts']}{last})")


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.in_sync) < len(self.replicas)


def partition_states(topics: Mapping[str, Any]) -> list[PartitionState]:
    """confluent-kafka's ``ClusterMetadata.topics`` as plain records, sorted by topic and partition."""
    return sorted((PartitionState(name, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
                   for name, topic in topics.items() for p in topic.partitions.values()),
                  key=lambda s: (s.topic, s.partition))


def kafka_report(brokers: Mapping[int, str], expected: Iterable[str],
                 partitions: list[PartitionState]) -> list[str]:
    """Lines about the cluster: live ``brokers`` (id -> ``host:port``), each ``expected`` address that
    none of them is (down, or an alias the cluster does not advertise), replication factors and the
    under-replicated partitions (a copy is missing from the in-sync set: a broker down or catching up)."""
    factors = sorted({len(p.replicas) for p in partitions})
    lagging = [p for p in partitions if p.under_replicated]
    lines = [f"kafka: {len(brokers)} broker(s) up; {len(partitions)} partitions, replication factor "
             f"{'/'.join(map(str, factors)) or '-'}, {len(lagging)} under-replicated"]
    for broker_id, address in sorted(brokers.items()):
        leads = sum(1 for p in partitions if p.leader == broker_id)
        behind = sum(1 for p in lagging if broker_id in p.replicas and broker_id not in p.in_sync)
        lines.append(f"kafka broker {broker_id} ({address}): up, leads {leads}, out of sync in {behind}")
    lines += [f"kafka broker {address}: not among the live brokers (down?)"
              for address in expected if address not in brokers.values()]
    lines += [f"under-replicated: {p.topic}/{p.partition} in sync {list(p.in_sync)} of {list(p.replicas)}"
              for p in lagging[:_SHOWN_PARTITIONS]]
    if len(lagging) > _SHOWN_PARTITIONS:
        lines.append(f"under-replicated: {len(lagging) - _SHOWN_PARTITIONS} more")
    return lines


def _print_kafka(bootstrap: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=5)
    except KafkaException as exc:
        print(f"kafka at {bootstrap} does not answer: {exc}")
        return
    brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    for line in kafka_report(brokers, [a.strip() for a in bootstrap.split(",")],
                             partition_states(metadata.topics)):
        print(line)


def stack_bootstrap(data_dir: Path, configured: str) -> str:
    """The brokers of the stack running on ``data_dir`` if it recorded them, else ``configured``."""
    recorded = data_dir / BOOTSTRAP_FILE
    return recorded.read_text().strip() if recorded.exists() else configured


def print_status(api_url: str, state_file: Path | None = None, bootstrap: str | None = None) -> int:
    """Exit status 0 healthy, 1 unhealthy, 2 no answer; Kafka's view is shown but does not change it
    (a stack one broker short still serves everything)."""
    _print_roles(state_file)
    if bootstrap:
        _print_kafka(bootstrap)
    try:
        health = httpx.get(f"{api_url}/healthz", timeout=5)
    except httpx.HTTPError as exc:
        print(f"stack at {api_url} does not answer: {exc}")
        return 2
    print(f"health: {health.status_code} {health.text}")
    if health.status_code != 200:
        return 1
    reply = httpx.post(f"{api_url}/v1/sql", json={"query": _SUMMARY, "format": "JSONEachRow"}, timeout=30)
    if reply.status_code == 200 and reply.text.strip():
        print("pool:", json.dumps(json.loads(reply.text.splitlines()[0])))
    else:
        print(f"pool query failed: {reply.status_code} {reply.text}")
        return 1
    return 0
