"""The route x kind matrix over live HTTP (every cell), a consume key's own groups, and the SDK with keys.

One key per kind against the whole API app as the stack mounts it (ingest, pool SQL and inserts,
dashboard data and page) on a real broker and a real pool. docs/security.md shows the same matrix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from clawr1.consumer_sdk import PoolConsumer, PoolRequestError, save_preset
from clawr1.core.settings import Settings
from clawr1.dashboard.api import dashboard_page_router, dashboard_router
from clawr1.gateway.metrics import metrics_router
from clawr1.pool.api import pool_router
from clawr1.pool.store import PoolStore
from tests.conftest import fresh_pool_store
from tests.integration.gateway.conftest import LiveGateway, running_gateway
from tests.integration.sdk.conftest import Pool, database_dsn, step

KEYS = {  # kind -> (key name, secret); "" is an entry without kinds
    "steps": ("agent", "key-steps"), "feedback": ("rater", "key-feedback"), "events": ("svc", "key-events"),
    "read": ("analyst", "key-read"), "consume": ("trainer", "key-consume"),
    "curate": ("curator", "key-curate"), "operate": ("operator", "key-operate"),
    "reward": ("scorer", "key-reward"), "": ("plain", "key-plain"),
}
SPEC = ",".join(f"{name}:{secret}" + (f":{kind}" if kind else "") for kind, (name, secret) in KEYS.items())


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: dict[str, Any] | None
    allowed: frozenset[str]
    """Kinds that may call it ("" = an entry without kinds)."""
    success: int
    template: str = ""
    """The route's path template in /openapi.json, when ``path`` fills one in."""
    stream: bool = False
    """An endless response (Server-Sent Events): only its status and a refusal's body are read."""


STEP = {"trajectory_id": "t-kinds", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2]}
COMMIT = {"group_name": "trainer", "epoch": "e0", "step_id": "s0", "step_version": 1}
INGEST = frozenset({"steps", "feedback", "events", ""})
MATRIX = [
    Call("POST", "/v1/steps", STEP, frozenset({"steps", ""}), 202),
    # A curate key passes the route, then its reward is refused (labels and notes are what it may send).
    Call("POST", "/v1/feedback", {"trajectory_id": "t-kinds", "reward": 1.0},
         frozenset({"feedback", "reward", ""}), 202),
    Call("POST", "/v1/feedback", {"step_id": "s-kinds", "label": "excluded"}, frozenset({"curate"}), 202),
    Call("POST", "/v1/events", {"kind": "user_action", "trajectory_id": "t-kinds", "payload": {}},
         frozenset({"events", ""}), 202),
    Call("POST", "/v1/traces", {"resourceSpans": []}, frozenset({"events", ""}), 200),
    Call("POST", "/v1/logs", {"resourceLogs": []}, frozenset({"events", ""}), 200),
    Call("POST", "/v1/sql", {"query": "SELECT 1 AS one"}, frozenset({"read", "consume"}), 200),
    Call("POST", "/v1/pool/insert/consumer_commits", {"rows": [COMMIT]}, frozenset({"consume"}), 200,
         "/v1/pool/insert/{table}"),
    Call("GET", "/v1/dashboard/summary", None, frozenset({"read"}), 200),
    Call("GET", "/v1/dashboard/steps", None, frozenset({"read"}), 200),
    Call("GET", "/v1/dashboard/steps/no-such-step", None, frozenset({"read"}), 404,
         "/v1/dashboard/steps/{step_id}"),
    Call("GET", "/v1/dashboard/trajectories/no-such", None, frozenset({"read"}), 404,
         "/v1/dashboard/trajectories/{trajectory_id}"),
    Call("GET", "/v1/dashboard/prompt-groups/no-such", None, frozenset({"read"}), 404,
         "/v1/dashboard/prompt-groups/{prompt_group_id}"),
    Call("GET", "/v1/dashboard/preview?group=kinds-preview", None, frozenset({"read"}), 200,
         "/v1/dashboard/preview"),
    Call("GET", "/v1/dashboard/tree?scope_kind=trajectory&scope_id=no-such", None, frozenset({"read"}), 404,
         "/v1/dashboard/tree"),
    Call("GET", "/v1/dashboard/live", None, frozenset({"read"}), 200, stream=True),
    Call("POST", "/v1/dashboard/curate", {"step_ids": ["s-kinds"], "note": "checked"}, frozenset({"curate"}),
         202),
    Call("GET", "/metrics", None, frozenset({"read"}), 200),
]
PUBLIC = {"/healthz": "/healthz", "/dashboard": "/dashboard",
          "/dashboard/assets/app.js": "/dashboard/assets/{name}"}  # path -> its template


@pytest.fixture(scope="module")
def pool(pool_dsn: str) -> Iterator[Pool]:
    with fresh_pool_store(pool_dsn, "kinds") as store:
        yield Pool(store=store, dsn=database_dsn(pool_dsn, store.database))


@pytest.fixture(scope="module")
def api(kafka_bootstrap: str, pool: Pool) -> Iterator[LiveGateway]:
    store = PoolStore(pool.dsn)
    try:
        with running_gateway(kafka_bootstrap, settings=Settings(api_keys=SPEC),
                             routers=[pool_router(store), dashboard_router(store), metrics_router()],
                             public_routers=[dashboard_page_router()]) as live:
            yield live
    finally:
        store.close()


