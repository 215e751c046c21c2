"""Backpressure, live: a gateway in front of a stream worker that stops answers 429 with Retry-After on its
ingest routes once the worker is ``CLAWR1_MAX_LAG_S`` behind, keeps answering reads, and accepts again
once the worker is back and has caught up."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import httpx

from clawr1.core.offsets import group_offsets, group_reader
from clawr1.core.registry import MAX_LAG_S, STREAMS_APP_ID
from clawr1.core.settings import Settings
from clawr1.gateway.config import GatewayTopics
from tests.integration.streams.conftest import Outputs, WorkerRun
from tests.support.gateway import running_gateway
from tests.support.steps import make_step
from tests.support.waiting import wait_until


def test_a_lagging_pipeline_gets_429_with_retry_after_and_work_again_once_caught_up(
        kafka_bootstrap: str, worker_runs: Callable[[], tuple[WorkerRun, Outputs]]) -> None:
    run, _ = worker_runs()
    names = run.topics
    topics = GatewayTopics(names.raw_steps, names.raw_feedback, names.raw_events, names.raw_llm)
    settings = Settings(extra={MAX_LAG_S.name: "1", STREAMS_APP_ID.name: run.app_id})
    numbers = itertools.count()
    run.start()
    with running_gateway(kafka_bootstrap, settings=settings, topics=topics) as gateway:

        def submit() -> httpx.Response:
            return gateway.http.post("/v1/steps", json=make_step(next(numbers)))

        assert submit().status_code == 202
        reader = group_reader(kafka_bootstrap, run.app_id)
        try:  # the worker has committed: from now on the gateway knows how far behind it is
            wait_until(lambda: any(not at.unset for at in group_offsets(reader, [names.raw_steps]).values()),
                       30, interval=0.2, message="the worker's first commit")
        finally:
            reader.close()
        run.stop()

        refused = wait_until(lambda: (reply := submit()).status_code == 429 and reply, 30, interval=0.1,
                             message="a 429 from the gateway once the stopped worker is behind")
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"] == "pipeline_behind"
        assert "behind" in refused.json()["message"]
        otlp = gateway.http.post("/v1/traces", json={"resourceSpans": []})
        assert otlp.status_code == 429 and "Retry-After" in otlp.headers
        assert gateway.http.get("/healthz").status_code == 200  # reads and health are not held back
        assert gateway.http.get("/openapi.json").status_code == 200

        run.start()
        wait_until(lambda: submit().status_code == 202, 60, interval=0.2,
                   message="the gateway accepting again once the worker caught up")
