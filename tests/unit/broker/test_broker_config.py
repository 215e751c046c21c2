"""Pure parts of the broker launcher: cluster ids, single-node and cluster settings, controller ports, the
fatal-fault check."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import cast
from unittest import mock

import pytest

from clawr1.broker import launcher
from clawr1.broker.launcher import FatalFaultWatch, KafkaBroker
from tests.support.waiting import outlast


def test_cluster_ids_never_start_with_a_dash() -> None:
    """An id starting with '-' is read as an option by the storage tool (a 1-in-64 start failure)."""
    dashing = [bytes([0xF8]) + bytes(15), bytes(16)]  # base64 of 0xF8... starts with '-'
    with mock.patch.object(launcher.uuid, "uuid4", side_effect=[mock.Mock(bytes=b) for b in dashing]):
        cluster_id = launcher._kafka_uuid()
    assert not cluster_id.startswith("-") and len(cluster_id) == 22


def _props(node: launcher.Node, layout: launcher.ClusterLayout) -> dict[str, str]:
    text = launcher.server_properties(Path("/d"), node, layout)
    return dict(line.split("=", 1) for line in text.splitlines())


def test_the_fencing_pass_runs_the_node_as_a_controller_alone_on_the_same_metadata() -> None:
    """After a crash the lone node is first a controller only: same id, quorum and log dir (so the same
    metadata), no client listener, so it leads no partition while it fences the crashed run."""
    node = launcher.Node(1, 9, 10)
    layout = launcher.ClusterLayout((node,))
    text = launcher.fencing_properties(Path("/d"), node, layout)
    fencing, whole = dict(line.split("=", 1) for line in text.splitlines()), _props(node, layout)
    assert fencing["process.roles"] == "controller"
    assert fencing["listeners"] == "CONTROLLER://127.0.0.1:10"
    assert "advertised.listeners" not in fencing and "inter.broker.listener.name" not in fencing
    for key in ("node.id", "controller.quorum.voters", "log.dirs"):
        assert fencing[key] == whole[key], key
    # It fences the crashed run after 2 s; the node itself waits 30 s before fencing itself after a pause.
    assert (fencing["broker.session.timeout.ms"], whole["broker.session.timeout.ms"]) == ("2000", "30000")


def test_only_a_cluster_fences_a_silent_node_after_6_s() -> None:
    layout = launcher.ClusterLayout.plan(9092, 3)
    assert {_props(n, layout)["broker.session.timeout.ms"] for n in layout.nodes} == {"6000"}


INTERNAL_FACTORS = ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                    "share.coordinator.state.topic.replication.factor", "default.replication.factor")
INTERNAL_MIN_ISR = ("transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr",
                    "min.insync.replicas")


def test_single_node_settings_keep_internal_topics_on_one_replica() -> None:
    node = launcher.Node(1, 9, 10)
    props = _props(node, launcher.ClusterLayout((node,)))
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9,CONTROLLER://127.0.0.1:10"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:10"
    assert props["process.roles"] == "broker,controller"
    for key in (*INTERNAL_FACTORS, *INTERNAL_MIN_ISR):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    # A dead worker's open transaction is aborted within a second of its timeout, not up to 10 s later.
    assert props["transaction.abort.timed.out.transaction.cleanup.interval.ms"] == "1000"


def test_the_request_log_is_off_unless_asked_and_then_takes_kafkas_request_logger_alone(
        tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    plain = ET.fromstring(launcher.log4j2_xml(tmp_path / "kafka.log"))
    assert plain.find("Loggers/Logger") is None
    assert [a.get("name") for a in plain.find("Appenders") or []] == ["file", "console"]
    logged = ET.fromstring(launcher.log4j2_xml(tmp_path / "kafka.log", tmp_path / "kafka.log.requests"))
    (logger,) = logged.findall("Loggers/Logger")
    assert (logger.get("name"), logger.get("level"), logger.get("additivity")) == (
        "kafka.request.logger", "DEBUG", "false")
    requests = next(a for a in logged.find("Appenders") or [] if a.get("name") == "requests")
    assert requests.get("fileName") == str(tmp_path / "kafka.log.requests")
    assert logged.find("Loggers/Root").get("level") == "INFO"  # type: ignore[union-attr]


def test_replication_is_three_copies_two_in_sync_from_three_nodes_on() -> None:
    assert [(r.factor, r.min_insync) for r in map(launcher.replication_for, (1, 2, 3, 5))] == [
        (1, 1), (2, 1), (3, 2), (3, 2)]


def test_a_three_node_cluster_is_a_quorum_of_three_with_replicated_internal_topics() -> None:
    with mock.patch.object(launcher, "free_port_at", side_effect=lambda port: port):
        layout = launcher.ClusterLayout.plan(9092, 3)
    assert [(n.node_id, n.port, n.controller_port) for n in layout.nodes] == [
        (1, 9092, 9095), (2, 9093, 9096), (3, 9094, 9097)]
    assert layout.bootstrap == "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    props = _props(layout.nodes[1], layout)
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9095,2@127.0.0.1:9096,3@127.0.0.1:9097"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9093,CONTROLLER://127.0.0.1:9096"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9093"
    assert all(props[key] == "3" for key in INTERNAL_FACTORS)
    assert all(props[key] == "2" for key in INTERNAL_MIN_ISR)


def test_two_nodes_have_one_controller_and_keep_both_copies() -> None:
    """A quorum of two would stop when either node stops: the first node alone is the controller."""
    with mock.patch.object(launcher, "free_port_at", side_effect=lambda port: port):
        layout = launcher.ClusterLayout.plan(9092, 2)
    second = _props(layout.nodes[1], layout)
    assert second["process.roles"] == "broker" and "CONTROLLER" not in second["listeners"]
    assert second["controller.quorum.voters"] == "1@127.0.0.1:9094"
    assert second["default.replication.factor"] == "2" and second["min.insync.replicas"] == "1"


def test_a_data_dir_keeps_its_node_count(tmp_path: Path) -> None:
    launcher.KafkaCluster(tmp_path / "kafka", 9092, 3)
    with pytest.raises(launcher.BrokerError, match="holds a 3-node Kafka cluster, not 1"):
        launcher.KafkaCluster(tmp_path / "kafka", 9092, 1)
    (tmp_path / "single" / "logs").mkdir(parents=True)
    (tmp_path / "single" / "logs" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(launcher.BrokerError, match="holds a 1-node Kafka cluster, not 3"):
        launcher.KafkaCluster(tmp_path / "single", 9092, 3)


def test_the_controller_moves_off_a_port_something_holds() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        chosen = launcher.free_port_at(port)
        assert chosen != port
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", chosen))  # and it is free


def test_a_broker_still_running_after_its_fatal_fault_is_reported_its_predecessors_fault_is_not(
        tmp_path: Path) -> None:
    """Kafka exits after a fatal fault, and once hung in that exit for good: the supervisor's check names
    a process that logged one and is still there ``limit_s`` later; a line written in two parts counts,
    and a fault the previous process logged is not held against the next."""
    broker = KafkaBroker(tmp_path)
    broker.log_file.write_text("[t] ERROR Encountered fatal fault: the previous process's\n")
    broker.log_offset = broker.log_file.stat().st_size
    broker.process = cast(subprocess.Popen[bytes], object())
    watch = FatalFaultWatch(broker, limit_s=0.2)
    assert watch(0.0) is None
    with broker.log_file.open("a") as log:
        log.write("[t] INFO starting\n[t] ERROR Encountered fat")
    assert watch(0.0) is None
    with broker.log_file.open("a") as log:
        log.write("al fault: Unhandled fault in MetadataLoader#installPublishers\n")
    assert watch(0.0) is None  # seen now, not yet past the limit
    outlast(0.2, since=time.monotonic())
    problem = watch(0.0)
    assert problem is not None and problem.startswith("it logged a fatal fault"), problem
    broker.log_offset = broker.log_file.stat().st_size  # the supervisor's restart: a new process
    broker.process = cast(subprocess.Popen[bytes], object())
    assert watch(0.0) is None
