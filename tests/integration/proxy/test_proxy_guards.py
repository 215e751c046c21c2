"""The live proxy keeps secrets out of Kafka and refuses to relay to the stack's own ports."""

from __future__ import annotations

import json
import socket
import threading
import uuid

import httpx

from clawr1.demo.standin.toy import DEFAULT_MODEL
from tests.support.proxy import EmbeddedProxy, Standin, TopicReader, marked

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


def test_the_placements_of_issue_25_never_reach_kafka(proxy: EmbeddedProxy, events: TopicReader) -> None:
    """Finding 5: a byte search of clawr1.raw.llm found secrets in form and multipart bodies, JSON behind a
    byte-order mark or before trailing bytes, secret-named fields holding a list or an object, headers
    X-Pwd ... X-JWT and X-Forwarded-User: u:S, query parameters pwd, pass, passcode, otp, private and
    ;key=, percent-encoded keys in path and body, a key used as a header name, and a key sent as
    X-Claw-Trajectory-Id as the Kafka message key."""
    marker = uuid.uuid4().hex
    secret = f"Opaque{marker[:6]}Secret"
    key = "sk-proj-" + marker + "Zq7"
    encoded = key.replace("-", "%2D")
    headers = {name: secret for name in ("X-Pwd", "X-Pass", "X-Passcode", "X-Sig", "X-OTP", "X-Creds",
                                         "X-Private", "X-Access", "X-JWT")}
    headers |= {"X-Forwarded-User": f"u:{secret}", key: "1", "X-Claw-Trajectory-Id": key, "X-Note": encoded}
    query = f"a=1;key={secret}&pwd={secret}&pass={secret}&passcode={secret}&otp={secret}&private={secret}"
    document = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": f"({marker}) {encoded}"}],
                "metadata": {"api_key": [secret], "password": {"value": secret}, "auth": {"pass": secret}}}
    bodies = {"bom": "\ufeff" + json.dumps(document), "trailing": json.dumps(document) + "\x00tail",
              "form": f"marker={marker}&api_key={secret}&client_secret={secret}&note={encoded}",
              "multipart": "".join(f'--b\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
                                   for name, value in (("marker", marker), ("api_key", secret))) + "--b--"}
    for body in bodies.values():
        httpx.post(f"{proxy.reverse_url}/v1/{encoded}/chat/completions?{query}", content=body.encode(),
                   headers={**headers, "Content-Type": "application/json"}, timeout=30)
    found = events.wait_for(marked(marker), count=len(bodies))
    assert len(found) == len(bodies)
    for event in found:
        for needle in (secret, key, encoded):
            assert needle.encode() not in event.value, (needle, event.record)
            assert needle not in event.key, event.key
        assert event.key == event.record["trajectory_id"] and event.key.startswith("[REDACTED:")


