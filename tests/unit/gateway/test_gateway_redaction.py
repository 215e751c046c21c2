"""Secrets posted to the white-box ways in (``POST /v1/steps`` on both of its paths, ``/v1/events``,
``/v1/feedback``, the compat port's ``/submit_steps``) never reach the bytes produced to Kafka: the same
names and shapes the capture proxy and the OTLP routes keep out. Clean submissions are produced as they
came, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from clawr1.compat.app import create_compat_app
from clawr1.core.redaction import REDACTED, REDACTED_WITH_TOKEN_IDS, redact_id
from clawr1.core.settings import load_settings
from clawr1.gateway.app import create_app
from clawr1.gateway.fastpath import pack_steps
from clawr1.gateway.publisher import OutMessage
from clawr1.gateway.records import compact_json
from clawr1.gateway.redacting import redact_step

OPENAI = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1"
PROJECT = "sk-proj-" + "a1B2c3D4" * 5
GITHUB = "ghp_" + "x1Y2" * 9
CREDENTIAL = "abcdef0123456789abcdef"
BEARER = f"Bearer {CREDENTIAL}"
USERINFO = "USERINFOPW1"
URL = f"https://bob:{USERINFO}@git.example.com/repo.git"
# Values whose only sign of being secret is the name they are stored under.
NAMED = {"api_key": "OPAQUEAPIKEY77", "password": "HUNTER2PASSWORD9", "token": "OPAQUETOKEN55",
         "client_secret": "OPAQUECLIENT31"}
NEEDLES = (OPENAI, PROJECT, GITHUB, CREDENTIAL, USERINFO, *NAMED.values())


class Captured:
    """The publisher's part the routes use: every message they produce, kept."""

    def __init__(self) -> None:
        self.messages: list[OutMessage] = []

    def partitions_of(self, _topic: str) -> int:
        return 2

    async def publish(self, messages: Sequence[OutMessage]) -> None:
        self.messages += messages

    def records(self) -> list[dict[str, Any]]:
        return [record for message in self.messages for record in message.records]

    def assert_clean(self) -> None:
        assert self.messages
        for message in self.messages:
            for needle in NEEDLES:
                assert needle.encode() not in message.value, needle
                assert message.key is None or needle not in str(message.key), needle


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Captured]]:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path)})
    app = create_app(settings)
    captured = Captured()
    app.state.gateway.publisher = captured  # the routes' Kafka; the lifespan (a real producer) is not run
    yield TestClient(app, base_url="http://127.0.0.1"), captured


