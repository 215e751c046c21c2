"""The compat app in process (no broker needed for what is refused before Kafka): its route x key-kind
matrix, the reward route without a function, and the relay without a reverse port."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from clawr1.compat.app import create_compat_app
from clawr1.core.settings import SettingsError, load_settings
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


@pytest.mark.parametrize("uid", ["caf%C3%A9", "a%0D%0AX-Injected:%201", "nul%00", "sp%20ace", "x" * 257])
def test_malformed_path_ids_are_a_400(client: TestClient, uid: str) -> None:
    """Non-ASCII ids were a 500 (UnicodeEncodeError), CR/LF/NUL ones accepted or a misleading 502."""
    for path in (f"/{uid}/p/v1/register_trajectory", f"/{uid}/p/v1/complete_trajectory",
                 f"/t/{uid}/v1/chat/completions", f"/{uid}/p/v1/messages"):
        reply = client.post(path, json={})
        assert reply.status_code == 400, (path, reply.text)
        assert "malformed id in the path" in reply.json()["detail"]


def test_json_nests_no_deeper_than_on_the_api(client: TestClient) -> None:
    deep = '{"metadata": {"a": ' + "[" * 300 + "]" * 300 + "}}"
    json_type = {"Content-Type": "application/json"}
    reply = client.post("/t/p/v1/register_trajectory", content=deep, headers=json_type)
    assert reply.status_code == 400 and "nests deeper than 200 levels" in reply.json()["detail"], reply.text
    shallow = '{"metadata": {"a": ' + "[" * 100 + "]" * 100 + "}}"
    assert client.post("/t/p/v1/register_trajectory", content=shallow, headers=json_type).status_code == 200


def test_registration_metadata_is_capped(tmp_path: Path) -> None:
    for client in _client(tmp_path, CLAWR1_COMPAT_MAX_METADATA_BYTES="1024"):
        reply = client.post("/t/p/v1/register_trajectory", json={"metadata": {"blob": "x" * 2000}})
        assert reply.status_code == 413 and "CLAWR1_COMPAT_MAX_METADATA_BYTES" in reply.json()["detail"]
        small = {"metadata": {"blob": "x" * 900}}
        assert client.post("/t/p/v1/register_trajectory", json=small).status_code == 200


def test_base_urls_come_from_the_configured_public_url_never_from_host(tmp_path: Path) -> None:
    for client in _client(tmp_path):
        body = client.post("/init_trajectory", headers={"Host": "localhost:8100"}).json()
        assert body["base_url"] == f"http://127.0.0.1:8100/{body['trajectory_uid']}/{body['trajectory_uid']}/v1"
    for client in _client(tmp_path, CLAWR1_COMPAT_PUBLIC_URL="https://rl.example.org/compat/"):
        body = client.post("/init_trajectory", headers={"Host": "localhost:1"},
                           json={"prompt_uid": "g"}).json()
        assert body["base_url"] == f"https://rl.example.org/compat/{body['trajectory_uid']}/g/v1"
    with pytest.raises(SettingsError, match="CLAWR1_COMPAT_PUBLIC_URL"):
        next(_client(tmp_path, CLAWR1_COMPAT_PUBLIC_URL="rl.example.org"))


@pytest.mark.parametrize("compat", [True, False])
def test_docs_load_nothing_from_another_origin(tmp_path: Path, compat: bool) -> None:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path)})
    api = create_app(settings)
    app = create_compat_app(settings, api.state.gateway) if compat else api
    with TestClient(app, base_url="http://127.0.0.1:8100") as client:
        page = client.get("/docs")
        assert page.status_code == 200 and "SwaggerUIBundle" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert sources and not [s for s in sources if "//" in s], sources
        for source in sources:
            asset = client.get(f"/{source}")
            assert asset.status_code == 200 and asset.content, source
        assert client.get("/docs/assets/index.html").status_code == 404
