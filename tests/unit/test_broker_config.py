"""Pure parts of the broker launcher: cluster ids, single-node settings, the controller port."""

from __future__ import annotations

import socket
from pathlib import Path
from unittest import mock

from clawr1.broker import launcher


def test_cluster_ids_never_start_with_a_dash() -> None:
    """An id starting with '-' is read as an option by the storage tool (a 1-in-64 start failure)."""
    dashing = [bytes([0xF8]) + bytes(15), bytes(16)]  # base64 of 0xF8... starts with '-'
    with mock.patch.object(launcher.uuid, "uuid4", side_effect=[mock.Mock(bytes=b) for b in dashing]):
        cluster_id = launcher._kafka_uuid()
    assert not cluster_id.startswith("-") and len(cluster_id) == 22


def test_single_node_settings_keep_internal_topics_on_one_replica() -> None:
    props = dict(line.split("=", 1) for line in launcher.server_properties(Path("/d"), 9, 10).splitlines())
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9,CONTROLLER://127.0.0.1:10"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:10"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_the_controller_moves_off_a_next_port_something_holds() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        # The port after port - 1 is held, so another, free port is chosen for the controller.
        chosen = launcher.controller_port_beside(port - 1)
        assert chosen != port
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", chosen))  # and it is free
