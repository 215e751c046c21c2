"""Issue 25's findings on the compat port and the stack's proxy, tried as an attacker would on the live
stack: each failed before its fix."""

from __future__ import annotations

import re
import socket
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.compat.conftest import KEYS, Stack, auth


def _post(stack: Stack, path: str, key: str = "agent", **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{stack.compat}{path}", headers={**auth(key), **kwargs.pop("headers", {})},
                      timeout=60, **kwargs)


def _chat(base_url: str, key: str, **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "name a colour"}], "max_tokens": 8}
    return httpx.post(f"{base_url}/chat/completions", json=body, headers={**auth(key), **headers}, timeout=60)


def test_a_trajectory_belongs_to_the_key_that_created_it(stack: Stack) -> None:
    """Finding 2: a second key re-registered someone's trajectory (policy version 999, ground truth
    replaced), continued it and completed it with reward 1.0; relayed steps named the proxy."""
    created = _post(stack, "/init_trajectory", json={"prompt_uid": "g"}).json()
    trajectory, base = created["trajectory_uid"], created["base_url"]
    path = base.split("/", 3)[3]
    owned = {"metadata": {"policy_version": 3, "ground_truth": "blue"}}
    assert _post(stack, f"/{path}/register_trajectory", json=owned).status_code == 200
    assert _chat(base, "agent").status_code == 200

    forged = {"channel": "val", "metadata": {"policy_version": 999, "ground_truth": "forged"}}
    refusals = [_post(stack, f"/{path}/register_trajectory", key="intruder", json=forged),
                _chat(base, "intruder", **{"X-Claw-Terminal": "true", "X-Claw-Agent": "evil"}),
                _post(stack, f"/{path}/complete_trajectory", key="intruder", json={"reward": 1.0}),
                _post(stack, "/submit_steps", key="intruder", json={"steps": [
                    {"prompt_ids": [1], "response_ids": [2], "trajectory_uid": trajectory, "reward": 1.0}]})]
    for refused in refusals:
        assert refused.status_code == 403, refused.text
        assert "belongs to another API key" in refused.json()["detail"]
    # A trajectory id nobody used yet is claimed by its first user, whichever route that is.
    fresh = f"fresh-{uuid.uuid4().hex[:8]}"
    assert _post(stack, f"/{fresh}/p/v1/complete_trajectory", key="intruder", json={}).status_code == 200
    assert _post(stack, f"/{fresh}/p/v1/register_trajectory", json={}).status_code == 403

    assert _post(stack, f"/{path}/complete_trajectory", json={"reward": 0.25}).status_code == 200
    rows = stack.wait_rows(
        "SELECT source_name, policy_version, channel, trajectory_reward, terminal, agent FROM steps "
        f"WHERE trajectory_id = '{trajectory}'",
        lambda rows: bool(rows) and rows[0]["trajectory_reward"] is not None)
    # The owner's one call, its registration and reward: nothing of the intruder's.
    assert rows == [{"source_name": "agent", "policy_version": 3, "channel": "train",
                     "trajectory_reward": 0.25, "terminal": 1, "agent": None}]


@pytest.mark.parametrize("uid", ["caf%C3%A9", "t%0D%0AX-Claw-Terminal:%20true", "nul%00id", "x" * 300])
def test_malformed_ids_are_a_400_on_every_route(stack: Stack, uid: str) -> None:
    """Finding 6: non-ASCII trajectory ids were a 500, CR/LF/NUL ones accepted by register and complete
    and a misleading 502 on agent calls."""
    for path in (f"/{uid}/p/v1/register_trajectory", f"/{uid}/p/v1/complete_trajectory",
                 f"/{uid}/p/v1/chat/completions", f"/t/{uid}/v1/messages"):
        reply = _post(stack, path, json={})
        assert reply.status_code == 400, (path, reply.text)
        assert "malformed id in the path" in reply.json()["detail"]


def test_non_ascii_header_values_are_relayed_as_sent(stack: Stack) -> None:
    """Finding 6: a UTF-8 header value on an agent call was a 500 (UnicodeEncodeError)."""
    created = _post(stack, "/init_trajectory").json()
    headers = [(b"X-Agent-Note", "café → 東京".encode()),
               (b"Authorization", f"Bearer {KEYS['agent']}".encode())]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(f"{created['base_url']}/chat/completions", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text


def test_registration_metadata_is_capped(stack: Stack) -> None:
    """Finding 7: 3.9 MB of metadata per registration was kept (the registry grew to 45 MB from ten)."""
    reply = _post(stack, f"/{uuid.uuid4().hex}/p/v1/register_trajectory",
                  json={"metadata": {"blob": "x" * 70_000}})
    assert reply.status_code == 413 and "CLAWR1_COMPAT_MAX_METADATA_BYTES" in reply.json()["detail"]


def test_json_nests_no_deeper_than_on_the_api(stack: Stack) -> None:
    """Finding 8: the compat port took JSON ~900 levels deep, the API stops near 200."""
    deep = '{"metadata": {"a": ' + "[" * 300 + "]" * 300 + "}}"
    headers = {"Content-Type": "application/json"}
    reply = _post(stack, f"/{uuid.uuid4().hex}/p/v1/register_trajectory", content=deep, headers=headers)
    assert reply.status_code == 400, reply.text
    api = httpx.post(f"{stack.api}/v1/steps", content=deep, timeout=30,
                     headers={**headers, "Authorization": f"Bearer {KEYS['agent']}"})
    assert api.status_code == 400, api.text


@pytest.mark.parametrize("port", ["api", "compat"])
def test_docs_load_nothing_from_a_cdn(stack: Stack, port: str) -> None:
    """Finding 8: /docs loaded its script and style from a CDN."""
    base = stack.api if port == "api" else stack.compat
    page = httpx.get(f"{base}/docs", timeout=30)
    assert page.status_code == 200, page.text
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all("//" not in source for source in sources), sources
    assert all(httpx.get(f"{base}/{source}", timeout=30).status_code == 200 for source in sources)


def test_the_stacks_proxy_reaches_no_port_of_the_broker(stack: Stack) -> None:
    """Finding 1: CONNECT 127.0.0.1:<kafka port + 1> was relayed to Kafka's controller, and raw
    CreateTopics/DeleteTopics went through the tunnel."""
    for port in (stack.kafka_port + 1, stack.kafka_port):
        for host in ("127.0.0.1", "127.1", "localhost", "[::ffff:127.0.0.1]"):
            with socket.create_connection(("127.0.0.1", stack.proxy_port), timeout=10) as sock:
                sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
                status = sock.makefile("rb").readline()
            assert status.startswith(b"HTTP/1.1 403"), (host, port, status)
    # The engine, CLAWR1_UPSTREAM, stays reachable through the explicit proxy.
    models = httpx.get(f"{stack.engine}/v1/models", proxy=f"http://127.0.0.1:{stack.proxy_port}",
                       trust_env=False, timeout=30)
    assert models.status_code == 200, models.text
