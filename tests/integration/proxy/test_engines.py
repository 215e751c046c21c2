"""Three stand-in engines behind the reverse port: calls spread, rollouts keep their engine, a killed
engine's calls go on elsewhere, and drain then resume puts an engine back at a policy version."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from clawr1.cli import main
from clawr1.consumer_sdk import EngineControl, PoolRequestError
from clawr1.core.settings import Settings
from clawr1.demo.standin.server import StandinEngine
from clawr1.demo.standin.toy import DEFAULT_MODEL
from clawr1.proxy.config import PROCESSES_ENV
from tests.support.metrics import scrape, total
from tests.support.ports import free_port
from tests.support.proxy import (
    EmbeddedProxy,
    LoopThread,
    ProxyProcess,
    Standin,
    TopicReader,
    marked,
    start_standin,
)
from tests.support.waiting import wait_until

AGENTS = 8
TURNS = 4


@dataclass
class Fleet:
    engines: list[Standin]
    proxy: EmbeddedProxy

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    def table(self) -> dict[str, dict[str, object]]:
        reply = httpx.get(f"{self.proxy.reverse_url}/v1/engines")
        assert reply.status_code == 200, reply.text
        return {row["engine"]: row for row in reply.json()["engines"]}


@pytest.fixture(scope="module")
def fleet(servers_loop: LoopThread, tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str,
          capture_topic: str) -> Iterator[Fleet]:
    engines = [start_standin(servers_loop) for _ in range(3)]
    settings = Settings(data_dir=tmp_path_factory.mktemp("engines-proxy"), kafka_bootstrap=kafka_bootstrap,
                        proxy_port=0, reverse_port=free_port(), upstream=",".join(e.url for e in engines))
    try:
        with EmbeddedProxy(settings, capture_topic) as proxy:
            yield Fleet(engines, proxy)
    finally:
        for engine in engines:
            servers_loop.run(engine.engine.stop())


def _rollout(base_url: str, marker: str, agent: int, turns: int = TURNS) -> int:
    """One agent's rollout, each turn continuing the conversation; returns the calls that failed."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test")
    messages: list[Any] = [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": f"Task {marker} agent {agent}: count"}]
    failed = 0
    for turn in range(turns):
        try:
            if turn % 2:
                stream = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages,
                                                        stream=True)
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            else:
                reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages)
                text = reply.choices[0].message.content or ""
        except openai.APIError:
            failed += 1
            continue
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and {turn}?"}]
    return failed


def _run_agents(fleet: Fleet | str, marker: str, agents: int = AGENTS) -> int:
    """``agents`` rollouts at once through a reverse port (a fleet's, or at a URL); the failed calls."""
    url = fleet if isinstance(fleet, str) else fleet.proxy.reverse_url
    with ThreadPoolExecutor(agents) as pool:
        return sum(pool.map(lambda a: _rollout(url, marker, a), range(agents)))


def _engines_by_rollout(events: TopicReader, marker: str, count: int) -> dict[str, list[str]]:
    records = [e.record for e in events.wait_for(marked(marker), count=count)]
    by_rollout: dict[str, list[str]] = defaultdict(list)
    for record in records:
        assert record["engine"] is not None and record["error"] is None
        by_rollout[record["conversation_key"]].append(record["engine"])
    return by_rollout


def test_calls_spread_over_the_engines_and_each_rollout_keeps_its_engine(fleet: Fleet,
                                                                        events: TopicReader) -> None:
    marker = uuid.uuid4().hex
    assert _run_agents(fleet, marker) == 0
    by_rollout = _engines_by_rollout(events, marker, AGENTS * TURNS)
    assert len(by_rollout) == AGENTS and sum(map(len, by_rollout.values())) == AGENTS * TURNS
    calls = Counter(engine for engines in by_rollout.values() for engine in engines)
    assert set(calls) == set(fleet.urls)
    assert all(calls[url] >= 0.15 * AGENTS * TURNS for url in fleet.urls), calls
    kept = sum(len(set(engines)) == 1 for engines in by_rollout.values())
    assert kept >= 0.95 * AGENTS, by_rollout


