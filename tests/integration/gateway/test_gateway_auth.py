"""With API keys set, every submission needs a valid Bearer key allowed for its kind, and the source
name on the record comes from the key; without keys the API refuses to serve off loopback."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from clawr1.core.settings import Settings
from clawr1.gateway.app import create_app
from clawr1.gateway.server import InsecureBindError, serve
from tests.support.gateway import LiveGateway, running_gateway
from tests.support.ports import free_port

KEYS = "trainer:key-trainer-1:steps|feedback,svc:key-svc-2:events,rater:key-rater-3:feedback"


@pytest.fixture(scope="module")
def secured(kafka_bootstrap: str) -> Iterator[LiveGateway]:
    with running_gateway(kafka_bootstrap, settings=Settings(api_keys=KEYS)) as live:
        yield live


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def step(traj: str) -> dict[str, object]:
    return {"trajectory_id": traj, "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2]}


def test_missing_or_wrong_keys_are_401(secured: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    for headers in ({}, bearer("nope"), bearer("key-trainer-"), {"Authorization": "Basic a2V5"},
                    {"Authorization": "key-trainer-1"}):
        reply = secured.http.post("/v1/steps", json=step(traj), headers=headers)
        assert reply.status_code == 401, headers
        assert reply.json()["error"] == "unauthorized" and reply.headers["www-authenticate"] == "Bearer"
    assert [k for k, _ in secured.read("steps") if k == traj] == []


def test_keys_are_limited_to_their_kinds(secured: LiveGateway) -> None:
    event = {"kind": "user_action", "trajectory_id": "t", "payload": {}}
    refused = secured.http.post("/v1/events", json=event, headers=bearer("key-trainer-1"))
    assert refused.status_code == 403
    assert "'trainer' may not use /v1/events: it needs a key of kind events" in refused.json()["message"]
    assert secured.http.post("/v1/steps", json=step("t"), headers=bearer("key-rater-3")).status_code == 403
    assert secured.http.post("/v1/events", json=event, headers=bearer("key-svc-2")).status_code == 202


def test_source_name_comes_from_the_key_never_the_body(secured: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    spoof = secured.http.post("/v1/steps", json={**step(traj), "source_name": "admin"},
                              headers=bearer("key-trainer-1"))
    assert spoof.status_code == 422 and spoof.json()["errors"][0]["field"] == "source_name"
    assert secured.http.post("/v1/steps", json=step(traj), headers=bearer("key-trainer-1")).status_code == 202
    feedback = {"trajectory_id": traj, "reward": 1.0, "source": "human"}
    assert secured.http.post("/v1/feedback", json=feedback, headers=bearer("key-rater-3")).status_code == 202
    [(_, record)] = [(k, r) for k, r in secured.read("steps") if k == traj]
    assert record["source_name"] == "trainer"
    [(_, fb)] = [(k, r) for k, r in secured.read("feedback") if k == traj]
    assert fb["source_name"] == "rater" and fb["source"] == "human"
    for _, produced in secured.read("steps") + secured.read("feedback"):
        assert not any("key-" in str(value) for value in produced.values())


def test_idempotency_keys_are_scoped_per_source(secured: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    feedback = {"trajectory_id": traj, "reward": 0.5}
    shared = {"Idempotency-Key": "same-key"}
    first = secured.http.post("/v1/feedback", json=feedback, headers={**shared, **bearer("key-trainer-1")})
    second = secured.http.post("/v1/feedback", json=feedback, headers={**shared, **bearer("key-rater-3")})
    assert first.status_code == second.status_code == 202 and "idempotent-replayed" not in second.headers
    assert sorted(r["source_name"] for k, r in secured.read("feedback") if k == traj) == ["rater", "trainer"]


def test_health_and_spec_need_no_key(secured: LiveGateway) -> None:
    assert secured.http.get("/healthz").status_code == 200
    spec = secured.http.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_serving_off_loopback_without_keys_is_refused() -> None:
    app = create_app(Settings())
    with pytest.raises(InsecureBindError, match="without API keys"):
        asyncio.run(serve(app, "0.0.0.0", free_port(), asyncio.Event()))
