"""The addons on mitmproxy test flows: hints stripped, ids injected and removed, one capture per call."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from clawr1.core.relay_source import relay_secret, seal
from clawr1.core.settings import Settings
from clawr1.gateway.auth import parse_api_keys
from clawr1.proxy.addons import build_addons
from clawr1.proxy.addons.hints import UNSEALED_SOURCE
from clawr1.proxy.hints import HINTS_IGNORED
from clawr1.proxy.record import CapturedCall
from clawr1.proxy.token_ids import SGLEXT_HEADERS, TokenIdPolicy

CHAT_URL = "http://up:8000/v1/chat/completions"


def _policy() -> TokenIdPolicy:
    return TokenIdPolicy.parse("up:8000")


def _flow(
    url: str = CHAT_URL, body: dict | None = None, headers: dict | None = None, method: str = "POST"
) -> http.HTTPFlow:
    content = json.dumps(body if body is not None else {"model": "m", "messages": []}).encode()
    return tflow.tflow(req=http.Request.make(method, url, content, headers or {}))


def _run(addons: list, flow: http.HTTPFlow, response: http.Response | None) -> None:
    for addon in addons:
        addon.request(flow)
    if flow.response is None and response is not None:
        flow.response = response
        for addon in addons:
            if hasattr(addon, "responseheaders"):
                addon.responseheaders(flow)
    _respond(addons, flow)


def _respond(addons: list, flow: http.HTTPFlow) -> None:
    for addon in addons:
        if hasattr(addon, "response"):
            result = addon.response(flow)
            if inspect.isawaitable(result):
                asyncio.run(result)


def _json_response(body: dict) -> http.Response:
    return http.Response.make(200, json.dumps(body), {"content-type": "application/json"})


def test_hints_are_recorded_and_never_forwarded() -> None:
    captured: list[CapturedCall] = []
    flow = _flow(headers={"X-Claw-Trajectory-Id": "t-1", "X-Claw-Agent": "a", "X-Claw-Unknown": "x"})
    _run(build_addons(captured.append, None), flow, _json_response({"choices": []}))
    assert not any(k.lower().startswith("x-claw") for k in flow.request.headers)
    (call,) = captured
    assert (call.hints.trajectory_id, call.hints.agent) == ("t-1", "a")
    assert ("X-Claw-Trajectory-Id", "t-1") in call.request_headers


def test_a_bad_hint_is_answered_by_the_proxy_and_not_recorded() -> None:
    captured: list[CapturedCall] = []
    flow = _flow(headers={"X-Claw-Prompt-Group-Size": "lots"})
    _run(build_addons(captured.append, None), flow, None)
    assert flow.response is not None and flow.response.status_code == 400
    assert "X-Claw-Prompt-Group-Size must be an integer" in flow.response.get_text()
    assert captured == []


def test_plain_reply_is_stripped_for_the_agent_and_kept_whole_for_the_record() -> None:
    captured: list[CapturedCall] = []
    flow = _flow()
    engine = {
        "id": "c",
        "prompt_token_ids": [1],
        "choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": []}, "token_ids": [2]}],
    }
    _run(build_addons(captured.append, _policy()), flow, _json_response(engine))
    assert json.loads(flow.request.content or b"")["return_token_ids"] is True
    assert json.loads(flow.response.content or b"") == {
        "id": "c",
        "choices": [{"index": 0, "message": {"content": "x"}, "logprobs": None}],
    }
    (call,) = captured
    assert json.loads(call.request_body) == {"model": "m", "messages": []}
    assert json.loads(call.engine_body or b"") == engine
    assert call.response_body == flow.response.raw_content


@pytest.mark.parametrize(("sent", "asked", "injected"), [
    ({}, ["1", "1"], True),  # added
    ({"X-SGLext-Return-Input-Ids": ""}, ["1", "1"], True),  # sent empty: replaced, once
    ({"x-sglext-return-output-ids": "1"}, [None, "1"], False),  # the agent's own: left alone
])
def test_sglang_ids_are_asked_for_by_header_unless_the_agent_did(sent: dict, asked: list,
                                                                 injected: bool) -> None:
    captured: list[CapturedCall] = []
    flow = _flow(headers=sent)
    _run(build_addons(captured.append, _policy()), flow, _json_response({"choices": []}))
    assert [flow.request.headers.get(name) for name in SGLEXT_HEADERS] == asked
    assert len(flow.request.headers.get_all("x-sglext-return-input-ids")) == (asked[0] is not None)
    (call,) = captured
    assert call.injection is not None and call.injection.sglext is injected


def test_a_hint_sent_in_two_spellings_is_read_once_and_never_forwarded() -> None:
    captured: list[CapturedCall] = []
    flow = _flow(headers={"X-Claw-Agent": "a", "x-claw-agent": "b"})
    _run(build_addons(captured.append, None), flow, _json_response({"choices": []}))
    assert not any(k.lower().startswith("x-claw") for k in flow.request.headers)
    (call,) = captured
    assert call.hints.agent == "a"


def test_streamed_reply_is_teed_and_rewritten_live() -> None:
    captured: list[CapturedCall] = []
    addons = build_addons(captured.append, _policy())
    flow = _flow(body={"model": "m", "messages": [], "stream": True})
    for addon in addons:
        addon.request(flow)
    assert flow.request.headers["accept-encoding"] == "identity"
    flow.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
    for addon in addons:
        if hasattr(addon, "responseheaders"):
            addon.responseheaders(flow)
    tee = flow.response.stream
    assert callable(tee)
    assert tee(b'data: {"choices":[{"index":0,"delta":{},"token_ids":[5]}]}\n\n') == [
        b'data: {"choices":[{"index":0,"delta":{}}]}\n\n'
    ]
    assert tee(b"") == []
    _respond(addons, flow)
    (call,) = captured
    assert (
        call.streamed and b"token_ids" in (call.engine_body or b"") and b"token_ids" not in call.response_body
    )


def test_other_traffic_is_left_alone() -> None:
    captured: list[CapturedCall] = []
    flow = _flow(url="http://up:8000/v1/models", method="GET", headers={"X-Claw-Agent": "a"})
    before = flow.request.content
    _run(build_addons(captured.append, _policy()), flow, _json_response({"data": []}))
    assert captured == [] and flow.request.content == before and flow.response.stream is False
    assert "X-Claw-Agent" not in flow.request.headers  # hints are never forwarded, whatever the call


def test_an_error_is_captured_once() -> None:
    captured: list[CapturedCall] = []
    addons = build_addons(captured.append, None)
    flow = _flow()
    for addon in addons:
        addon.request(flow)
    flow.error = tflow.terr("Connection refused")
    addons[-1].error(flow)
    addons[-1].error(flow)
    (call,) = captured
    assert (call.error, call.status) == ("Connection refused", None)


def test_the_callers_name_is_taken_only_with_the_compat_ports_seal(tmp_path: Path) -> None:
    """The compat port seals the calling key's name for its trajectory; an agent's own header, a wrong
    seal or a seal made for another trajectory names no one (and says so in the capture notes)."""
    secret = relay_secret(Settings(data_dir=tmp_path))
    assert secret == relay_secret(Settings(data_dir=tmp_path)) and len(secret) == 64  # kept, shared
    assert (tmp_path / "relay-secret").stat().st_mode & 0o777 == 0o600
    sealed = seal(secret, "agent-7", "t-1")
    cases = [(sealed, "t-1", "agent-7"), (sealed, "t-2", None), ("trainer", "t-1", None),
             ("trainer:" + "0" * 64, "t-1", None), (seal(b"other", "trainer", "t-1"), "t-1", None)]
    for value, trajectory, named in cases:
        captured: list[CapturedCall] = []
        flow = _flow(headers={"X-Claw-Trajectory-Id": trajectory, "X-Claw-Source": value})
        _run(build_addons(captured.append, None, relay_secret=secret), flow, _json_response({"choices": []}))
        (call,) = captured
        assert call.hints.source_name == named, value
        assert (UNSEALED_SOURCE in call.notes) == (named is None)
        assert "x-claw-source" not in {k.lower() for k in flow.request.headers}


def test_with_keys_hints_need_a_proxy_credential(tmp_path: Path) -> None:
    """The finding: with keys configured, a call through the reverse port with no key extended another
    key's trajectory (X-Claw-Trajectory-Id, X-Claw-Metadata, X-Claw-Terminal). Without a credential the
    call is still relayed and captured, as the proxy's own; with the agent's key (X-Claw-Key, kind
    steps) or the compat port's seal its hints count, and the key is never forwarded nor recorded."""
    keys = parse_api_keys("agent:sk-agent-0123:steps,reader:sk-reader-0123:read")
    secret = relay_secret(Settings(data_dir=tmp_path))
    attack = {"X-Claw-Trajectory-Id": "t-victim", "X-Claw-Terminal": "true",
              "X-Claw-Metadata": '{"ground_truth":"ATTACKER"}'}
    cases = [({}, None), ({"X-Claw-Key": "sk-wrong"}, None), ({"X-Claw-Key": "sk-reader-0123"}, None),
             ({"X-Claw-Policy-Version": "not a number"}, None),  # unread, so it refuses nothing
             ({"X-Claw-Key": "sk-agent-0123"}, "agent"),
             ({"X-Claw-Source": seal(secret, "agent", "t-victim")}, "agent")]
    for extra, source in cases:
        captured: list[CapturedCall] = []
        flow = _flow(headers={**attack, **extra})
        _run(build_addons(captured.append, None, relay_secret=secret, keys=keys), flow,
             _json_response({"choices": []}))
        (call,) = captured
        assert flow.response is not None and flow.response.status_code == 200, extra  # traffic flows
        assert not any(k.lower().startswith("x-claw-") for k in flow.request.headers), extra
        recorded = {k.lower() for k, _ in call.request_headers}
        assert "x-claw-key" not in recorded
        hinted = (call.hints.trajectory_id, call.hints.terminal, call.hints.source_name)
        if source is None:
            assert hinted == (None, False, None)
            assert HINTS_IGNORED in call.notes and "x-claw-metadata" not in recorded, extra
        else:
            assert hinted == ("t-victim", True, source)
            assert HINTS_IGNORED not in call.notes and "x-claw-metadata" in recorded


def test_without_keys_hints_count_as_before() -> None:
    captured: list[CapturedCall] = []
    flow = _flow(headers={"X-Claw-Trajectory-Id": "t-1", "X-Claw-Terminal": "true"})
    _run(build_addons(captured.append, None), flow, _json_response({"choices": []}))
    (call,) = captured
    assert (call.hints.trajectory_id, call.hints.terminal) == ("t-1", True)
    assert HINTS_IGNORED not in call.notes
