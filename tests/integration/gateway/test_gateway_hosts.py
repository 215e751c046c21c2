"""Without keys the API answers only loopback Host names (DNS rebinding), and the dashboard page
carries a strict Content-Security-Policy, nosniff and no framing."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from clawr1.core.settings import Settings
from clawr1.dashboard.api import dashboard_page_router, dashboard_router
from tests.support.gateway import LiveGateway, running_gateway
from tests.support.pool import fresh_pool_store

PATHS = ["/healthz", "/dashboard", "/dashboard/assets/app.js", "/v1/dashboard/summary", "/openapi.json"]


@pytest.fixture(scope="module")
def keyless(kafka_bootstrap: str, pool_dsn: str) -> Iterator[LiveGateway]:
    with fresh_pool_store(pool_dsn, "hosts") as store, \
            running_gateway(kafka_bootstrap, routers=[dashboard_router(store)],
                            public_routers=[dashboard_page_router()]) as live:
        yield live


def port(live: LiveGateway) -> int:
    return int(live.url.rsplit(":", 1)[1])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}",
                                  "10.0.0.2:{port}", "localhost.evil.example", "0.0.0.0:{port}"])
def test_a_rebinding_page_is_refused_without_keys(keyless: LiveGateway, path: str, host: str) -> None:
    reply = keyless.http.get(path, headers={"Host": host.format(port=port(keyless))})
    assert reply.status_code == 421, reply.text
    assert reply.json()["error"] == "misdirected_request"
    assert "not a loopback name" in reply.json()["message"] and "DNS-rebinding" in reply.json()["message"]


def test_a_rebinding_page_cannot_submit_either(keyless: LiveGateway) -> None:
    step = {"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2]}
    reply = keyless.http.post("/v1/steps", json=step, headers={"Host": "evil.example"})
    assert reply.status_code == 421
    assert not keyless.read("steps")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "127.5.6.7:{port}",
                                  "[::1]:{port}", "localhost.:{port}"])
def test_loopback_hosts_pass(keyless: LiveGateway, host: str) -> None:
    for path in PATHS:
        assert keyless.http.get(path, headers={"Host": host.format(port=port(keyless))}).status_code == 200


def test_with_keys_any_host_is_served_because_the_key_is_the_defence(kafka_bootstrap: str) -> None:
    with running_gateway(kafka_bootstrap, settings=Settings(api_keys="a:key-a")) as live:
        assert live.http.get("/healthz", headers={"Host": "api.example.org"}).status_code == 200


def test_the_dashboard_forbids_foreign_scripts_framing_and_sniffing(keyless: LiveGateway) -> None:
    for path in ("/dashboard", "/dashboard/assets/app.js", "/dashboard/assets/app.css"):
        headers = keyless.http.get(path).headers
        policy = {d.split()[0]: d.split()[1:] for d in headers["content-security-policy"].split("; ")}
        assert policy["default-src"] == ["'none'"] and policy["script-src"] == ["'self'"], path
        assert policy["frame-ancestors"] == ["'none'"] and policy["connect-src"] == ["'self'"], path
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY", path
    assert keyless.http.get("/v1/dashboard/summary").headers["x-content-type-options"] == "nosniff"


def test_a_request_without_host_is_served(keyless: LiveGateway) -> None:
    """Browsers always send Host; an HTTP/1.0 health probe may not."""
    with socket.create_connection(("127.0.0.1", port(keyless)), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert sock.recv(64).split(b"\r\n", 1)[0].endswith(b" 200 ")