def secret_step(**fields: Any) -> dict[str, Any]:
    """A step with a secret in every text field, id and name."""
    return {
        "trajectory_id": f"t:{PROJECT}", "step_id": f"s:{OPENAI}", "prompt_group_id": f"g {GITHUB}",
        "step_index": 0, "model": f"m {OPENAI}", "agent": f"agent {GITHUB}",
        "prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5], "response_logprobs": [-0.5, -0.25],
        "prompt_messages": [
            {"role": "system", "content": f"use {BEARER} and {URL}"},
            {"role": "user", "content": [{"type": "text", "text": f"my key is {OPENAI}"},
                                        {"type": "blob", **NAMED}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "login", "arguments": json.dumps({"password": NAMED["password"], "user": "bob"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": f"logged in; token {GITHUB}"},
        ],
        "response_text": f"api_key={NAMED['api_key']}&note={PROJECT}",  # a form text: the name rule
        "metadata": {**NAMED, "nested": {"auth": {"pass": "x"}, "url": URL, PROJECT: 1},
                     "note": f"{BEARER}", "list": [{"refresh_token": NAMED["token"]}]},
        **fields,
    }


def test_a_step_with_secrets_everywhere_is_produced_without_them_on_both_paths(
        api: tuple[TestClient, Captured]) -> None:
    client, captured = api
    assert pack_steps([secret_step()], "s", 1) is not None  # the fast path takes it
    assert pack_steps([secret_step(prompt_token_ids=[1.0, 2, 3])], "s", 1) is None
    fast = client.post("/v1/steps", json=secret_step())
    model = client.post("/v1/steps", json=secret_step(prompt_token_ids=[1.0, 2, 3]))  # 1.0: the model path
    assert fast.status_code == model.status_code == 202, (fast.text, model.text)
    captured.assert_clean()
    by_fast, by_model = captured.records()
    for name in ("received_at_ms",):
        by_fast.pop(name), by_model.pop(name)
    assert by_fast == by_model  # both paths redact alike: the same ids, digest and bytes
    assert fast.json()["ids"] == model.json()["ids"] == [redact_id(f"s:{OPENAI}")]
    assert by_fast["trajectory_id"] == redact_id(f"t:{PROJECT}") != f"t:{PROJECT}"
    metadata = json.loads(by_fast["metadata_json"])
    assert metadata["capture_notes"] == [REDACTED_WITH_TOKEN_IDS]  # the ids still encode the text
    assert {name: metadata[name] for name in NAMED} == dict.fromkeys(NAMED, REDACTED)
    assert metadata["nested"]["url"] == "https://[REDACTED]@git.example.com/repo.git"
    messages = json.loads(by_fast["prompt_messages"])
    arguments = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"password": REDACTED, "user": "bob"}  # JSON in a string gets the field rule
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": f"logged in; token {REDACTED}"}


def test_a_clean_step_is_produced_byte_for_byte_as_sent(api: tuple[TestClient, Captured]) -> None:
    """Words that look like a secret's (a task-force, a risk-free prompt, prose about a Bearer token,
    a schema naming a password, counts of tokens) and a form-like text with white space stay as sent."""
    client, captured = api
    messages = [{"role": "user", "content": "task-force: is it risk-free? a Bearer token goes in a header\n"},
                {"role": "assistant", "content": "x=1\n", "tool_calls": [{"id": "c", "type": "function",
                 "function": {"name": "f", "arguments": '{"query": "key points", "limit": 3}'}}]}]
    metadata = {"max_tokens": 64, "token_ids": [1], "tools": [{"type": "function", "function": {
        "name": "login", "parameters": {"type": "object", "properties": {"password": {"type": "string"}}}}}],
        "url": "https://example.com:8443/a?b=c", "key": True, "session": None}
    step = {"trajectory_id": "t-1", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2],
            "prompt_messages": messages, "response_text": " done ", "metadata": metadata}
    assert redact_step({"trajectory_id": "t-1", "prompt_messages": messages, "response_text": " done ",
                        "metadata": metadata}, token_ids=True) == {}
    assert client.post("/v1/steps", json=step).status_code == 202
    [record] = captured.records()
    assert record["prompt_messages"] == compact_json(messages)
    assert record["metadata_json"] == compact_json(metadata)
    assert record["response_text"] == " done " and record["trajectory_id"] == "t-1"


def test_events_and_feedback_with_secrets_are_produced_without_them(api: tuple[TestClient, Captured]) -> None:
    client, captured = api
    turn = {"kind": "turn", "trajectory_id": f"t:{PROJECT}", "step_id": f"s {OPENAI}", "payload": {
        "prompt_messages": secret_step()["prompt_messages"], "response_text": f"ok {OPENAI}",
        "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "f", "arguments": json.dumps(NAMED)}}],
        "response_id": f"r {GITHUB}", "prompt_group_id": f"g {GITHUB}", "prompt_token_ids": [1, 2],
        "response_token_ids": [3], "logprobs": [-0.1], "agent": f"a {OPENAI}", "model": f"m {OPENAI}",
        "sampling_params": {"api_key": NAMED["api_key"]}, "metadata": {"password": NAMED["password"]}}}
    other = {"kind": "tool_result", "trajectory_id": "t-2", "event_id": f"e {OPENAI}",
             "payload": {"output": f"{URL} {BEARER}", "headers": {"Authorization": NAMED["token"]}}}
    assert client.post("/v1/events", json=[turn, other]).status_code == 202
    feedback = [{"trajectory_id": f"t:{PROJECT}", "reward": 1.0, "comment": f"leaked {GITHUB} {URL}",
                 "correction": json.dumps({"password": NAMED["password"]}), "label": f"l {OPENAI}",
                 "source": f"judge {OPENAI}", "components": {f"c {PROJECT}": 0.5}},
                {"step_id": f"s {OPENAI}", "comment": f"api_key={NAMED['api_key']}"}]
    assert client.post("/v1/feedback", json=feedback).status_code == 202
    captured.assert_clean()
    records = captured.records()
    [turn_record] = [r for r in records if r.get("kind") == "turn"]
    [other_record] = [r for r in records if r.get("kind") == "tool_result"]
    [trajectory_feedback] = [r for r in records if r.get("target_kind") == "trajectory"]
    [step_feedback] = [r for r in records if r.get("target_kind") == "step"]
    payload = json.loads(turn_record["payload_json"])
    assert payload["metadata"] == {"password": REDACTED, "capture_notes": [REDACTED_WITH_TOKEN_IDS]}
    assert payload["sampling_params"] == {"api_key": REDACTED}
    assert json.loads(other_record["payload_json"])["headers"] == {"Authorization": REDACTED}
    # A redacted id is the same stand-in wherever it comes: feedback still finds its trajectory and step.
    assert trajectory_feedback["target_id"] == turn_record["trajectory_id"] == redact_id(f"t:{PROJECT}")
    assert step_feedback["target_id"] == turn_record["step_id"] == redact_id(f"s {OPENAI}")


def test_compat_submit_steps_is_redacted_as_the_api(tmp_path: Path) -> None:
    settings = load_settings({"CLAWR1_DATA_DIR": str(tmp_path)})
    gateway = create_app(settings).state.gateway
    captured = Captured()
    gateway.publisher = captured
    step = {"prompt_ids": [1, 2], "response_ids": [3], "trajectory_uid": "t-compat",
            "prompt_uid": f"g {GITHUB}",
            "metadata": {**NAMED, "note": f"{OPENAI} {URL}"}, "multi_modal_data": {"token": NAMED["token"]},
            "routed_experts": [[f"{BEARER}"]]}
    with TestClient(create_compat_app(settings, gateway), base_url="http://127.0.0.1:8100") as client:
        answer = client.post("/submit_steps", json={"steps": [step]})
    assert answer.status_code == 200, answer.text
    captured.assert_clean()
    [record] = captured.records()
    metadata = json.loads(record["metadata_json"])
    assert metadata["multi_modal_data"] == {"token": REDACTED} and metadata["api_key"] == REDACTED
    assert record["prompt_group_id"] == redact_id(f"g {GITHUB}")
