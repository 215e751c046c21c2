"""Finding 4 of issue 25 on the live API with keys: /v1/dashboard/live streams are capped per key and in
all (150 streams on one key took trainer SQL from 15 ms to 13-14 s), and every stream gets the same
pulse, in the messages the page reads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from clawr1.core.settings import Settings
from clawr1.dashboard.api import dashboard_router
from clawr1.dashboard.live import LiveLimits
from clawr1.gateway.app import create_app
from clawr1.pool.store import PoolStore
from tests.support.asgi import serve_asgi

KEYS = {"ann": "sk-live-ann-0123456789", "ben": "sk-live-ben-0123456789"}


@pytest.fixture
def api(pool_store: PoolStore, kafka_bootstrap: str) -> Iterator[str]:
    settings = Settings(kafka_bootstrap=kafka_bootstrap,
                        api_keys=",".join(f"{name}:{key}:read" for name, key in KEYS.items()))
    limits = LiveLimits(per_key=3, max_streams=5)
    app = create_app(settings, routers=[dashboard_router(pool_store, live_limits=limits)])
    with serve_asgi(app) as server:
        yield server.url


def open_stream(http: httpx.Client, streams: ExitStack, key: str) -> httpx.Response:
    reply = streams.enter_context(http.stream("GET", "/v1/dashboard/live",
                                              headers={"Authorization": f"Bearer {KEYS[key]}"}))
    if reply.status_code == 200:
        return reply
    reply.read()
    return reply


def first_event(lines: Iterator[str]) -> list[str]:
    return [next(lines), next(lines)]


def test_live_streams_are_capped_and_share_one_pulse(api: str) -> None:
    with httpx.Client(base_url=api, timeout=30) as http:
        for _round in range(2):  # closed streams free their places
            with ExitStack() as streams:
                ann = [open_stream(http, streams, "ann") for _ in range(3)]
                assert [reply.status_code for reply in ann] == [200] * 3
                # The readers stay referenced: a dropped one closes its connection, and so the stream.
                readers = [reply.iter_lines() for reply in ann]
                events = [first_event(lines) for lines in readers]
                assert events[0][0] == "event: pulse" and events[0][1].startswith('data: {"steps":0')
                assert events == [events[0]] * 3
                refused = open_stream(http, streams, "ann")
                assert refused.status_code == 429 and "CLAWR1_DASHBOARD_LIVE_PER_KEY" in refused.text
                ben = [open_stream(http, streams, "ben") for _ in range(3)]
                assert [reply.status_code for reply in ben] == [200, 200, 429]
                assert "CLAWR1_DASHBOARD_LIVE_STREAMS" in ben[2].text
