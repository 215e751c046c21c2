"""Dashboard fixtures: the real router over a migrated chDB pool, filled the way the sink fills it.

Rows are built by the sink's own row functions (``clawr1.sinks.rows``) from complete Avro records, so the
tables hold exactly what a running stack would write. ``SCENARIO`` is small enough to count by hand:
the tests assert each panel's numbers against the comments below.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from clawr1.dashboard.api import dashboard_page_router, dashboard_router
from clawr1.dashboard.decoding import TokenDecoder
from clawr1.pool.consumer_tables import COMMITS_TABLE, POSITIONS_TABLE
from clawr1.pool.store import PoolStore
from clawr1.sinks.rows import DLQ_ROUTE, FEEDBACK_ROUTE, PREFIX_NODES_ROUTE, STEPS_ROUTE, Origin, TableRoute
from tests.support.pool import fresh_pool_store
from tests.support.records import record

T0 = 1_760_000_000_000  # a multiple of every bucket width up to a minute
SECOND = 1000


def insert(
    store: PoolStore, route: TableRoute, records: list[dict[str, Any]], ingested_ms: list[int]
) -> None:
    """Rows as the sink writes them, each record with its own ingestion time and Kafka offset."""
    rows = [
        route.to_row(rec, Origin(f"t.{route.table}", 0, i, None, None), at)
        for i, (rec, at) in enumerate(zip(records, ingested_ms, strict=True))
    ]
    store.insert(route.table, rows, route.columns)


def step(step_id: str, trajectory_id: str, index: int, at_s: int, **fields: Any) -> dict[str, Any]:
    return record(
        "step",
        step_id=step_id,
        version=fields.pop("version", 1),
        trajectory_id=trajectory_id,
        step_index=index,
        prompt_id=f"p-{step_id}",
        response_id=f"r-{step_id}",
        created_at_ms=T0 + at_s * SECOND,
        updated_at_ms=T0 + at_s * SECOND,
        prompt_token_ids=fields.pop("prompt_token_ids", [1, 2, 3]),
        response_token_ids=fields.pop("response_token_ids", [4, 5]),
        **fields,
    )


GROUP = {"prompt_group_id": "g1", "prompt_group_size": 2}
WHITEBOX = {"source_kind": "whitebox_agent", "source_name": "trainer-a", "token_provenance": "engine"}
PROXY = {
    "source_kind": "blackbox_agent",
    "source_name": "proxy-1",
    "token_provenance": "retokenized",
    "tokenizer": "tok@abc",
}
SERVICE = {"source_kind": "blackbox_service", "source_name": "svc-chat", "token_provenance": "none"}
FINAL = {"reward_status": "final"}
MESSAGES = json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}])

# 4 trajectories, 8 steps (a1 written twice: the pool keeps its version 2).
#   a: white-box, policy 1, group g1, engine ids, rewards 0 / 0.5 / 1 (final), all ready, a2 terminal
#   b: white-box, policy 2, group g1, engine ids, b0 pending & not ready, b1 reward 1 final, terminal
#   c: proxy, no policy, no group, retokenized, c1 failed, nothing rewarded or ready; engines 1 and 2
#   d: service, policy 2, no group, no ids, reward -1 final, ready, terminal ("svc/turn-0": a slash in its id)
SCENARIO_STEPS: list[dict[str, Any]] = [
    step(
        "a0",
        "a",
        0,
        0,
        policy_version=1,
        reward=0.0,
        ready=True,
        latency_ms=100,
        **GROUP,
        **WHITEBOX,
        **FINAL,
    ),
    step("a1", "a", 1, 10, policy_version=1, latency_ms=200, **GROUP, **WHITEBOX),
    step(
        "a2",
        "a",
        2,
        20,
        policy_version=1,
        reward=1.0,
        ready=True,
        terminal=True,
        latency_ms=300,
        quality_labels=["good"],
        quality_score=0.75,
        **GROUP,
        **WHITEBOX,
        **FINAL,
    ),
    step("b0", "b", 0, 30, policy_version=2, **GROUP, **WHITEBOX),
    step(
        "b1",
        "b",
        1,
        40,
        policy_version=2,
        reward=1.0,
        ready=True,
        terminal=True,
        **GROUP,
        **WHITEBOX,
        **FINAL,
    ),
    step("c0", "c", 0, 60, quality_labels=["good", "long"], quality_score=0.25, engine="http://engine-1",
         **PROXY),
    step("c1", "c", 1, 70, status="failed", error="upstream 502", engine="http://engine-2", **PROXY),
    step(
        "svc/turn-0",
        "d",
        0,
        125,
        policy_version=2,
        reward=-1.0,
        ready=True,
        terminal=True,
        prompt_token_ids=[],
        response_token_ids=[],
        **SERVICE,
        **FINAL,
    ),
]
A1_V2 = step(
    "a1",
    "a",
    1,
    10,
    version=2,
    policy_version=1,
    reward=0.5,
    ready=True,
    latency_ms=200,
    prompt_messages=MESSAGES,
    response_text="4",
    **GROUP,
    **WHITEBOX,
    **FINAL,
)


def seed(store: PoolStore) -> None:
    """The scenario: steps, a newer step version, feedback, dead letters, prefix nodes, consumer state."""
    insert(store, STEPS_ROUTE, SCENARIO_STEPS, [r["created_at_ms"] + SECOND for r in SCENARIO_STEPS])
    insert(store, STEPS_ROUTE, [A1_V2], [T0 + 50 * SECOND])
    insert(
        store,
        FEEDBACK_ROUTE,
        [
            record(
                "feedback",
                feedback_id="f1",
                target_kind="step",
                target_id="a0",
                source="human",
                source_name="ann",
                label="good",
                comment="nice",
                final=False,
                received_at_ms=T0 + 5 * SECOND,
            ),
            record(
                "feedback",
                feedback_id="f2",
                target_kind="response",
                target_id="r-a1",
                reward=0.5,
                source="reward_model",
                source_name="rm",
                received_at_ms=T0 + 15 * SECOND,
            ),
            record(
                "feedback",
                feedback_id="f3",
                target_kind="trajectory",
                target_id="c",
                source="human",
                source_name="ann",
                correction="use the cache",
                final=False,
                received_at_ms=T0 + 80 * SECOND,
            ),
        ],
        [T0] * 3,
    )
    insert(
        store,
        DLQ_ROUTE,
        [
            record(
                "dead_letter",
                dlq_id="x:0:1",
                reason="not avro",
                stage="decode",
                source_topic="x",
                failed_at_ms=T0 + 1 * SECOND,
            ),
            record(
                "dead_letter",
                dlq_id="x:0:2",
                reason="not avro",
                stage="decode",
                source_topic="x",
                failed_at_ms=T0 + 2 * SECOND,
            ),
            record(
                "dead_letter",
                dlq_id="y:0:7",
                reason="missing trajectory_id",
                stage="validate",
                source_topic="y",
                failed_at_ms=T0 + 3 * SECOND,
            ),
        ],
        [T0] * 3,
    )

    # Scope g1 (prompt group): version 1 superseded by version 2 (total 60, tree 35, forks 2, 3 nodes).
    # Scope c (trajectory): total 20, tree 14, no forks, 2 nodes, holding c1.
    def node(
        scope: str,
        kind: str,
        node_id: str,
        version: int,
        total: int,
        tree: int,
        forks: int,
        step_ids: list[str],
    ) -> dict[str, Any]:
        return record(
            "prefix_node",
            scope_id=scope,
            scope_kind=kind,
            node_id=node_id,
            depth_start=0,
            token_ids=[1, 2],
            step_ids=step_ids,
            version=version,
            total_tokens=total,
            tree_tokens=tree,
            forks=forks,
            updated_at_ms=T0 + version,
        )

    insert(
        store,
        PREFIX_NODES_ROUTE,
        [
            node("g1", "prompt_group", "n1", 1, 50, 30, 1, []),
            node("g1", "prompt_group", "n1", 2, 60, 35, 2, []),
            node("g1", "prompt_group", "n2", 2, 60, 35, 2, ["a0", "a1"]),
            node("g1", "prompt_group", "n3", 2, 60, 35, 2, ["b0"]),
            node("c", "trajectory", "m1", 1, 20, 14, 0, ["c0"]),
            node("c", "trajectory", "m2", 1, 20, 14, 0, ["c1"]),
        ],
        [T0] * 6,
    )
    # Group "trainer": never sought, committed a0..a2. Group "eval": sought twice, now epoch e1 with a
    # floor between c0's and c1's ingestion; its e0 commit of c0 no longer counts, e1 committed svc/turn-0.
    commit_columns = ["group_name", "epoch", "step_id", "step_version", "consumer_id"]
    store.insert(
        COMMITS_TABLE,
        [
            ["trainer", "", "a0", 1, "w1"],
            ["trainer", "", "a1", 2, "w1"],
            ["trainer", "", "a2", 1, "w2"],
            ["eval", "e0", "c0", 1, "e"],
            ["eval", "e1", "svc/turn-0", 1, "e"],
        ],
        commit_columns,
    )
    store.insert(
        POSITIONS_TABLE,
        [["eval", "e0", 0, 1], ["eval", "e1", T0 + 65 * SECOND, 2]],
        ["group_name", "epoch", "floor_ms", "set_at_ns"],
    )


def client_for(store: PoolStore, decoder: TokenDecoder | None = None) -> TestClient:
    app = FastAPI()
    app.include_router(dashboard_page_router())
    app.include_router(dashboard_router(store, decoder))
    return TestClient(app)


@pytest.fixture
def empty_client(pool_store: PoolStore) -> Iterator[TestClient]:
    with client_for(pool_store) as client:
        yield client


@pytest.fixture(scope="module")
def seeded_store(pool_dsn: str) -> Iterator[PoolStore]:
    """The scenario in a database of its own, shared by a module's tests: they only read it."""
    with fresh_pool_store(pool_dsn, "dash") as store:
        seed(store)
        yield store


@pytest.fixture
def client(seeded_store: PoolStore) -> Iterator[TestClient]:
    with client_for(seeded_store) as client:
        yield client
