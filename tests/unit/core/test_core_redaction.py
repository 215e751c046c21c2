"""Secrets never reach an event: credential headers and query parameters are dropped; the scan's verdicts
are remembered for the texts a conversation sends again, never at the cost of a new secret."""

from __future__ import annotations

import json

from clawr1.core.redaction import REDACTED, _RecentVerdicts, redact_headers, redact_record, redact_url


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


def test_verdicts_are_remembered_within_their_budget() -> None:
    """A text seen lately is not scanned again; long texts are held within the budget of characters, the
    oldest going first, and one too long to hold is scanned every time."""
    scanned: list[str] = []

    def predicate(text: str) -> bool:
        scanned.append(text)
        return "sk-" in text

    verdicts = _RecentVerdicts(predicate, budget_chars=16 * 1024)
    short, clean, dirty = "role", "x" * 300, "y" * 299 + "sk-"
    assert [verdicts(t) for t in (short, clean, dirty, short, clean, dirty)] == [False, False, True] * 2
    assert scanned == [short, clean, dirty]
    texts = [f"{i:04d}" + "z" * 1000 for i in range(20)]  # 20 x 1,004 characters: more than the budget
    for text in texts:
        verdicts(text)
    scanned.clear()
    for text in reversed(texts[-16:]):  # the newest that fit (16 x 1,004 <= 16,384) are held...
        verdicts(text)
    assert scanned == []
    verdicts(texts[-17])  # ... and no more
    assert scanned == [texts[-17]]
    huge = "h" * 1025  # over a sixteenth of the budget
    scanned.clear()
    verdicts(huge)
    verdicts(huge)
    assert scanned == [huge, huge]


def test_a_secret_in_a_new_turn_is_found_when_the_earlier_turns_were_seen() -> None:
    """Each call of a conversation carries the earlier turns (remembered clean): the token a later turn
    adds is still redacted, in the request body and in the prompt's messages."""
    token = "sk-proj-" + "a1b2c3d4" * 4
    messages = [{"role": "system", "content": "You fix bugs. " * 40},
                {"role": "user", "content": "Go. " * 80}]
    for turn in range(4):
        if turn == 3:
            messages.append({"role": "tool", "content": f"export OPENAI_API_KEY={token}\n" + "ok " * 100})
        else:
            messages.append({"role": "tool", "content": f"output {turn} " * 100})
        record = {"request_body": json.dumps({"model": "m", "messages": messages}),
                  "messages_json": json.dumps(messages)}
        redacted = redact_record(record)
        for field in ("request_body", "messages_json"):
            assert token not in redacted[field]
            assert (REDACTED in redacted[field]) is (turn == 3)
            assert (redacted[field] is record[field]) is (turn < 3)  # nothing to redact: kept as it came


def test_a_value_read_once_is_redacted_as_its_text_would_be() -> None:
    """The record builder hands over the request and prompt it parsed (and the objects they share):
    every record comes out as if each text were read again, secrets in shared objects included."""
    schema = {"password": {"type": "string"}}  # a tool's schema: kept under ``properties`` ...
    shared_secret = {"role": "tool", "content": "ok", "api_key": "opaque-value"}
    requests = [
        {"model": "m", "messages": [{"role": "user", "content": "plain " * 50}]},
        {"model": "m", "messages": [{"role": "user", "content": "plain"}, shared_secret]},
        {"model": "m", "messages": [{"role": "user", "content": "key sk-proj-" + "a1b2c3d4" * 4}]},
        # ... and secret-named wherever else the same object appears (judged once per parent kind)
        {"model": "m", "tools": [{"type": "function",
                                  "function": {"parameters": {"type": "object", "properties": schema}}}],
         "messages": [schema]},
    ]
    for request in requests:
        messages = request["messages"]
        record = {"request_body": json.dumps(request), "messages_json": json.dumps(messages),
                  "response_body": "{}", "capture_notes": []}
        read_again = redact_record(record)
        read_once = redact_record(record, {"request_body": request, "messages_json": messages})
        assert read_once == read_again
        assert "opaque-value" not in read_once["messages_json"]
        assert "sk-proj-" not in read_once["request_body"]
    tuples = {"model": "m", "messages": ({"role": "user", "content": "sk-proj-" + "a1b2c3d4" * 4},)}
    record = {"request_body": json.dumps(tuples), "messages_json": json.dumps(tuples["messages"])}
    assert "sk-proj-" not in redact_record(record, {"messages_json": tuples["messages"]})["messages_json"]
    kept = json.loads(redact_record({"request_body": json.dumps(requests[3])}, {"request_body": requests[3]})
                      ["request_body"])
    assert kept["tools"][0]["function"]["parameters"]["properties"] == schema
    assert kept["messages"] == [{"password": REDACTED}]


def test_the_metadata_hint_gets_the_field_rule() -> None:
    """X-Claw-Metadata (an agent's, or a compat registration's) becomes the step's metadata: its
    secret-named fields are replaced as in any JSON the pool keeps; a clean one is kept as sent."""
    hinted = redact_headers([("X-Claw-Metadata", '{"password": "hunter2xx", "task": "a"}')])
    assert hinted == {"x-claw-metadata": '{"password": "[REDACTED]", "task": "a"}'}
    clean = '{"task":"a","n":1}'
    assert redact_headers([("X-Claw-Metadata", clean)]) == {"x-claw-metadata": clean}
