"""The proxy as its own process: proxy authentication in both modes, clean SIGTERM, clear start errors."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from clawr1.core.kafka_io import ensure_topics
from clawr1.core.settings import Settings
from clawr1.demo.standin.toy import DEFAULT_MODEL
from tests.support.ports import free_port
from tests.support.proxy import (
    REPO_ROOT,
    ProxyProcess,
    Standin,
    TopicReader,
    marked,
    settings_env,
)

SECRET = "sk-proj-process-secret-1b2c"


def chat(marker: str) -> dict:
    return {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": f"Auth {marker}"}]}


def test_proxy_auth_guards_both_modes_and_keeps_the_api_key(
    tmp_path: Path, kafka_bootstrap: str, standin: Standin
) -> None:
    topic = f"clawr1.test.proxyauth.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=4)
    settings = Settings(
        data_dir=tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        proxy_port=free_port(),
        reverse_port=free_port(),
        upstream=standin.url,
        proxy_auth="agent:s3cret-pw",
    )
    explicit = f"127.0.0.1:{settings.proxy_port}"
    reverse = f"http://127.0.0.1:{settings.reverse_port}/v1"
    marker = uuid.uuid4().hex
    reader = TopicReader(kafka_bootstrap, topic)
    try:
        with ProxyProcess(settings, topic) as process:
            with httpx.Client(proxy=f"http://{explicit}", trust_env=False) as anonymous:
                assert (
                    anonymous.post(f"{standin.url}/v1/chat/completions", json=chat(marker)).status_code == 407
                )
            with httpx.Client(proxy=f"http://agent:s3cret-pw@{explicit}", trust_env=False) as allowed:
                assert (
                    allowed.post(f"{standin.url}/v1/chat/completions", json=chat(marker)).status_code == 200
                )

            with pytest.raises(openai.APIStatusError) as refused:
                openai.OpenAI(base_url=reverse, api_key=SECRET).chat.completions.create(**chat(marker))
            assert refused.value.status_code == 407
            credentials = "Basic " + base64.b64encode(b"agent:s3cret-pw").decode()
            client = openai.OpenAI(
                base_url=reverse, api_key=SECRET, default_headers={"Proxy-Authorization": credentials}
            )
            assert client.chat.completions.create(**chat(marker)).choices[0].message.content
            upstream = [r for r in standin.engine.received if marker.encode() in r.body][-1]
            assert upstream.headers["authorization"] == f"Bearer {SECRET}"
            assert "proxy-authorization" not in upstream.headers

            found = reader.wait_for(marked(marker), count=2)
            for event in found:
                assert b"s3cret" not in event.value and SECRET.encode() not in event.value
            assert process.stop() == 0
    finally:
        reader.close()


def test_a_busy_port_fails_fast_with_the_reason(tmp_path: Path, kafka_bootstrap: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = Settings(data_dir=tmp_path, kafka_bootstrap=kafka_bootstrap, proxy_port=port)
        result = subprocess.run(
            [sys.executable, "-m", "tests.support.proxy_process", "clawr1.test.unused", "1"],
            cwd=REPO_ROOT,
            env={**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert "could not listen" in result.stderr and f"127.0.0.1:{port}" in result.stderr, result.stderr


def test_a_busy_metrics_port_fails_at_start_naming_its_setting(tmp_path: Path, kafka_bootstrap: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = Settings(data_dir=tmp_path, kafka_bootstrap=kafka_bootstrap, proxy_port=free_port(),
                            proxy_metrics_port=port)
        result = subprocess.run(
            [sys.executable, "-m", "tests.support.proxy_process", "clawr1.test.unused", "1"],
            cwd=REPO_ROOT,
            env={**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"metrics on 127.0.0.1:{port}" in result.stderr, result.stderr
    assert "set CLAWR1_PROXY_METRICS_PORT to a free port" in result.stderr, result.stderr