def test_drain_then_resume_at_a_policy_version(fleet: Fleet, events: TopicReader,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    drained = fleet.urls[1]
    with EngineControl(fleet.proxy.reverse_url) as control:
        answer = control.drain(drained)
    assert answer["drained"] and answer["state"] == "draining" and answer["in_flight"] == 0
    marker = uuid.uuid4().hex
    assert _run_agents(fleet, marker) == 0
    assert drained not in {e for engines in _engines_by_rollout(events, marker, AGENTS * TURNS).values()
                           for e in engines}

    assert main(["resume", drained, "--policy-version", "7", "--proxy", fleet.proxy.reverse_url]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "serving"
    assert main(["engines", "--proxy", fleet.proxy.reverse_url]) == 0
    listed = {row["engine"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed[drained]["policy_version"] == 7 and listed[drained]["state"] == "serving"
    marker = uuid.uuid4().hex
    assert _run_agents(fleet, marker) == 0
    records = [e.record for e in events.wait_for(marked(marker), count=AGENTS * TURNS)]
    served = [r for r in records if r["engine"] == drained]
    assert served and all(r["policy_version"] == 7 for r in served)
    assert all(r["policy_version"] is None for r in records if r["engine"] != drained)


def test_bad_engine_requests_are_refused_with_the_reason(fleet: Fleet) -> None:
    base = fleet.proxy.reverse_url
    unknown = httpx.post(f"{base}/v1/engines/drain", json={"engine": "http://nowhere:1"})
    assert unknown.status_code == 404 and "not one of the engines" in unknown.json()["detail"]
    assert httpx.post(f"{base}/v1/engines/resume", content=b"[").status_code == 400
    version = httpx.post(f"{base}/v1/engines/resume", json={"engine": fleet.urls[0], "policy_version": "x"})
    assert version.status_code == 400 and "policy_version" in version.json()["detail"]


def test_a_killed_engine_is_taken_out_and_put_back_once_it_listens_again(
        fleet: Fleet, events: TopicReader, servers_loop: LoopThread) -> None:
    killed = fleet.engines[2]
    port = int(killed.url.rsplit(":", 1)[1])
    servers_loop.run(killed.engine.stop())
    marker = uuid.uuid4().hex
    failed = _run_agents(fleet, marker)
    assert failed <= 2
    answered = AGENTS * TURNS - failed
    by_rollout = _engines_by_rollout(events, marker, answered)
    assert killed.url not in {e for engines in by_rollout.values() for e in engines}
    assert len(events.events(marked(marker))) == answered  # each answered call captured once
    assert fleet.table()[killed.url]["state"] == "out"

    restarted = StandinEngine()
    assert servers_loop.run(restarted.start("127.0.0.1", port)) == port
    fleet.engines[2] = Standin(restarted, killed.url)
    assert httpx.get(f"{killed.url}/health").status_code == 200
    wait_until(lambda: fleet.table()[killed.url]["state"] == "serving", 30,
               message="the restarted engine probed back in")


def test_the_engine_routes_take_an_operate_key_when_the_stack_has_keys(
        servers_loop: LoopThread, tmp_path: Path, kafka_bootstrap: str, capture_topic: str) -> None:
    engine = start_standin(servers_loop)
    settings = Settings(data_dir=tmp_path, kafka_bootstrap=kafka_bootstrap, proxy_port=0,
                        reverse_port=free_port(), upstream=engine.url,
                        api_keys="ops:k-ops:operate,agent:k-agent:steps")
    try:
        with EmbeddedProxy(settings, capture_topic) as proxy:
            url = f"{proxy.reverse_url}/v1/engines"
            assert httpx.get(url).status_code == 401
            assert httpx.get(url, headers={"Authorization": "Bearer k-agent"}).status_code == 403
            with (EngineControl(proxy.reverse_url, api_key="k-agent") as control,
                  pytest.raises(PoolRequestError, match="lacks the kind 'operate'")):
                control.list()
            with EngineControl(proxy.reverse_url, api_key="k-ops") as control:
                assert [row["engine"] for row in control.list()] == [engine.url]
    finally:
        servers_loop.run(engine.engine.stop())


def test_drain_and_resume_reach_every_proxy_process(servers_loop: LoopThread, tmp_path: Path,
                                                    kafka_bootstrap: str, capture_topic: str,
                                                    events: TopicReader) -> None:
    engines = [start_standin(servers_loop) for _ in range(3)]
    drained = engines[1].url
    settings = Settings(data_dir=tmp_path, kafka_bootstrap=kafka_bootstrap, proxy_port=0,
                        reverse_port=free_port(), upstream=",".join(e.url for e in engines),
                        proxy_metrics_port=free_port(), extra={PROCESSES_ENV: "2"})
    url = f"http://127.0.0.1:{settings.reverse_port}"
    metrics = f"http://127.0.0.1:{settings.proxy_metrics_port}/metrics"
    try:
        with ProxyProcess(settings, capture_topic), EngineControl(url) as control:
            answer = control.drain(drained)
            assert answer["drained"] and answer["processes_waiting"] == 0
            marker = uuid.uuid4().hex
            assert _run_agents(url, marker) == 0
            records = [e.record for e in events.wait_for(marked(marker), count=AGENTS * TURNS)]
            assert drained not in {r["engine"] for r in records}
            assert len({r["client_connection"] for r in records}) > 1

            assert control.resume(drained, policy_version=7)["processes_waiting"] == 0
            marker = uuid.uuid4().hex
            assert _run_agents(url, marker) == 0
            records = [e.record for e in events.wait_for(marked(marker), count=AGENTS * TURNS)]
            assert {r["policy_version"] for r in records if r["engine"] == drained} == {7}
            wait_until(lambda: sum(int(row["served"]) for row in control.list()) == 2 * AGENTS * TURNS, 10,
                       message="the served counts of both processes added up")
            served = {row["engine"]: row["served"] for row in control.list()}
            scraped = scrape(metrics)
            assert {e: total(scraped, "clawr1_proxy_engine_calls_total", engine=e) for e in served} == served
            assert total(scraped, "clawr1_proxy_engine_policy_version", engine=drained) == 7
    finally:
        for engine in engines:
            servers_loop.run(engine.engine.stop())
