"""The gateway client for asyncio agents: the same calls, batching, Idempotency-Key and retry policy
as ``clawr1.gateway.client.GatewayClient`` (its ``Retries``), without blocking the event loop.

Batches of one call are sent one after another (their order is kept); run several clients' calls
concurrently with ``asyncio.gather`` for more throughput.

    async with AsyncGatewayClient("http://127.0.0.1:8000", api_key="...") as client:
        step_ids = await client.submit_steps([{"trajectory_id": "t1", "step_index": 0, ...}])
        await client.submit_feedback({"step_id": step_ids[0], "reward": 1.0, "source": "rule"})
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from clawr1.gateway.client import JSON_HEADERS, ClientPolicy, Retries, _chunks, json_body


class AsyncGatewayClient(ClientPolicy):
    def __init__(self, api_url: str, api_key: str | None = None, *, batch_size: int = 100,
                 timeout_s: float = 30.0, max_retries: int | None = None, retry_for_s: float = 120.0,
                 backoff_s: float = 0.2, max_backoff_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """Arguments as ``GatewayClient``'s."""
        super().__init__(api_key, batch_size, max_retries, retry_for_s, backoff_s, max_backoff_s)
        self._http = httpx.AsyncClient(base_url=api_url.rstrip("/"), headers=self.auth_headers,
                                       timeout=timeout_s, transport=transport)

    async def __aenter__(self) -> AsyncGatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def submit_steps(self, steps: Iterable[Mapping[str, Any]]) -> list[str]:
        """Send steps in batches of ``batch_size``; returns the step ids in order."""
        return await self._submit("/v1/steps", list(steps))

    async def submit_step(self, step: Mapping[str, Any]) -> str:
        return (await self._submit("/v1/steps", [step]))[0]

    async def submit_feedback(self, feedback: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[str]:
        items = [feedback] if isinstance(feedback, Mapping) else list(feedback)
        return await self._submit("/v1/feedback", items)

    async def submit_events(self, events: Iterable[Mapping[str, Any]]) -> list[str]:
        return await self._submit("/v1/events", list(events))

    async def health(self) -> dict[str, Any]:
        """The gateway's /healthz body (whether it answered 200 or 503)."""
        reply = await self._http.get("/healthz")
        return dict(reply.json())

    async def _submit(self, path: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
        ids: list[str] = []
        for batch in _chunks(items, self.batch_size):
            ids.extend(await self.post(path, list(batch)))
        return ids

    async def post(self, path: str, body: Any, idempotency_key: str | None = None) -> list[str]:
        """POST one request, retrying with the same Idempotency-Key; returns the accepted ids."""
        headers = {**JSON_HEADERS, "Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        content = json_body(body)
        retries = Retries(self, path)
        while True:
            await asyncio.sleep(retries.delay())
            reply: httpx.Response | httpx.TransportError
            try:
                reply = await self._http.post(path, content=content, headers=headers)
            except httpx.TransportError as exc:  # refused while the API restarts, or cut mid-request
                reply = exc
            ids = retries.outcome(reply)
            if ids is not None:
                return ids
