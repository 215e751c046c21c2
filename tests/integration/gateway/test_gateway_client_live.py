"""The httpx client against a live gateway: batching, ids, and retrying until the gateway is up."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

from clawr1.core.settings import Settings
from clawr1.gateway.app import create_app
from clawr1.gateway.client import GatewayClient
from tests.support.asgi import AsgiServer
from tests.support.gateway import TEST_PARTITIONS, LiveGateway, read_topic, unique_topics
from tests.support.ports import free_port


def steps(traj: str, count: int) -> list[dict[str, object]]:
    return [{"trajectory_id": traj, "step_index": i, "prompt_token_ids": [1, i],
             "response_token_ids": [i + 2], "response_logprobs": [-0.1]} for i in range(count)]


def test_client_batches_steps_and_sends_feedback(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    with GatewayClient(gateway.url, batch_size=2) as client:
        ids = client.submit_steps(steps(traj, 5))
        [feedback_id] = client.submit_feedback({"step_id": ids[-1], "reward": 1.0, "source": "rule"})
        assert client.health()["status"] == "ok"
    produced = {r["step_id"]: r["step_index"] for key, r in gateway.read("steps") if key == traj}
    assert produced == {step_id: index for index, step_id in enumerate(ids)}
    [(_, feedback)] = [(k, r) for k, r in gateway.read("feedback") if k == ids[-1]]
    assert feedback["feedback_id"] == feedback_id and feedback["reward"] == 1.0


def test_client_retries_until_the_gateway_is_up(kafka_bootstrap: str) -> None:
    topics, port = unique_topics(), free_port()
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_partitions=TEST_PARTITIONS)
    server = AsgiServer(create_app(settings, topics=topics), port)
    starter = threading.Timer(0.5, server.start)
    starter.start()
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    try:
        with GatewayClient(f"http://127.0.0.1:{port}", max_retries=10, backoff_s=0.1,
                           max_backoff_s=2) as client:
            ids = client.submit_steps(steps(traj, 3))
    finally:
        starter.join()
        server.stop()
    assert sorted(r["step_id"] for _, r in read_topic(kafka_bootstrap, topics.steps)) == sorted(ids)


def test_whitebox_agent_example_runs(gateway: LiveGateway) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "whitebox_agent.py"
    done = subprocess.run([sys.executable, str(example), "--api", gateway.url, "--group-size", "2"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    group = done.stdout.strip().splitlines()[-1].split()[1].rstrip(":")
    grouped = [r for _, r in gateway.read("steps") if r["prompt_group_id"] == group]
    assert len(grouped) == 6 and {r["prompt_group_size"] for r in grouped} == {2}