def call(api: LiveGateway, route: Call, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if not route.stream:
        return api.http.request(route.method, route.path, json=route.body, headers=headers)
    with api.http.stream(route.method, route.path, json=route.body, headers=headers) as reply:
        if reply.status_code != route.success:
            reply.read()
        return reply


@pytest.mark.parametrize("kind", list(KEYS))
@pytest.mark.parametrize("route", MATRIX, ids=lambda r: f"{r.method} {r.path}")
def test_every_route_kind_cell(api: LiveGateway, route: Call, kind: str) -> None:
    name, secret = KEYS[kind]
    reply = call(api, route, secret)
    if kind in route.allowed:
        assert reply.status_code == route.success, reply.text
    else:
        assert reply.status_code == 403, reply.text
        assert f"the API key of {name!r} may not " in reply.text


@pytest.mark.parametrize("route", MATRIX, ids=lambda r: f"{r.method} {r.path}")
def test_every_keyed_route_needs_a_key(api: LiveGateway, route: Call) -> None:
    for key in (None, "not-a-key"):
        reply = call(api, route, key)
        assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer", reply.text


@pytest.mark.parametrize("path", [*PUBLIC, "/openapi.json"])
def test_public_routes_answer_every_caller(api: LiveGateway, path: str) -> None:
    for key in [None, *(secret for _, secret in KEYS.values())]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert api.http.get(path, headers=headers).status_code == 200


def test_the_matrix_covers_every_route_of_the_app(api: LiveGateway) -> None:
    paths = set(api.http.get("/openapi.json").json()["paths"])
    assert paths == {r.template or r.path for r in MATRIX} | set(PUBLIC.values())


def insert(api: LiveGateway, table: str, rows: list[dict[str, Any]]) -> httpx.Response:
    return api.http.post(f"/v1/pool/insert/{table}", json={"rows": rows},
                         headers={"Authorization": "Bearer key-consume"})


def test_a_consume_key_writes_only_its_own_groups_and_presets(api: LiveGateway, pool: Pool) -> None:
    for group in ("trainer", "trainer:run-1", "trainer:a/b"):
        assert insert(api, "consumer_commits", [{**COMMIT, "group_name": group}]).status_code == 200, group
    position = {"epoch": "e1", "floor_ms": 0, "set_at_ns": 1}
    assert insert(api, "consumer_positions", [{**position, "group_name": "trainer:run-1"}]).status_code == 200
    preset = {"filters_json": "{}", "saved_at_ns": 1}
    assert insert(api, "consumer_presets", [{**preset, "name": "trainer:fresh"}]).status_code == 200
    before = pool.store.query_arrow("SELECT count() AS n FROM consumer_commits").to_pylist()
    for table, rows in [
        ("consumer_commits", [{**COMMIT, "group_name": "analyst"}]),
        ("consumer_commits", [{**COMMIT, "group_name": "trainerx"}]),
        ("consumer_commits", [{**COMMIT, "group_name": "trainer/run"}]),
        ("consumer_commits", [{**COMMIT, "group_name": "trainer"}, {**COMMIT, "group_name": "other:run"}]),
        ("consumer_commits", [{k: v for k, v in COMMIT.items() if k != "group_name"}]),
        ("consumer_commits", [{**COMMIT, "group_name": ["trainer"]}]),
        ("consumer_positions", [{**position, "group_name": "rival"}]),
        ("consumer_presets", [{**preset, "name": "shared"}]),
    ]:
        reply = insert(api, table, rows)
        assert reply.status_code == 403, (table, rows)
        assert "the API key of 'trainer' may write only" in reply.json()["message"]
    assert pool.store.query_arrow("SELECT count() AS n FROM consumer_commits").to_pylist() == before


def test_the_sdk_works_with_a_consume_key_from_the_argument_or_the_environment(
        api: LiveGateway, pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    pool.write(*(step(f"sdk-{i}") for i in range(3)))
    with PoolConsumer(api.url, "trainer:run-sdk", api_key="key-consume") as consumer:
        batch = consumer.poll(max_steps=2)
        assert len(batch.step_ids) == 2 and consumer.commit(batch, sync=True) == 2
        consumer.seek("earliest")
    save_preset(api.url, "trainer:good", api_key="key-consume", quality_labels=["good"])
    with pytest.raises(PoolRequestError) as refused:
        save_preset(api.url, "good", api_key="key-consume", quality_labels=["good"])
    assert refused.value.status == 403
    with PoolConsumer(api.url, "someone-else", api_key="key-consume") as rival:
        taken = rival.poll(max_steps=1)
        with pytest.raises(PoolRequestError, match="may write only group_name"):
            rival.commit(taken, sync=True)
    monkeypatch.setenv("CLAWR1_API_KEY", "key-consume")
    with PoolConsumer(api.url, "trainer:run-env") as from_env:
        assert from_env.commit(from_env.poll(max_steps=1), sync=True) == 1
    monkeypatch.setenv("CLAWR1_API_KEY", "key-read")
    with PoolConsumer(api.url, "trainer:run-env") as reader, pytest.raises(PoolRequestError) as read_only:
        reader.commit(reader.poll(max_steps=1), sync=True)
    assert read_only.value.status == 403
