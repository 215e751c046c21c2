"""Client protocol: batching, one Idempotency-Key per batch kept across retries, Retry-After, errors.

The gateway side is played by recorded HTTP answers (httpx.MockTransport); the live gateway is
exercised by tests/integration/gateway/test_gateway_client_live.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable

import httpx
import numpy
import pytest

from clawr1.gateway.client import GatewayClient, GatewayError, json_body, orjson


def client(handler: Callable[[httpx.Request], httpx.Response], **kwargs: object) -> GatewayClient:
    return GatewayClient("http://gw", "key-1", transport=httpx.MockTransport(handler), backoff_s=0.0,
                         max_backoff_s=0.01, **kwargs)  # type: ignore[arg-type]


def accepted(request: httpx.Request) -> httpx.Response:
    items = json.loads(request.content)
    return httpx.Response(202, json={"accepted": len(items), "ids": [f"id-{i['step_index']}" for i in items]})


def test_steps_are_sent_in_batches_with_auth_and_distinct_keys() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return accepted(request)

    steps = [{"trajectory_id": "t", "step_index": i} for i in range(5)]
    with client(handler, batch_size=2) as c:
        assert c.submit_steps(steps) == [f"id-{i}" for i in range(5)]
    assert [len(json.loads(r.content)) for r in seen] == [2, 2, 1]
    assert {r.headers["authorization"] for r in seen} == {"Bearer key-1"}
    assert len({r.headers["idempotency-key"] for r in seen}) == 3


def test_retries_reuse_the_idempotency_key() -> None:
    answers = iter([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "kafka_unavailable"}),
                    httpx.Response(409, json={"error": "idempotency_in_flight"})])
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        return next(answers, None) or accepted(request)

    with client(handler) as c:
        assert c.submit_step({"trajectory_id": "t", "step_index": 7}) == "id-7"
    assert len(keys) == 3 and len(set(keys)) == 1


def test_transport_errors_are_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        return accepted(request)

    with client(handler) as c:
        assert c.submit_steps([{"trajectory_id": "t", "step_index": 1}]) == ["id-1"]
    assert calls == 2


def test_client_errors_are_raised_with_the_body() -> None:
    body = {"error": "invalid_request", "message": "1 invalid field(s)",
            "errors": [{"field": "step_index", "reason": "Field required", "type": "missing"}]}
    with client(lambda request: httpx.Response(422, json=body)) as c, pytest.raises(GatewayError) as error:
        c.submit_feedback({"step_id": "s"})
    assert error.value.status == 422 and error.value.body == body


def test_gives_up_after_max_retries() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, json={"error": "kafka_unavailable", "message": "down"})

    with client(handler, max_retries=2) as c, pytest.raises(GatewayError, match="after 2 retries"):
        c.submit_events([{"kind": "x", "trajectory_id": "t"}])
    assert calls == 3


def test_retry_delay_backs_off_and_honors_retry_after() -> None:
    """The jitter pinned to the top of its range: each delay is its ceiling."""
    c = GatewayClient("http://gw", backoff_s=0.5, max_backoff_s=5.0)
    c.backoff = dataclasses.replace(c.backoff, jitter=lambda: 1.0)
    assert [c.retry_delay(n, "") for n in (1, 2, 3, 6)] == [0.5, 1.0, 2.0, 5.0]
    assert c.retry_delay(1, "3") == 3.0
    assert c.retry_delay(1, "60") == 5.0
    assert c.retry_delay(3, "1") == 2.0
    assert c.retry_delay(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.5
    c.close()


def test_retry_delays_are_jittered_under_the_backoff() -> None:
    c = GatewayClient("http://gw", backoff_s=0.5, max_backoff_s=5.0)
    delays = [c.retry_delay(3, "") for _ in range(100)]
    assert all(0.0 <= d <= 2.0 for d in delays) and len(set(delays)) > 50
    assert all(c.retry_delay(3, "3") == 3.0 for _ in range(20))
    c.close()


def test_a_restarting_gateway_is_retried_with_the_same_key_until_it_answers() -> None:
    """Refused connections, then a connection cut mid-request (the API killed between produce and
    reply), then the answer: the same Idempotency-Key on every attempt."""
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        if len(keys) <= 12:
            raise httpx.ConnectError("connection refused", request=request)
        if len(keys) == 13:
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        return accepted(request)

    with client(handler) as c:
        assert c.submit_step({"trajectory_id": "t", "step_index": 3}) == "id-3"
    assert len(keys) == 14 and len(set(keys)) == 1


def test_retries_are_bounded_in_total_time() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    c = GatewayClient("http://gw", transport=httpx.MockTransport(handler), backoff_s=0.05, max_backoff_s=0.1,
                      retry_for_s=0.5)
    with c, pytest.raises(GatewayError, match=r"still failing after \d+ retries in 0\.[5-9]s \(ConnectError"):
        c.submit_events([{"kind": "x", "trajectory_id": "t"}])


@pytest.mark.parametrize("body", [
    [{"trajectory_id": "t", "step_index": 0, "prompt_token_ids": list(range(40)),
      "response_logprobs": [-0.5, -1e-05, -123.456789012345, 0.0], "reward": 1.0}],
    [{"text": "naïve ✓ \u2028 \"quoted\" \\ back", "nested": {"a": [1, 2.5, True, False]}}],
])
def test_the_body_is_the_json_httpx_would_send(body: list[dict[str, object]]) -> None:
    assert orjson is not None, "the development install has orjson (the gateway extra): this is its path"
    as_httpx = httpx.Request("POST", "http://gw", json=body).content
    assert json.loads(json_body(body)) == json.loads(as_httpx) == body


@pytest.mark.parametrize("body", [
    [{"reward": None, "logprobs": [1e308, 1e308]}],  # a null, and a list whose sum overflows
    [{"big": 2**70}],  # over 64 bits: orjson refuses it
    [{"reward": numpy.float64(0.75), "value": numpy.float64(-1e-05)}],  # a float to the standard library
])
def test_what_orjson_cannot_tell_or_write_goes_the_standard_way(body: list[dict[str, object]]) -> None:
    assert json_body(body) == httpx.Request("POST", "http://gw", json=body).content


def test_what_the_standard_library_refuses_is_refused() -> None:
    @dataclasses.dataclass
    class Step:
        step_index: int

    for body in ([Step(1)], [{"at": datetime.datetime(2026, 12, 3)}], [{"reward": numpy.float32(0.5)}]):
        with pytest.raises(TypeError, match="not JSON serializable"):
            json_body(body)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("feedback", [
    {"step_id": "s", "reward": NAN}, {"step_id": "s", "reward": INF}, {"step_id": "s", "reward": -INF},
    {"step_id": "s", "reward": None, "logprobs": [-0.5, NAN, 2]},  # a null beside it, in a list of numbers
    {"step_id": "s", "logprobs": [1, INF, -INF]},  # a sum that is NaN
    {"step_id": "s", "reward": None, "payload": [{"scores": ("a", [[-INF]])}]},  # deep in mixed lists
])
def test_a_non_finite_number_fails_in_the_client_not_as_a_null(feedback: dict[str, object]) -> None:
    requests: list[httpx.Request] = []
    with client(lambda r: requests.append(r) or accepted(r)) as c, pytest.raises(ValueError, match="JSON"):
        c.submit_feedback(feedback)
    assert requests == []


def test_a_retry_sends_the_same_bytes_as_json() -> None:
    bodies: list[tuple[str, bytes]] = []
    answers = iter([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "kafka_unavailable"})])

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append((request.headers["content-type"], request.content))
        return next(answers, None) or accepted(request)

    steps = [{"trajectory_id": "t", "step_index": 3, "response_logprobs": [-0.25]}]
    with client(handler) as c:
        assert c.submit_steps(steps) == ["id-3"]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert bodies[0][0] == "application/json" and json.loads(bodies[0][1]) == steps
