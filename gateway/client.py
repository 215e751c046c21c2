"""A small client for white-box agents: submit steps, feedback and events to the Claw-R1 gateway.

Depends only on httpx, so an agent or trainer process can vendor it. Each batch gets one
Idempotency-Key that every retry of that batch reuses, so a retry after a timeout or a 503 never
produces a batch twice (within the gateway's idempotency window; beyond it, deterministic step ids
still let the pipeline drop the duplicate). Connection errors and 409/429/5xx answers are retried
with backoff for up to ``retry_for_s`` in total, long enough to ride out a restart of the API
process under ``clawr1 up``'s supervisor; a batch the client gave up on may or may not have been
produced, and sending it again later is safe.

    with GatewayClient("http://127.0.0.1:8000", api_key="...") as client:
        step_ids = client.submit_steps([{"trajectory_id": "t1", "step_index": 0, ...}])
        client.submit_feedback({"step_id": step_ids[0], "reward": 1.0, "source": "rule"})
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

RETRY_STATUSES = frozenset({409, 429, 502, 503, 504})


class GatewayError(Exception):
    """The gateway refused a request (4xx), or it stayed unavailable through every retry."""

    def __init__(self, status: int | None, body: Any, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _chunks(items: Sequence[Mapping[str, Any]], size: int) -> Iterator[Sequence[Mapping[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class GatewayClient:
    def __init__(self, api_url: str, api_key: str | None = None, *, batch_size: int = 100,
                 timeout_s: float = 30.0, max_retries: int | None = None, retry_for_s: float = 120.0,
                 backoff_s: float = 0.2, max_backoff_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        """``max_retries`` (None: no count limit) and ``retry_for_s`` both bound the retries of one
        request; whichever is reached first ends them."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.retry_for_s = retry_for_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._http = httpx.Client(base_url=api_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                  transport=transport)

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit_steps(self, steps: Iterable[Mapping[str, Any]]) -> list[str]:
        """Send steps in batches of ``batch_size``; returns the step ids in order."""
        return self._submit("/v1/steps", list(steps))

    def submit_step(self, step: Mapping[str, Any]) -> str:
        return self._submit("/v1/steps", [step])[0]

    def submit_feedback(self, feedback: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[str]:
        items = [feedback] if isinstance(feedback, Mapping) else list(feedback)
        return self._submit("/v1/feedback", items)

    def submit_events(self, events: Iterable[Mapping[str, Any]]) -> list[str]:
        return self._submit("/v1/events", list(events))

    def health(self) -> dict[str, Any]:
        """The gateway's /healthz body (whether it answered 200 or 503)."""
        reply = self._http.get("/healthz")
        return dict(reply.json())

    def _submit(self, path: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
        ids: list[str] = []
        for batch in _chunks(items, self.batch_size):
            ids.extend(self.post(path, list(batch)))
        return ids

    def post(self, path: str, body: Any, idempotency_key: str | None = None) -> list[str]:
        """POST one request, retrying with the same Idempotency-Key; returns the accepted ids."""
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        retry_after, problem = "", ""
        deadline = time.monotonic() + self.retry_for_s
        attempt = 0
        while True:
            if attempt:
                time.sleep(min(self.retry_delay(attempt, retry_after), max(0.0, deadline - time.monotonic())))
            attempt += 1
            try:
                reply = self._http.post(path, json=body, headers=headers)
            except httpx.TransportError as exc:  # refused while the API restarts, or cut mid-request
                retry_after, problem = "", f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code == 202:
                    return [str(i) for i in reply.json()["ids"]]
                if reply.status_code not in RETRY_STATUSES:
                    raise GatewayError(reply.status_code, _body(reply),
                                       f"{path} answered {reply.status_code}: {reply.text[:2000]}")
                retry_after = reply.headers.get("Retry-After", "")
                problem = f"{reply.status_code}: {reply.text[:500]}"
            retries = attempt - 1
            if retries == self.max_retries or time.monotonic() >= deadline:
                raise GatewayError(None, None, f"{path} still failing after {retries} retries in "
                                   f"{self.retry_for_s - (deadline - time.monotonic()):.1f}s ({problem})")

    def retry_delay(self, attempt: int, retry_after: str) -> float:
        """Exponential backoff, or longer when the gateway asked for it, never over max_backoff_s."""
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        try:
            return min(self.max_backoff_s, max(backoff, float(retry_after)))
        except ValueError:
            return backoff


def _body(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return reply.text
