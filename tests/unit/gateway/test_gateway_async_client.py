"""The asyncio client speaks the sync client's protocol: batches in order, one Idempotency-Key per batch
kept across retries (transport errors, 503 with Retry-After, 409), 4xx refused at once.

The gateway side is played by recorded HTTP answers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from clawr1.gateway.async_client import AsyncGatewayClient
from clawr1.gateway.client import GatewayError


def client(handler: Callable[[httpx.Request], httpx.Response], **kwargs: object) -> AsyncGatewayClient:
    return AsyncGatewayClient("http://gw", "key-1", transport=httpx.MockTransport(handler), backoff_s=0.0,
                              max_backoff_s=0.01, **kwargs)  # type: ignore[arg-type]


def accepted(request: httpx.Request) -> httpx.Response:
    items = json.loads(request.content)
    return httpx.Response(202, json={"accepted": len(items), "ids": [f"id-{i['step_index']}" for i in items]})


def test_batches_in_order_with_auth_and_distinct_keys() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return accepted(request)

    async def main() -> list[str]:
        async with client(handler, batch_size=2) as c:
            return await c.submit_steps({"trajectory_id": "t", "step_index": i} for i in range(5))

    assert asyncio.run(main()) == [f"id-{i}" for i in range(5)]
    assert [len(json.loads(r.content)) for r in seen] == [2, 2, 1]
    assert {r.headers["authorization"] for r in seen} == {"Bearer key-1"}
    assert len({r.headers["idempotency-key"] for r in seen}) == 3


def test_retries_keep_the_key_through_cut_connections_503_and_409() -> None:
    answers = iter([httpx.ConnectError("refused"),
                    httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "kafka_unavailable"}),
                    httpx.Response(409, json={"error": "idempotency_in_flight"})])
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        answer = next(answers, None)
        if isinstance(answer, Exception):
            raise answer
        return answer or accepted(request)

    async def main() -> str:
        async with client(handler) as c:
            return await c.submit_step({"trajectory_id": "t", "step_index": 7})

    assert asyncio.run(main()) == "id-7"
    assert len(keys) == 4 and len(set(keys)) == 1


def test_refusals_raise_at_once_and_retries_end() -> None:
    async def submit(status: int, **kwargs: object) -> None:
        async with client(lambda _r: httpx.Response(status, json={"error": "x"}), **kwargs) as c:
            await c.submit_feedback({"step_id": "s", "reward": 1.0})

    with pytest.raises(GatewayError) as refused:
        asyncio.run(submit(422))
    assert refused.value.status == 422 and refused.value.body == {"error": "x"}
    with pytest.raises(GatewayError, match="still failing after 2 retries"):
        asyncio.run(submit(503, max_retries=2))
