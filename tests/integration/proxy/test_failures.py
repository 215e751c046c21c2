"""Upstream errors, refused connections and aborts mid-stream become failed calls, never proxy crashes."""

from __future__ import annotations

import uuid

import httpx
import pytest

from clawr1.demo.standin.toy import DEFAULT_MODEL
from tests.support.proxy import EmbeddedProxy, Standin, TopicReader, marked


def chat(marker: str, stream: bool = False) -> dict:
    return {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": f"Fail {marker}"}],
        "stream": stream,
    }


def test_upstream_error_status_reaches_the_agent_and_the_record(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    headers = {"x-standin-status": "503"}
    direct = httpx.post(f"{standin.url}/v1/chat/completions", json=chat(marker), headers=headers)
    through = httpx.post(f"{proxy.reverse_url}/v1/chat/completions", json=chat(marker), headers=headers)
    assert (
        (through.status_code, through.content)
        == (direct.status_code, direct.content)
        == (503, direct.content)
    )
    (event,) = events.wait_for(marked(marker))
    assert event.record["response_status"] == 503
    assert event.record["error"] == "HTTP 503: stand-in failure on request" and event.record["choices"] == []


def test_unreachable_upstream_is_a_failed_call(proxy: EmbeddedProxy, events: TopicReader,
                                               dead_port: int) -> None:
    marker = uuid.uuid4().hex
    with httpx.Client(proxy=proxy.explicit_url, trust_env=False) as client:
        response = client.post(f"http://127.0.0.1:{dead_port}/v1/chat/completions", json=chat(marker))
    assert response.status_code == 502
    (event,) = events.wait_for(marked(marker))
    assert event.record["response_status"] is None and event.record["error"]


def test_client_abort_mid_stream_is_recorded_with_what_was_sent(
    proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    with httpx.stream(
        "POST",
        f"{proxy.reverse_url}/v1/chat/completions",
        json=chat(marker, stream=True),
        headers={"x-standin-chunk-delay": "0.3"},
    ) as response:
        first = next(response.iter_lines())
    assert first.startswith("data: ")
    (event,) = events.wait_for(marked(marker))
    record = event.record
    assert record["streamed"] and record["error"] and record["response_status"] == 200
    assert record["choices"] == [] or record["choices"][0]["finish_reason"] is None


def test_upstream_abort_mid_stream_is_recorded_and_the_proxy_keeps_serving(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            f"{proxy.reverse_url}/v1/chat/completions",
            json=chat(marker, stream=True),
            headers={"x-standin-abort-after": "3"},
        ) as response,
    ):
        for _ in response.iter_raw():
            pass
    (event,) = events.wait_for(marked(marker))
    record = event.record
    assert record["error"] and record["choices"][0]["text"].startswith("Choice 0:")
    assert record["choices"][0]["finish_reason"] is None
    after = httpx.post(f"{proxy.reverse_url}/v1/chat/completions", json=chat(uuid.uuid4().hex))
    assert after.status_code == 200
