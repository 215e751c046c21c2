"""Explicit proxy with HTTPS interception: agents change only HTTPS_PROXY (and trust the proxy's CA)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from clawr1.demo.standin.toy import DEFAULT_MODEL, make_reply, render_prompt
from tests.support.proxy import EmbeddedProxy, Standin, TopicReader, client_context, marked

SECRET = "sk-proj-explicit-secret-77aa"


@pytest.fixture
def via_https_proxy(monkeypatch: pytest.MonkeyPatch, proxy: EmbeddedProxy) -> None:
    """What an agent's environment needs: the proxy, and the proxy's CA as its trust store."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy.explicit_url)
    monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca))


def direct_http(cert: Path) -> httpx.Client:
    return httpx.Client(verify=client_context(cert), trust_env=False)


@pytest.mark.usefixtures("via_https_proxy")
def test_openai_sdk_through_https_proxy(
    tls_standin: Standin, standin_cert: tuple[Path, Path], proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    messages = [{"role": "user", "content": f"Intercept {marker}"}]
    base = f"{tls_standin.url}/v1"
    direct = openai.OpenAI(base_url=base, api_key=SECRET, http_client=direct_http(standin_cert[0]))
    proxied = openai.OpenAI(base_url=base, api_key=SECRET)
    assert (
        proxied.chat.completions.create(model=DEFAULT_MODEL, messages=messages).model_dump()
        == direct.chat.completions.create(model=DEFAULT_MODEL, messages=messages).model_dump()
    )
    request = {"model": DEFAULT_MODEL, "messages": messages, "stream": True}
    assert [c.model_dump() for c in proxied.chat.completions.create(**request)] == [
        c.model_dump() for c in direct.chat.completions.create(**request)
    ]

    found = events.wait_for(marked(marker), count=2)
    reply = make_reply([DEFAULT_MODEL, messages], 0, (), True, None)
    for event in found:
        record = event.record
        assert record["upstream"] == tls_standin.url and record["url"] == f"{base}/chat/completions"
        assert record["prompt_token_ids"] == render_prompt(messages)
        assert record["choices"][0]["token_ids"] == reply.token_ids()
        assert SECRET.encode() not in event.value


@pytest.mark.usefixtures("via_https_proxy")
def test_anthropic_sdk_through_https_proxy(
    tls_standin: Standin, standin_cert: tuple[Path, Path], events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    request = {
        "model": "claude-standin",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": marker}],
    }
    direct = anthropic.Anthropic(
        base_url=tls_standin.url, api_key=SECRET, http_client=direct_http(standin_cert[0])
    )
    proxied = anthropic.Anthropic(base_url=tls_standin.url, api_key=SECRET)
    with proxied.messages.stream(**request) as through, direct.messages.stream(**request) as reference:
        assert [e.model_dump() for e in through] == [e.model_dump() for e in reference]
    (event,) = events.wait_for(marked(marker))
    assert event.record["api"] == "anthropic.messages" and event.record["streamed"]
    assert SECRET.encode() not in event.value


def test_httpx_and_curl_with_explicit_proxy_settings(
    tls_standin: Standin, standin_cert: tuple[Path, Path], proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    url = f"{tls_standin.url}/v1/completions"
    body = {"model": DEFAULT_MODEL, "prompt": f"Story {marker}", "stream": True}
    with httpx.Client(proxy=proxy.explicit_url, verify=client_context(proxy.ca), trust_env=False) as client:
        through = client.post(url, json=body).content
    assert through == direct_http(standin_cert[0]).post(url, json=body).content

    def curl(*args: str) -> bytes:
        return subprocess.run(
            [
                "curl",
                "-sS",
                "-N",
                *args,
                url,
                "-H",
                "content-type: application/json",
                "-d",
                json.dumps({**body, "stream": False}),
            ],
            check=True,
            capture_output=True,
            timeout=30,
            env={},
        ).stdout

    assert curl("-x", proxy.explicit_url, "--cacert", str(proxy.ca)) == curl("--cacert", str(standin_cert[0]))
    found = events.wait_for(marked(marker), count=2)
    assert {e.record["api"] for e in found} == {"openai.completions"}
    assert all(e.record["token_source"] == "engine" for e in found)
