"""The stack contract: `clawr1 up` brings every part up on real Kafka and chDB, /healthz goes 200
only when all are ready, traffic from all ways in reaches the pool, and SIGINT stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import free_port, wait_http

CLAWR1 = [sys.executable, "-m", "clawr1.cli"]
SECRET = "sk-test-secret-must-not-be-stored"
PROMPT = list(range(10, 60))
GROUP = [[7, 8, 9], [7, 8, 1], [7, 2], [7, 8, 9, 4]]




@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One stack for the module; each test uses its own ids."""
    tmp_path = tmp_path_factory.mktemp("stack")
    ports = {name: free_port() for name in ("engine", "api", "proxy", "reverse")}
    kafka_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWR1_")}
    engine = subprocess.Popen([*CLAWR1, "standin-engine", "--port", str(ports["engine"])], env=env)
    up = subprocess.Popen(
        [
            *CLAWR1,
            "up",
            "--data-dir",
            str(tmp_path / "data"),
            "--proxy-port",
            str(ports["proxy"]),
            "--reverse-port",
            str(ports["reverse"]),
            "--upstream",
            f"http://127.0.0.1:{ports['engine']}",
            "--api-port",
            str(ports["api"]),
            "--kafka-port",
            str(kafka_port),
            "--compat-port",
            str(free_port()),
        ],
        env=env,
    )
    api = f"http://127.0.0.1:{ports['api']}"
    try:
        wait_http(f"http://127.0.0.1:{ports['engine']}/v1/models", 30, engine)
        wait_http(f"{api}/healthz", 240, up)
        yield {"api": api, "reverse": f"http://127.0.0.1:{ports['reverse']}", "data": str(tmp_path / "data")}
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0, "clawr1 up did not stop cleanly on SIGINT"
    finally:
        for process in (up, engine):
            if process.poll() is None:
                process.kill()
                process.wait()


def _sql(api: str, query: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [*CLAWR1, "sql", "--api", api, "--format", "JSONEachRow", query],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


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

    deadline = time.monotonic() + 120
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = _sql(
            stack["api"],
            "SELECT step_id, source_kind, trajectory_id, step_index, reward, "
            "reward_status, ready, prompt_messages FROM steps ORDER BY source_kind, step_index",
        )
        if len(rows) >= 3 + len(GROUP):
            break
        time.sleep(1)
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
    leaked = _sql(
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
    deadline = time.monotonic() + 120
    savings: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        savings = _sql(stack["api"], query)
        if savings and int(str(savings[0]["total_tokens"])) == sum(map(len, sequences)):
            break
        time.sleep(1)
    assert savings, "no prefix-tree savings for the group reached the pool"
    assert int(str(savings[0]["total_tokens"])) == sum(map(len, sequences))
    assert int(str(savings[0]["tree_tokens"])) == distinct_prefixes
    stored = _sql(
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
