"""A small client for white-box agents: submit steps, feedback and events to the Claw-R1 gateway.

Depends only on httpx and ``clawr1.core.backoff`` (standard library only), so an agent or trainer
process can vendor it; with orjson installed it encodes the bodies ~15x faster. Each batch gets one
Idempotency-Key that every retry of that batch reuses, so a retry after a timeout or a 503 never
produces a batch twice (within the gateway's idempotency window; beyond it, deterministic step ids
still let the pipeline drop the duplicate). Connection errors and 409/429/5xx answers are retried with
backoff (full jitter, at least the gateway's Retry-After) for up to ``retry_for_s`` in total, long
enough to ride out a restart of the API process under ``clawr1 up``'s supervisor; a batch the client
gave up on may or may not have been produced, and sending it again later is safe.

    with GatewayClient("http://127.0.0.1:8000", api_key="...") as client:
        step_ids = client.submit_steps([{"trajectory_id": "t1", "step_index": 0, ...}])
        client.submit_feedback({"step_id": step_ids[0], "reward": 1.0, "source": "rule"})
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from clawr1.core.backoff import Backoff, retry_after_s

try:  # a batch of 100 steps of 640 token ids: ~11 ms of the rollout worker's CPU with json, ~0.7 with orjson
    import orjson
except ImportError:  # vendored with httpx alone: the standard library writes the same JSON
    orjson = None  # type: ignore[assignment]

RETRY_STATUSES = frozenset({409, 429, 502, 503, 504})
JSON_HEADERS = {"Content-Type": "application/json"}
# What the standard library writes its own way (a numpy float64 is a float to it) or refuses (dataclasses,
# datetimes) orjson hands back as a TypeError, so both write or refuse the same bodies.
_ORJSON_DEFERS = (orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                  | orjson.OPT_PASSTHROUGH_DATETIME) if orjson is not None else 0


def json_body(body: Any) -> bytes:
    """The request's JSON, as httpx's ``json=`` would write it, encoded once for every retry.

    orjson writes a non-finite float as null, where the standard library refuses it (httpx passes
    ``allow_nan=False``): a body with such a float is written by the standard library instead, so a NaN
    reward fails here as it always did rather than arriving as "no reward". What orjson cannot write or
    defers (an int over 64 bits, a key that is not a string, a numpy float) gets the standard library's
    answer too; the one difference left: orjson writes a UUID or an Enum member the library refuses."""
    if orjson is not None:
        try:
            data: bytes = orjson.dumps(body, option=_ORJSON_DEFERS)
        except TypeError:
            pass
        else:
            if b"null" not in data or not _holds_non_finite(body):
                return data
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _holds_non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in ``value``. A list of numbers is summed in C rather than
    walked: a sum is NaN or infinite whenever an item is (a finite sum that overflows only sends the body
    the standard library's way, which writes it)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_holds_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        try:
            total = sum(value)
        except TypeError:  # not all numbers
            return any(_holds_non_finite(v) for v in value)
        return isinstance(total, float) and not math.isfinite(total)
    return False


class GatewayError(Exception):
    """The gateway refused a request (4xx), or it stayed unavailable through every retry."""

    def __init__(self, status: int | None, body: Any, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _chunks(items: Sequence[Mapping[str, Any]], size: int) -> Iterator[Sequence[Mapping[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class ClientPolicy:
    """What the sync and the async client share: the auth header, batching and the retry policy."""

    def __init__(self, api_key: str | None, batch_size: int, max_retries: int | None, retry_for_s: float,
                 backoff_s: float, max_backoff_s: float) -> None:
        """``max_retries`` (None: no count limit) and ``retry_for_s`` both bound the retries of one
        request; whichever is reached first ends them."""
        self.auth_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.retry_for_s = retry_for_s
        self.backoff = Backoff(backoff_s, max_backoff_s)

    def retry_delay(self, attempt: int, retry_after: str) -> float:
        """Exponential backoff with full jitter, or longer when the gateway asked for it (Retry-After),
        never over max_backoff_s."""
        return self.backoff.delay(attempt, retry_after_s(retry_after))


class GatewayClient(ClientPolicy):
    def __init__(self, api_url: str, api_key: str | None = None, *, batch_size: int = 100,
                 timeout_s: float = 30.0, max_retries: int | None = None, retry_for_s: float = 120.0,
                 backoff_s: float = 0.2, max_backoff_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(api_key, batch_size, max_retries, retry_for_s, backoff_s, max_backoff_s)
        self._http = httpx.Client(base_url=api_url.rstrip("/"), headers=self.auth_headers, timeout=timeout_s,
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
        headers = {**JSON_HEADERS, "Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        content = json_body(body)
        retries = Retries(self, path)
        while True:
            time.sleep(retries.delay())
            reply: httpx.Response | httpx.TransportError
            try:
                reply = self._http.post(path, content=content, headers=headers)
            except httpx.TransportError as exc:  # refused while the API restarts, or cut mid-request
                reply = exc
            ids = retries.outcome(reply)
            if ids is not None:
                return ids


class Retries:
    """The retry budget of one request, shared by the sync and the async client: how long to wait
    before the next attempt, and what an attempt's answer means (ids, retry, or give up)."""

    def __init__(self, policy: ClientPolicy, path: str) -> None:
        self.policy = policy
        self.path = path
        self.deadline = time.monotonic() + policy.retry_for_s
        self.attempt = 0
        self.retry_after = ""
        self.problem = ""

    def delay(self) -> float:
        """Seconds to wait before the next attempt (0 before the first)."""
        self.attempt += 1
        if self.attempt == 1:
            return 0.0
        return min(self.policy.retry_delay(self.attempt - 1, self.retry_after),
                   max(0.0, self.deadline - time.monotonic()))

    def outcome(self, reply: httpx.Response | httpx.TransportError) -> list[str] | None:
        """The accepted ids, or None to retry; ``GatewayError`` when refused or out of retries."""
        if isinstance(reply, httpx.TransportError):
            self.retry_after, self.problem = "", f"{type(reply).__name__}: {reply}"
        elif reply.status_code == 202:
            return [str(i) for i in reply.json()["ids"]]
        elif reply.status_code not in RETRY_STATUSES:
            raise GatewayError(reply.status_code, _body(reply),
                               f"{self.path} answered {reply.status_code}: {reply.text[:2000]}")
        else:
            self.retry_after = reply.headers.get("Retry-After", "")
            self.problem = f"{reply.status_code}: {reply.text[:500]}"
        retries = self.attempt - 1
        if retries == self.policy.max_retries or time.monotonic() >= self.deadline:
            raise GatewayError(None, None, f"{self.path} still failing after {retries} retries in "
                               f"{self.policy.retry_for_s - (self.deadline - time.monotonic()):.1f}s "
                               f"({self.problem})")
        return None


def _body(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return reply.text
