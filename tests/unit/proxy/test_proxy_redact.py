"""Secrets never reach an event: credential headers and query parameters are dropped."""

from __future__ import annotations

from clawr1.proxy.redact import redact_headers, redact_url


def test_credential_headers_are_dropped_and_the_rest_kept() -> None:
    headers = [
        ("Authorization", "Bearer sk-live-abc"), ("Proxy-Authorization", "Basic dTpw"),
        ("x-api-key", "sk-ant-api03-xyz"), ("api-key", "azure-key"), ("Cookie", "session=1"),
        ("Set-Cookie", "id=2"), ("x-goog-api-key", "AIzaSyA-abcdefghijklmnopqrstuv"),
        ("X-Custom", "Bearer hidden-token"), ("X-Other", "sk-proj-0123456789abcdef0123"),
        ("Content-Type", "application/json"), ("anthropic-version", "2023-06-01"),
        ("x-ratelimit-remaining-tokens", "100"), ("Accept", "a"), ("accept", "b"),
    ]
    assert redact_headers(headers) == {
        "content-type": "application/json", "anthropic-version": "2023-06-01",
        "x-ratelimit-remaining-tokens": "100", "accept": "a, b",
    }


def test_secret_query_parameters_are_removed() -> None:
    url = "https://host/v1/models/x:generate?key=AIza123&alt=sse&access_token=t&api-version=2024"
    assert redact_url(url) == "https://host/v1/models/x:generate?alt=sse&api-version=2024"
    assert redact_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"
