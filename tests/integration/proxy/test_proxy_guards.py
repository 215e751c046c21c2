"""The live proxy keeps secrets out of Kafka and refuses to relay to the stack's own ports."""

from __future__ import annotations

import socket
import uuid

import httpx

from clawr1.demo.standin_engine import DEFAULT_MODEL
from tests.integration.proxy.helpers import EmbeddedProxy, Standin, TopicReader, marked

HF = "hf_" + "Q7x" * 12
GITHUB = "ghp_" + "Zk4" * 12
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0.Zm9yZ2VkLXNpZ25hdHVyZQ"
OPAQUE = "Opaque-Metadata-Secret-91"
AGENT_KEY = "sk-proj-agent-key-5c2b9e7d1f0a3"


def test_secrets_in_headers_query_and_bodies_never_reach_kafka(proxy: EmbeddedProxy,
                                                               events: TopicReader) -> None:
    marker = uuid.uuid4().hex
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": f"({marker}) my token is {GITHUB}, use it"}],
        "metadata": {"user": "u1", "auth": {"api_key": OPAQUE}},
    }
    reply = httpx.post(f"{proxy.reverse_url}/v1/chat/completions?code={OPAQUE}&trace={HF}", json=body,
                       headers={"Authorization": f"Bearer {AGENT_KEY}", "X-Note": JWT}, timeout=30)
    assert reply.status_code == 200, reply.text
    [event] = events.wait_for(marked(marker))
    for secret in (HF, GITHUB, JWT, OPAQUE, AGENT_KEY):
        assert secret.encode() not in event.value, secret
    assert "my token is [REDACTED], use it" in event.record["messages_json"]
    assert "x-note" not in event.record["request_headers"] and "code=" not in event.record["url"]


def proxy_status(proxy: EmbeddedProxy, request: bytes) -> bytes:
    """The explicit proxy's answer to ``request``: status line, headers and body."""
    with socket.create_connection(("127.0.0.1", proxy.settings.proxy_port), timeout=10) as sock:
        sock.sendall(request)
        answer = sock.makefile("rb")
        head = b"".join(iter(answer.readline, b"\r\n"))
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return head + answer.read(length)


def test_the_explicit_proxy_refuses_the_stacks_own_ports(proxy: EmbeddedProxy, standin: Standin) -> None:
    kafka_port = int(proxy.settings.bootstrap_servers.rpartition(":")[2])
    for target in (f"127.0.0.1:{kafka_port}", f"localhost:{proxy.settings.api_port}",
                   f"[::1]:{proxy.settings.reverse_port}", f"0.0.0.0:{kafka_port}"):
        answer = proxy_status(proxy, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403"), (target, answer)
        assert b"a port of the Claw-R1 stack itself" in answer, target
    plain = f"http://127.0.0.1:{proxy.settings.reverse_port}/v1/models"
    answer = proxy_status(proxy, f"GET {plain} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403"), answer
    # Any other local service is relayed as before.
    other = standin.url.split("://", 1)[1]
    assert proxy_status(proxy, f"CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n\r\n".encode()).startswith(
        b"HTTP/1.1 200")
