"""One live stack for the compat tests: `clawr1 up` on a real Kafka broker and chDB pool, with the
stand-in engine upstream, the capture proxy's reverse port, the compat port, API keys and a reward
function. Each test uses its own trajectory and group ids."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.live_stack import live_stack, wait_http
from tests.support.waiting import wait_until

KEYS = {"agent": "sk-compat-agent-0123456789", "reader": "sk-compat-reader-0123456789",
        "scorer": "sk-compat-scorer-0123456789", "trainer": "sk-compat-trainer-0123456789",
        "intruder": "sk-compat-intruder-0123456789", "collector": "sk-compat-collector-0123456789",
        "plain": "sk-compat-plain-0123456789", "rewarder": "sk-compat-rewarder-0123456789"}
API_KEYS = ",".join([*(f"{name}:{KEYS[name]}:{kinds}" for name, kinds in
                       (("agent", "steps|feedback"), ("reader", "read"), ("scorer", "feedback"),
                        ("trainer", "consume"), ("intruder", "steps|feedback"), ("collector", "events"),
                        ("rewarder", "reward"))),
                     f"plain:{KEYS['plain']}"])  # no kinds: the ingest kinds
REWARD_FN = "tests.integration.compat.reward_fns:tokens_over_turns"


@dataclass(frozen=True)
class Stack:
    api: str
    compat: str
    engine: str
    # The explicit proxy's, its reverse port's and the local broker's ports.
    proxy_port: int = 0
    kafka_port: int = 0
    reverse_port: int = 0

    def sql(self, query: str) -> list[dict[str, Any]]:
        # As a trainer: the live pool (an analyst's `read` key reads a snapshot, seconds old).
        reply = httpx.post(f"{self.api}/v1/sql", json={"query": query, "format": "JSONEachRow"},
                           headers=auth("trainer"), timeout=60)
        assert reply.status_code == 200, reply.text
        return [json.loads(line) for line in reply.text.splitlines() if line.strip()]

    def wait_rows(self, query: str, done: Callable[[list[dict[str, Any]]], bool],
                  timeout: float = 120) -> list[dict[str, Any]]:
        """The query's rows once ``done`` says they are complete (the streams and sink are asynchronous)."""
        def complete() -> tuple[list[dict[str, Any]]] | None:
            rows = self.sql(query)
            return (rows,) if done(rows) else None

        return wait_until(complete, timeout, interval=1, message=f"complete rows of {query!r}")[0]


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The default readiness rule: seed agents switch over without settings.
    with live_stack(tmp_path_factory.mktemp("compat") / "data", args=["--capture-token-ids"],
                    env={"CLAWR1_API_KEYS": API_KEYS, "CLAWR1_REWARD_FN": REWARD_FN}) as live:
        running = Stack(api=live.url("api"), compat=live.url("compat"), engine=live.url("engine"),
                        proxy_port=live.ports["proxy"], kafka_port=live.ports["kafka"],
                        reverse_port=live.ports["reverse"])
        wait_http(f"{running.compat}/openapi.json", 30, live.up)
        yield running
