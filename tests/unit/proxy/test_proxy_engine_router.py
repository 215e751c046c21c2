"""The engine router on mitmproxy test flows: the rollout key, the rewrite to the picked engine, what the
capture records, which failures take an engine out, the engine routes."""

from __future__ import annotations

import asyncio
import json

from mitmproxy import flow as mitm_flow
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from clawr1.proxy.addons import build_addons
from clawr1.proxy.addons.engines import EngineRouter, rollout_key
from clawr1.proxy.addons.hints import ClawHints
from clawr1.proxy.record import CLIENT_DISCONNECTED, CapturedCall

ENGINES = ["http://e1:8001", "http://e2:8002", "http://e3:8003"]
SYSTEM = {"role": "system", "content": "be terse"}


def _flow(messages: list[dict], headers: dict | None = None, path: str = "/v1/chat/completions",
          method: str = "POST", reverse: bool = True) -> http.HTTPFlow:
    body = json.dumps({"model": "m", "messages": messages}).encode()
    flow = tflow.tflow(req=http.Request.make(method, f"http://e1:8001{path}", body, headers or {}))
    if reverse:
        flow.client_conn.proxy_mode = ProxyMode.parse("reverse:http://e1:8001")
    return flow


def _hook(addons: list, name: str, flow: http.HTTPFlow) -> None:
    for addon in addons:
        if hasattr(addon, name):
            result = getattr(addon, name)(flow)
            if asyncio.iscoroutine(result):
                asyncio.run(result)


def _request(addons: list, flow: http.HTTPFlow) -> None:
    _hook(addons, "request", flow)


def test_the_rollout_is_the_trajectory_hint_else_the_conversation_root() -> None:
    first = [SYSTEM, {"role": "user", "content": "task 1"}]
    later = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    hints = ClawHints()
    keys = []
    for messages, headers in ((first, None), (later, None), (later, {"X-Claw-Trajectory-Id": "t-9"})):
        flow = _flow(messages, headers)
        hints.request(flow)
        keys.append(rollout_key(flow))
    assert keys[0] == keys[1] and keys[0].startswith("c:") and keys[2] == "t:t-9"
    assert rollout_key(_flow([], path="/v1/models", method="GET")) == ""


def test_calls_go_to_the_picked_engine_and_the_record_names_it_with_its_version() -> None:
    captured: list[CapturedCall] = []
    router = EngineRouter(ENGINES)
    addons = build_addons(captured.append, None, router=router)
    turns = [SYSTEM, {"role": "user", "content": "task 2"}]
    hosts = set()
    for turn in range(3):
        flow = _flow(turns, {"X-Claw-Policy-Version": "3"})
        _request(addons, flow)
        hosts.add(f"http://{flow.request.host}:{flow.request.port}")
        if turn == 1:
            router.table.resume(f"http://{flow.request.host}:{flow.request.port}", 7)
        flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
        _hook(addons, "responseheaders", flow)
        _hook(addons, "response", flow)
        turns = [*turns, {"role": "assistant", "content": "{}"}, {"role": "user", "content": f"t{turn}"}]
    assert len(hosts) == 1
    engine = hosts.pop()
    assert [(c.engine, c.engine_version, c.upstream) for c in captured] == [
        (engine, None, engine), (engine, None, engine), (engine, 7, engine)]
    assert router.table.get(engine).served == 3 and router.table.get(engine).in_flight == 0  # type: ignore[union-attr]


def test_a_failure_before_the_answer_takes_the_engine_out_an_agent_hanging_up_does_not() -> None:
    router = EngineRouter(ENGINES)
    for message, out in ((CLIENT_DISCONNECTED, False), ("Connection reset by peer", True)):
        flow = _flow([SYSTEM, {"role": "user", "content": message}])
        _request([router], flow)
        engine = f"http://{flow.request.host}:{flow.request.port}"
        flow.error = mitm_flow.Error(message)
        router.error(flow)
        assert (router.table.get(engine).state == "out") is out  # type: ignore[union-attr]
        assert router.table.get(engine).in_flight == 0  # type: ignore[union-attr]


def test_the_engine_routes_are_answered_on_the_reverse_port_only() -> None:
    router = EngineRouter(ENGINES)
    listed = _flow([], path="/v1/engines", method="GET")
    _request([router], listed)
    assert listed.response is not None and listed.response.status_code == 200
    assert [row["engine"] for row in json.loads(listed.response.content or b"")["engines"]] == ENGINES
    explicit = _flow([], path="/v1/engines", method="GET", reverse=False)
    _request([router], explicit)
    assert explicit.response is None and explicit.request.host == "e1"
    drained = _flow([], path="/v1/engines/drain", method="POST")
    drained.request.content = json.dumps({"engine": ENGINES[2], "timeout_s": 0}).encode()
    _request([router], drained)
    assert drained.response is not None and json.loads(drained.response.content or b"")["drained"]
    assert router.table.get(ENGINES[2]).state == "draining"  # type: ignore[union-attr]
