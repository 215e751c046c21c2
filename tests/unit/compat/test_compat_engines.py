"""/generate's engines: round-robin over every engine in CLAWR1_UPSTREAM, skipping one that is down."""

from __future__ import annotations

import httpx
import pytest

from clawr1.compat.engines import EngineFailed, Engines, parse_engines
from clawr1.demo.standin.server import StandinEngine
from tests.support.ports import free_port


def test_upstream_lists_engine_origins() -> None:
    assert parse_engines("http://a:1, b:2,") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="origin"):
        parse_engines("http://a:1/v1")


async def test_calls_alternate_and_skip_an_engine_that_is_down() -> None:
    first, second = StandinEngine(), StandinEngine()
    ports = [await first.start(), await second.start()]
    down = f"http://127.0.0.1:{free_port()}"
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            engines = Engines([f"http://127.0.0.1:{p}" for p in ports] + [down], client)
            for _ in range(3):
                await engines.complete({"prompt": [1, 2], "return_token_ids": True})
            assert (len(first.received), len(second.received)) == (2, 1)
            with pytest.raises(EngineFailed, match="no engine could be reached"):
                await Engines([down], client).complete({"prompt": [1]})
    finally:
        await first.stop()
        await second.stop()
