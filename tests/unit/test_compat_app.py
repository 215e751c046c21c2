"""The compat app in process (no broker needed for what is refused before Kafka): its route x key-kind
matrix, the reward route without a function, and the relay without a reverse port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from clawr1.compat.app import create_compat_app
from clawr1.core.settings import load_settings
from clawr1.gateway.app import create_app
from clawr1.gateway.auth import ROUTE_KINDS
from clawr1.rewards import RewardFnError


def _client(tmp_path: Path, **env: str) -> Iterator[TestClient]:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path), **env})
    app = create_compat_app(settings, create_app(settings).state.gateway)
    with TestClient(app, base_url="http://127.0.0.1:8100") as client:
        yield client


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from _client(tmp_path)


def test_every_compat_route_has_its_key_kinds(tmp_path: Path) -> None:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path)})
    app = create_compat_app(settings, create_app(settings).state.gateway)
    paths = {route.path for route in app.routes if isinstance(route, APIRoute)}
    assert len(paths) == 10
    assert paths <= set(ROUTE_KINDS), sorted(paths - set(ROUTE_KINDS))


def test_compute_reward_without_a_function_is_503(client: TestClient) -> None:
    reply = client.post("/compute_reward", json={"prompt_ids": [1], "response_ids": [2]})
    assert reply.status_code == 503
    assert "CLAWR1_REWARD_FN" in reply.json()["detail"]


def test_a_reward_function_that_cannot_load_fails_at_start(tmp_path: Path) -> None:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path), "CLAWR1_REWARD_FN": "no_such_module:fn"})
    with pytest.raises(RewardFnError, match="no_such_module"):
        create_compat_app(settings, create_app(settings).state.gateway)


def test_agent_calls_without_a_reverse_port_say_what_to_set(client: TestClient) -> None:
    reply = client.post("/t/p/v1/chat/completions", json={"model": "m", "messages": []})
    assert reply.status_code == 503
    assert "CLAWR1_REVERSE_PORT" in reply.json()["detail"]


def test_generate_without_an_engine_is_503(client: TestClient) -> None:
    reply = client.post("/generate", json={"prompt_ids": [1, 2]})
    assert reply.status_code == 503 and "CLAWR1_UPSTREAM" in reply.json()["detail"]


def test_keys_are_required_when_configured(tmp_path: Path) -> None:
    for client in _client(tmp_path, CLAWR1_API_KEYS="a:sk-unit-a:feedback"):
        assert client.post("/init_trajectory").status_code == 401
        refused = client.post("/init_trajectory", headers={"Authorization": "Bearer sk-unit-a"})
        assert refused.status_code == 403 and "steps" in refused.json()["detail"]
