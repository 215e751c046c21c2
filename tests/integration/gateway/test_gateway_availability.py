"""Health, composition and backpressure: 503 with Retry-After instead of unbounded queues, and
nothing answered 202 is lost when the broker dies and comes back."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi import APIRouter

from clawr1.broker.launcher import KafkaBroker
from clawr1.core.settings import Settings
from clawr1.gateway.config import DELIVERY_TIMEOUT_ENV, MAX_IN_FLIGHT_ENV
from tests.support.gateway import running_gateway, wait_healthy
from tests.support.ports import free_port
from tests.support.waiting import wait_until

STEP = {"step_index": 0, "prompt_token_ids": [1, 2], "response_token_ids": [3]}


def test_unreachable_kafka_gives_503_with_retry_after() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    with running_gateway(nowhere, healthy=False) as live:
        health = live.http.get("/healthz")
        assert health.status_code == 503
        assert health.json() == {"status": "unavailable", "parts": {"kafka": False}, "problems": {}}
        started = time.monotonic()
        reply = live.http.post("/v1/steps", json={**STEP, "trajectory_id": "t"})
        assert reply.status_code == 503 and int(reply.headers["retry-after"]) >= 1
        assert reply.json()["error"] == "kafka_unavailable"
        assert time.monotonic() - started < 2.0


def test_readiness_parts_and_mounted_routers(kafka_bootstrap: str) -> None:
    pool = APIRouter(prefix="/v1/pool")
    state = {"pool": False}

    @pool.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    with running_gateway(kafka_bootstrap, healthy=False, routers=[pool],
                         readiness=lambda: dict(state)) as live:

        def kafka_ready() -> httpx.Response | None:
            health = live.http.get("/healthz")
            return health if health.json()["parts"]["kafka"] is not False else None

        health = wait_until(kafka_ready, 20, interval=0.1, message="/healthz never saw Kafka ready")
        assert health.status_code == 503 and health.json()["parts"] == {"kafka": True, "pool": False}
        state["pool"] = True
        wait_healthy(live.url)
        assert live.http.get("/healthz").json() == {"status": "ok", "parts": {"kafka": True, "pool": True},
                                                     "problems": {}}
        assert live.http.get("/v1/pool/ping").json() == {"pong": "yes"}
        assert "/v1/pool/ping" in live.http.get("/openapi.json").json()["paths"]


def test_broker_outage_bounds_in_flight_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port(), controller_port=free_port(),
                         heap="384m")
    broker.start()
    settings = Settings(extra={DELIVERY_TIMEOUT_ENV: "4", MAX_IN_FLIGHT_ENV: "2"}, max_batch_steps=2)
    try:
        with running_gateway(broker.bootstrap, settings=settings) as live:
            before = live.http.post("/v1/steps", json={**STEP, "trajectory_id": "before"})
            assert before.status_code == 202
            broker.kill()

            def submit(traj: str) -> tuple[httpx.Response, float]:
                started = time.monotonic()
                with httpx.Client(base_url=live.url, timeout=60) as client:
                    reply = client.post("/v1/steps", json=[{**STEP, "trajectory_id": traj}] * 2)
                return reply, time.monotonic() - started

            # Two 2-step requests against an in-flight limit of 2: whichever reaches Kafka first holds
            # both slots until its delivery timeout, the other is refused at once.
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(submit, ["during-1", "during-2"]))
            (refused, refused_s), (timed_out, timed_out_s) = sorted(
                results, key=lambda result: "limit 2" not in result[0].json()["message"])
            assert refused.status_code == 503 and "limit 2" in refused.json()["message"]
            assert timed_out.status_code == 503 and "limit 2" not in timed_out.json()["message"]
            assert refused.headers["retry-after"] == timed_out.headers["retry-after"] == "1"
            assert refused_s < 3.5 <= timed_out_s < 30
            assert live.http.get("/healthz").status_code == 503

            broker.start()
            wait_healthy(live.url, timeout=60)
            after = live.http.post("/v1/steps", json={**STEP, "trajectory_id": "after"})
            assert after.status_code == 202
            produced = {record["step_id"]: key for key, record in live.read("steps")}
            assert produced[before.json()["ids"][0]] == "before"
            assert produced[after.json()["ids"][0]] == "after"
    finally:
        broker.stop()
