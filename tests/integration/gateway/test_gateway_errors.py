"""Bad requests get the documented 4xx with a JSON body naming the field and the reason, and
nothing of a rejected request reaches Kafka."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.support.gateway import LiveGateway

GOOD = {"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2]}


@pytest.mark.parametrize(("path", "body", "status", "error", "field"), [
    ("/v1/steps", {**GOOD, "trajectory_id": None}, 422, "invalid_request", "trajectory_id"),
    ("/v1/steps", {k: v for k, v in GOOD.items() if k != "step_index"}, 422, "invalid_request", "step_index"),
    ("/v1/steps", {**GOOD, "prompt_token_ids": [1, -5]}, 422, "invalid_request", "prompt_token_ids[1]"),
    ("/v1/steps", {**GOOD, "prompt_token_ids": [1.5]}, 422, "invalid_request", "prompt_token_ids[0]"),
    ("/v1/steps", {**GOOD, "response_token_ids": [2**31]}, 422, "invalid_request", "response_token_ids[0]"),
    ("/v1/steps", {**GOOD, "response_logprobs": [-1.0, -2.0]}, 422, "invalid_request", "response_logprobs"),
    ("/v1/steps", {**GOOD, "surprise": 1}, 422, "invalid_request", "surprise"),
    ("/v1/steps", [GOOD, {**GOOD, "step_index": "1"}], 422, "invalid_request", "[1].step_index"),
    ("/v1/steps", [GOOD] * 21, 413, "batch_too_large", None),
    ("/v1/steps", [], 422, "invalid_request", ""),
    ("/v1/feedback", {"reward": 1.0}, 422, "invalid_request", "step_id"),
    ("/v1/feedback", {"step_id": "s", "reward": float("inf")}, 400, "malformed_json", None),
    ("/v1/events", {"kind": "turn", "trajectory_id": "t", "payload": {"response_text": "x"}}, 422,
     "invalid_request", "payload.prompt_messages"),
    ("/v1/events", {"kind": "x", "trajectory_id": "t", "timestamp_ms": -1}, 422, "invalid_request",
     "timestamp_ms"),
])
def test_bad_input_is_refused_with_the_field_and_reason(gateway: LiveGateway, path: str, body: Any,
                                                        status: int, error: str, field: str | None) -> None:
    reply = gateway.http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    payload = reply.json()
    assert payload["error"] == error and payload["message"]
    if field is not None:
        assert field in {e["field"] for e in payload["errors"]}
        assert all(e["reason"] and e["type"] for e in payload["errors"])


@pytest.mark.parametrize("raw", [b"{", b'{"trajectory_id": "t",}', b"\xff", b""])
def test_malformed_json_is_400(gateway: LiveGateway, raw: bytes) -> None:
    reply = gateway.http.post("/v1/steps", content=raw, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"] == "malformed_json"


def test_non_json_content_type_is_415(gateway: LiveGateway) -> None:
    reply = gateway.http.post("/v1/steps", content=json.dumps(GOOD), headers={"Content-Type": "text/plain"})
    assert reply.status_code == 415 and reply.json()["error"] == "unsupported_media_type"
    vendor = gateway.http.post("/v1/steps", content=json.dumps(GOOD),
                               headers={"Content-Type": "application/vnd.clawr1+json; charset=utf-8"})
    assert vendor.status_code == 202


def test_body_over_the_size_limit_is_413(gateway: LiveGateway) -> None:
    big = {**GOOD, "response_text": "x" * (64 * 1024)}
    reply = gateway.http.post("/v1/steps", json=big)
    assert reply.status_code == 413
    assert reply.json()["error"] == "payload_too_large" and "65536 bytes" in reply.json()["message"]

    def chunked() -> Any:
        yield json.dumps(big).encode()

    streamed = gateway.http.post("/v1/steps", content=chunked(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413


def test_invalid_idempotency_key_header_is_422(gateway: LiveGateway) -> None:
    reply = gateway.http.post("/v1/steps", json=GOOD, headers={"Idempotency-Key": "k" * 256})
    assert reply.status_code == 422 and reply.json()["errors"][0]["field"] == "Idempotency-Key"


def test_unknown_route_and_method_use_the_error_shape(gateway: LiveGateway) -> None:
    missing = gateway.http.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    wrong = gateway.http.get("/v1/steps")
    assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"


def test_a_batch_with_one_bad_item_produces_nothing(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    good = {**GOOD, "trajectory_id": traj}
    bad = {**good, "step_index": 1, "response_logprobs": [0.0, 0.0]}
    reply = gateway.http.post("/v1/steps", json=[good, bad])
    assert reply.status_code == 422
    assert reply.json()["errors"][0]["field"] == "[1].response_logprobs"
    assert reply.json()["errors"][0]["type"] == "length_mismatch"
    assert [k for k, _ in gateway.read("steps") if k == traj] == []