def test_a_utf16_body_and_a_cut_surrogate_are_recorded_without_their_secrets(
        proxy: EmbeddedProxy, events: TopicReader) -> None:
    """A UTF-16 request was kept decoded as UTF-8 (its key NUL-interleaved, out of every pattern's reach);
    one holding a lone surrogate (JavaScript's escape of text cut inside a pair) was not recorded."""
    marker = uuid.uuid4().hex
    key = "sk-proj-" + marker + "Zq7"
    message = {"role": "user", "content": f"({marker}) {key}"}
    document = json.dumps({"model": DEFAULT_MODEL, "messages": [message]})
    bodies = [document.encode("utf-16"), document.replace(f"({marker})", f"({marker}) \\ud83d").encode()]
    for body in bodies:
        httpx.post(f"{proxy.reverse_url}/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=30)
    found = events.wait_for(marked(marker), count=len(bodies))
    assert len(found) == len(bodies)
    for event in found:
        for needle in (key.encode(), key.encode("utf-16-le"), key.encode("utf-16-be")):
            assert needle not in event.value, event.record["request_body"]
        assert f"({marker})" in json.loads(event.record["messages_json"])[0]["content"]
    assert any("\ufffd" in event.record["messages_json"] for event in found)


def proxy_status(proxy: EmbeddedProxy, request: bytes) -> bytes:
    """The explicit proxy's answer to ``request``: status line, headers and body."""
    with socket.create_connection(("127.0.0.1", proxy.settings.proxy_port), timeout=10) as sock:
        sock.sendall(request)
        answer = sock.makefile("rb")
        head = b"".join(iter(answer.readline, b"\r\n"))
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return head + answer.read(length)


def interface_address() -> str | None:
    """An address of this machine's own network interface (not loopback), if it has one with a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel only picks a route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


class Listener:
    """A TCP service on every address of this machine (a stand-in for Kafka's controller port) that
    counts the connections it gets."""

    def __init__(self) -> None:
        self.server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.server.close()


def test_the_explicit_proxy_reaches_no_port_of_this_machine_but_its_upstreams(
        proxy: EmbeddedProxy, standin: Standin) -> None:
    """Finding 1 of issue 25: CONNECT 127.0.0.1:<kafka port + 1> was relayed (Kafka's controller). Now
    every port here is refused, whatever the spelling, and only the configured upstreams are reached."""
    listener = Listener()
    port = listener.port
    kafka_port = int(proxy.settings.bootstrap_servers.rpartition(":")[2])
    spellings = ["127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.1", "[::1]",
                 "[::ffff:127.0.0.1]", "localhost", "localhost.", "LocalHost", "0.0.0.0", "0", "[::]",
                 "anything.localhost", socket.gethostname(), *filter(None, [interface_address()])]
    try:
        kafka = [f"127.0.0.1:{kafka_port}", f"127.1:{kafka_port}"]
        targets = [*(f"{host}:{port}" for host in spellings), *kafka]
        for target in targets:
            answer = proxy_status(proxy, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403"), (target, answer)
            assert b"refusing to relay" in answer, (target, answer)
        for url in (f"http://127.1:{port}/", f"http://[::1]:{port}/v1/models", f"http://2130706433:{port}/"):
            answer = proxy_status(proxy, f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403"), (url, answer)
        # A tunnel to an upstream cannot be turned toward another port by the Host of a request inside it.
        upstream = standin.url.split("://", 1)[1]
        with socket.create_connection(("127.0.0.1", proxy.settings.proxy_port), timeout=10) as sock:
            sock.sendall(f"CONNECT {upstream} HTTP/1.1\r\nHost: {upstream}\r\n\r\n".encode())
            answer = sock.makefile("rb")
            assert answer.readline().startswith(b"HTTP/1.1 200")
            while answer.readline() != b"\r\n":
                pass
            sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            assert answer.readline().split(b" ")[1] in (b"200", b"403")  # the upstream's answer, or refused
        assert listener.accepted == 0, "the proxy opened a connection to a port of this machine"
    finally:
        listener.close()
    # The upstream (CLAWR1_UPSTREAM) and the host:port entries of CLAWR1_PROXY_ALLOW are reached.
    connect = f"CONNECT {upstream} HTTP/1.1\r\nHost: {upstream}\r\n\r\n".encode()
    assert proxy_status(proxy, connect).startswith(b"HTTP/1.1 200")
    reply = httpx.get(f"{standin.url}/v1/models", proxy=proxy.explicit_url, trust_env=False, timeout=10)
    assert reply.status_code == 200, reply.text


def test_secret_names_in_any_spelling_and_deep_arguments_through_the_live_proxy(
        proxy: EmbeddedProxy, events: TopicReader) -> None:
    """Names the proxy missed (sessionid, SESSID, csrfmiddlewaretoken, tokens, passcodes, authz, sid,
    X-Sessionid, pwd2, ...) never reach Kafka; a history holding 50,000-deep tool-call arguments is
    answered 200 and recorded with them cut and noted (it was dead-lettered)."""
    marker = uuid.uuid4().hex
    secret = f"Opaque{marker[:6]}Secret"
    names = ["sessionid", "jsessionid", "SESSID", "csrfmiddlewaretoken", "tokens", "passcodes", "authz",
             "sid"]
    headers = {name: secret for name in ("X-Sessionid", "X-Authz", "X-Tokens", "X-Passcodes")}
    deep = "[" * 50_000 + "]" * 50_000
    history = [{"role": "user", "content": f"({marker}) go"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "t1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
               {"role": "tool", "tool_call_id": "t1", "content": "done"}]
    document = {"model": DEFAULT_MODEL, "messages": history, "metadata": dict.fromkeys(names, secret),
                "properties": {"password": secret}}
    reply = httpx.post(f"{proxy.reverse_url}/v1/chat/completions?pwd2={secret}&authz={secret}",
                       json=document, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    form = "&".join(f"{name}={secret}" for name in names) + f"&marker={marker}"
    httpx.post(f"{proxy.reverse_url}/v1/chat/completions", content=form.encode(), timeout=30,
               headers={"Content-Type": "application/x-www-form-urlencoded"})
    found = events.wait_for(marked(marker), count=2)
    assert len(found) == 2
    for event in found:
        assert secret.encode() not in event.value, event.record
    [recorded] = [e for e in found if f"({marker}) go" in e.record["messages_json"]]
    assert any("nested deeper than 200 levels" in note for note in recorded.record["capture_notes"])
    assert deep not in recorded.record["messages_json"]
