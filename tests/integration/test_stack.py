"""The stack contract: `clawr1 up` brings every part up on real Kafka and chDB, /healthz goes 200
only when all are ready, traffic from all ways in reaches the pool, and SIGINT stops it cleanly."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.live_stack import CLAWR1, live_stack, pool_sql
from tests.support.metrics import scrape, total
from tests.support.ports import free_port
from tests.support.waiting import wait_until

SECRET = "sk-test-secret-must-not-be-stored"
PROMPT = list(range(10, 60))
GROUP = [[7, 8, 9], [7, 8, 1], [7, 2], [7, 8, 9, 4]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One stack for the module; each test uses its own ids."""
    data = tmp_path_factory.mktemp("stack") / "data"
    metrics = {name: free_port() for name in ("proxy_metrics", "worker_metrics")}
    env = {"CLAWR1_PROXY_METRICS_PORT": str(metrics["proxy_metrics"]),
           "CLAWR1_WORKER_METRICS_PORT": str(metrics["worker_metrics"]), "CLAWR1_METRICS_SAMPLE_S": "1"}
    with live_stack(data, env=env) as live:
        yield {"api": live.url("api"), "reverse": live.url("reverse"), "data": str(data),
               "proxy_metrics": f"http://127.0.0.1:{metrics['proxy_metrics']}/metrics",
               "worker_metrics": f"http://127.0.0.1:{metrics['worker_metrics']}/metrics"}


def wait_for(url: str, check: Callable[[dict[str, float]], bool], timeout: float = 60.0) -> dict[str, float]:
    last: list[dict[str, float]] = [{}]

    def met() -> dict[str, float]:
        last[0] = scrape(url)
        return last[0] if check(last[0]) else {}

    return wait_until(met, timeout, interval=0.5, message=lambda: f"{url} meeting the check: {last[0]}")


def test_stack_carries_every_way_in_to_the_pool(stack: dict[str, str]) -> None:
    from openai import OpenAI

    health = httpx.get(f"{stack['api']}/healthz").json()
    assert all(health["parts"].values()), health

    agent = OpenAI(base_url=f"{stack['reverse']}/v1", api_key=SECRET)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hello"}]
    first = agent.chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    agent.chat.completions.create(model="m", messages=messages)

    accepted = httpx.post(
        f"{stack['api']}/v1/steps",
        json={
            "trajectory_id": "wb-1",
            "step_index": 0,
            "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5],
            "reward": 1.0,
            "terminal": True,
            "policy_version": 3,
        },
    )
    assert accepted.status_code == 202, accepted.text
    group = [  # a GRPO group: one shared prompt, responses that share some of their tokens too
        {
            "trajectory_id": f"g-{i}",
            "step_index": 0,
            "prompt_group_id": "grp",
            "prompt_group_size": len(GROUP),
            "prompt_token_ids": PROMPT,
            "response_token_ids": response,
            "terminal": True,
        }
        for i, response in enumerate(GROUP)
    ]
    assert httpx.post(f"{stack['api']}/v1/steps", json=group).status_code == 202

    def landed() -> list[dict[str, object]]:
        rows = pool_sql(
            stack["api"],
            "SELECT step_id, source_kind, trajectory_id, step_index, reward, "
            "reward_status, ready, prompt_messages FROM steps ORDER BY source_kind, step_index",
        )
        return rows if len(rows) >= 3 + len(GROUP) else []

    rows = wait_until(landed, 120, interval=1, message="the calls and steps of every way in in the pool")
    black = [r for r in rows if r["source_kind"] == "blackbox_agent"]
    white = [r for r in rows if r["source_kind"] == "whitebox_agent" and r["trajectory_id"] == "wb-1"]
    assert len(black) == 2, rows
    assert black[0]["trajectory_id"] == black[1]["trajectory_id"], "the second call must continue the first"
    assert [r["step_index"] for r in black] == [0, 1]
    assert len(white) == 1 and white[0]["reward"] == 1.0 and white[0]["reward_status"] == "final"
    assert white[0]["ready"] == 1
    assert sorted(str(r["trajectory_id"]) for r in rows if str(r["trajectory_id"]).startswith("g-")) == [
        f"g-{i}" for i in range(len(GROUP))
    ]
    assert all(SECRET not in json.dumps(r) for r in rows)
    leaked = pool_sql(
        stack["api"],
        f"SELECT count() AS n FROM steps "
        f"WHERE position(concat(prompt_messages, metadata_json), '{SECRET}') > 0",
    )
    assert [int(str(r["n"])) for r in leaked] == [0]


