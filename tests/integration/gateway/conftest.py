"""The gateway tests' shared live gateway (tests/support/gateway.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clawr1.core.settings import Settings
from tests.support.gateway import LiveGateway, running_gateway


@pytest.fixture(scope="session")
def gateway(kafka_bootstrap: str) -> Iterator[LiveGateway]:
    """One gateway without API keys for the tests that need no special settings."""
    settings = Settings(max_request_bytes=64 * 1024, max_batch_steps=20)
    with running_gateway(kafka_bootstrap, settings=settings) as live:
        yield live
