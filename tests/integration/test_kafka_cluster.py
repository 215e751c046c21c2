"""Past one broker: `clawr1 up --kafka-nodes 3` under white-box and black-box load loses its active
controller to SIGKILL (the supervisor starts it again after its backoff), then goes through a rolling
restart of all three brokers. Every acknowledged step and answered call must be in the pool exactly once,
a client without retries must be refused (503) for at most 15 s after the kill, topics must keep 3 copies
(2 in sync) and each broker must catch up. One cluster for the module: starting three brokers is the slow
part. The bench (`python -m bench.chaos --kafka-nodes 3`) is the same run with its figures written out."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource

from clawr1.core import registry
from clawr1.core.topics import ALL_TOPICS
from tests.support.chaos import Stack, cluster_plan, cluster_stack, run_faults, running
from tests.support.waiting import wait_until

NODES = 3
REFUSAL_LIMIT_S = 15.0
HEALTHY_AGAIN_S = 120.0  # a worker's restart backoff, start-up, and its stall window's grace


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("kafka-cluster")
    with running(cluster_stack(work / "data", work / "stack.log", NODES)) as stack:
        yield stack


def test_topics_and_kafkas_own_keep_three_copies_two_in_sync(stack: Stack) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    # The worker's state changelog (Quix names it changelog__<group>--...) and internal topic too, and
    # Kafka's consumer offsets and transaction state (the worker commits in transactions). Kafka creates
    # its transaction state when the first transactional producer starts, which may be after `up` is ready.
    kafkas = {"__consumer_offsets", "__transaction_state"}

    def with_kafkas_own() -> ClusterMetadata | None:
        metadata = admin.list_topics(timeout=30)
        return metadata if kafkas <= set(metadata.topics) else None

    metadata = wait_until(with_kafkas_own, 60, interval=0.5,
                          message="Kafka's consumer offsets and transaction state topics")
    assert sorted(metadata.brokers) == [1, 2, 3]
    ours = [name for name in metadata.topics if name.startswith(("clawr1", "changelog__")) or name in kafkas]
    assert {t.name for t in ALL_TOPICS} | kafkas <= set(ours)
    assert any(name.startswith("changelog__clawr1-streams") for name in ours), ours
    for name in ours:
        for partition in metadata.topics[name].partitions.values():
            assert len(partition.replicas) == NODES, (name, partition.id, partition.replicas)
    configs = admin.describe_configs([ConfigResource("topic", name) for name in ours])
    for resource, future in configs.items():
        assert future.result(30)["min.insync.replicas"].value == "2", resource


def test_a_lost_broker_and_a_rolling_restart_lose_and_double_nothing(stack: Stack) -> None:
    result = run_faults(stack, cluster_plan(stack), settle_s=3.0, drain_s=150.0, probe=True)
    assert result["stack_stayed_up"], result
    faults = {f["name"]: f for f in result["faults"]}  # type: ignore[union-attr]
    kill = next(f for name, f in faults.items() if name.startswith("SIGKILL broker-"))
    assert sorted(n for n in faults if n.startswith("SIGTERM")) == [f"SIGTERM broker-{n}" for n in (1, 2, 3)]
    # Writes went on without the killed broker: no refusal past the limit, and it caught up once back.
    # The gateway may hold writes back while the worker catches up on the failover (429 with
    # Retry-After, the lag bound): that ends within twice the bound.
    assert kill["figures"]["refused_for_s"] <= REFUSAL_LIMIT_S, kill
    assert kill["figures"]["held_back_for_s"] <= 2 * registry.MAX_LAG_S.default, kill
    for fault in faults.values():
        assert fault["figures"]["in_sync_s"] >= fault["figures"]["back_s"] > 0, fault
    pool, load = result["pool"], result["load"]
    assert load["proxy_calls_answered"] > 0 and load["streamed_answered"] > 0 and load["steps_acked"] > 0
    assert pool["steps_in_pool"] == pool["steps_acked"] > load["steps_acked"], pool  # the probe's steps too
    assert pool["steps_lost"] == 0 and pool["steps_duplicated"] == 0, pool
    assert pool["calls_captured"] == pool["calls_answered"] and pool["calls_lost"] == 0, pool
    assert pool["calls_duplicated"] == 0, pool
    assert pool["rewards_joined"] == pool["rewards_sent"] > 0, pool
    restarts = result["restarts"]
    assert all(restarts[f"broker-{n}"] >= 1 for n in (1, 2, 3)), restarts  # type: ignore[index]


def test_status_shows_each_broker_in_sync(stack: Stack) -> None:
    """Once the stack is healthy again: the faults above may have ended with a part restarted (a worker
    the stall watch killed) and still catching up, which `status` rightly reports as unhealthy."""
    seen: list[subprocess.CompletedProcess[str]] = []

    def healthy() -> subprocess.CompletedProcess[str] | None:
        seen.append(subprocess.run([sys.executable, "-m", "clawr1.cli", "status", "--api", stack.api,
                                    "--data-dir", str(stack.data_dir)], capture_output=True, text=True,
                                   timeout=60))
        return seen[-1] if seen[-1].returncode == 0 else None

    out = wait_until(healthy, HEALTHY_AGAIN_S, interval=2.0,
                     message=lambda: f"`clawr1 status` exiting 0; it said {seen[-1].stdout}{seen[-1].stderr}")
    for node in (1, 2, 3):
        assert f"role broker-{node}: running" in out.stdout
        assert f"kafka broker {node} (127.0.0.1:{stack.ports['kafka'] + node - 1}): up" in out.stdout
    assert "kafka: 3 broker(s) up;" in out.stdout and ", 0 under-replicated" in out.stdout, out.stdout
    assert "replication factor 3," in out.stdout, out.stdout