def test_stack_merges_a_prompt_group_into_an_exact_prefix_tree(stack: dict[str, str]) -> None:
    group = [
        {
            "trajectory_id": f"t-{i}",
            "step_index": 0,
            "prompt_group_id": "tree",
            "prompt_group_size": len(GROUP),
            "prompt_token_ids": PROMPT,
            "response_token_ids": response,
            "terminal": True,
        }
        for i, response in enumerate(GROUP)
    ]
    assert httpx.post(f"{stack['api']}/v1/steps", json=group).status_code == 202
    sequences = [PROMPT + response for response in GROUP]
    distinct_prefixes = len({tuple(seq[:n]) for seq in sequences for n in range(1, len(seq) + 1)})
    query = (
        "SELECT total_tokens, tree_tokens, forks FROM prefix_savings "
        "WHERE scope_kind = 'prompt_group' AND scope_id = 'tree'"
    )

    def merged() -> list[dict[str, object]]:
        savings = pool_sql(stack["api"], query)
        return savings if savings and int(str(savings[0]["total_tokens"])) == sum(map(len, sequences)) else []

    savings = wait_until(merged, 120, interval=1, message="the group's prefix-tree savings in the pool")
    assert int(str(savings[0]["total_tokens"])) == sum(map(len, sequences))
    assert int(str(savings[0]["tree_tokens"])) == distinct_prefixes
    stored = pool_sql(
        stack["api"], "SELECT sum(length(token_ids)) AS n FROM prefix_nodes WHERE scope_id = 'tree'"
    )
    assert int(str(stored[0]["n"])) == distinct_prefixes, (
        "the stored nodes must hold each distinct prefix once"
    )


def test_status_reports_health_and_the_pool(stack: dict[str, str]) -> None:
    out = subprocess.run(
        [*CLAWR1, "status", "--api", stack["api"]], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "health: 200" in out.stdout
    summary = json.loads(out.stdout.split("pool:", 1)[1])
    assert int(summary["steps"]) >= 1


def test_every_role_exports_metrics_that_move_under_load(stack: dict[str, str]) -> None:
    from openai import OpenAI

    urls = {"proxy": stack["proxy_metrics"], "worker": stack["worker_metrics"],
            "api": f"{stack['api']}/metrics"}
    before = {role: scrape(url) for role, url in urls.items()}
    OpenAI(base_url=f"{stack['reverse']}/v1", api_key=SECRET).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count me"}])
    step = {"trajectory_id": "metrics-1", "step_index": 0, "prompt_token_ids": [1, 2],
            "response_token_ids": [3], "terminal": True}
    assert httpx.post(f"{stack['api']}/v1/steps", json=step).status_code == 202

    def moved(role: str, *counters: tuple[str, dict[str, str]],
              zero_lag: tuple[str, str] | None = None) -> dict[str, float]:
        """Scrape ``role`` until every counter grew (and the group's lag on a topic is 0)."""
        lag_key = zero_lag and f'clawr1_consumer_lag{{group="{zero_lag[0]}",topic="{zero_lag[1]}"}}'
        return wait_for(urls[role], lambda m: all(
            total(m, name, **labels) > total(before[role], name, **labels) for name, labels in counters)
            and (lag_key is None or m.get(lag_key) == 0))

    proxy = moved("proxy", ("clawr1_proxy_calls_captured_total", {"api": "openai.chat"}),
                  ("clawr1_proxy_records_delivered_total", {}))
    assert "clawr1_proxy_spool_depth{}" in proxy
    worker = moved("worker", ("clawr1_stream_records_in_total", {"topic": "clawr1.raw.llm"}),
                   ("clawr1_stream_records_in_total", {"topic": "clawr1.raw.steps"}),
                   ("clawr1_stream_messages_out_total", {"topic": "clawr1.steps"}),
                   ("clawr1_stream_records_out_total", {"topic": "clawr1.steps"}),
                   zero_lag=("clawr1-streams", "clawr1.raw.steps"))
    assert 'clawr1_consumer_lag{group="clawr1-streams",topic="clawr1.raw.llm"}' in worker
    moved("api", ("clawr1_http_requests_total", {"app": "api", "route": "/v1/steps", "status": "202"}),
          ("clawr1_http_requests_total", {"app": "api", "route": "/metrics", "status": "200"}),
          ("clawr1_sink_messages_in_total", {"topic": "clawr1.steps"}),
          ("clawr1_sink_rows_out_total", {"table": "step_versions"}),
          ("clawr1_sink_batch_messages_count", {}), ("clawr1_sink_flush_seconds_count", {}),
          ("clawr1_ingest_to_pool_seconds_count", {}),
          # A sampled gauge (every CLAWR1_METRICS_SAMPLE_S), behind the counters.
          ("clawr1_pool_rows", {"table": "step_versions"}),
          zero_lag=("clawr1-pool-sink", "clawr1.steps"))
