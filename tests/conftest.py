"""Shared fixtures: one real Kafka broker per test session, unique topic names per test.

Set CLAWR1_TEST_KAFKA_BOOTSTRAP to use an already running broker instead of starting one.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.launcher import KafkaBroker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("CLAWR1_TEST_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    port = free_port()
    broker = KafkaBroker(
        data_dir=Path(tmp_path_factory.mktemp("kafka")), port=port, controller_port=free_port(), heap="768m"
    )
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and id names, so tests never see each other's data."""
    return uuid.uuid4().hex[:10]
