"""Accepted submissions land on their topics exactly once per Idempotency-Key, decoded by the codec."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from clawr1.core.routing import partition_of
from clawr1.core.settings import Settings
from tests.support.gateway import TEST_PARTITIONS, LiveGateway, message_count, running_gateway


def step(trajectory: str, index: int, **extra: Any) -> dict[str, Any]:
    return {"trajectory_id": trajectory, "step_index": index, "prompt_token_ids": [1, 2, index],
            "response_token_ids": [7, 8], "response_logprobs": [-0.5, -1.5], **extra}


def on_topic(gateway: LiveGateway, kind: str, key: str) -> list[dict[str, Any]]:
    return [record for k, record in gateway.read(kind) if k == key]


def test_steps_are_produced_once_per_idempotency_key(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    batch = [step(traj, 0, prompt_group_id="g1", prompt_group_size=4, policy_version=3, model="m",
                  agent="a", metadata={"env": "math"}, prompt_messages=[{"role": "user", "content": "q"}],
                  response_text="a"),
             step(traj, 1, reward=1.0, terminal=True), step(traj, 2, step_id="given-id", reward_final=False)]
    headers = {"Idempotency-Key": f"k-{traj}"}
    first = gateway.http.post("/v1/steps", json=batch, headers=headers)
    assert first.status_code == 202, first.text
    replays = [gateway.http.post("/v1/steps", json=batch, headers=headers) for _ in range(2)]
    assert [r.status_code for r in replays] == [202, 202]
    assert all(r.content == first.content and r.headers["idempotent-replayed"] == "true" for r in replays)
    ids = first.json()["ids"]
    assert first.json()["accepted"] == 3 and ids[2] == "given-id" and len(set(ids)) == 3

    records = on_topic(gateway, "steps", traj)
    assert sorted(r["step_id"] for r in records) == sorted(ids)
    by_index = {r["step_index"]: r for r in records}
    head = by_index[0]
    assert head["prompt_token_ids"] == [1, 2, 0] and head["response_logprobs"] == [-0.5, -1.5]
    assert (head["prompt_group_id"], head["prompt_group_size"], head["policy_version"]) == ("g1", 4, 3)
    assert json.loads(head["prompt_messages"]) == [{"role": "user", "content": "q"}]
    assert json.loads(head["metadata_json"]) == {"env": "math"} and head["source_name"] == "anonymous"
    assert by_index[1]["reward"] == 1.0 and by_index[1]["terminal"] is True
    assert by_index[2]["reward_final"] is False and head["received_at_ms"] > 0


def test_concurrent_retries_with_one_key_produce_once(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    body = [step(traj, i) for i in range(5)]

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            return client.post("/v1/steps", json=body, headers={"Idempotency-Key": traj})

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(post, range(6)))
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {202, 409} and 202 in statuses
    assert all(r.headers.get("retry-after") for r in replies if r.status_code == 409)
    assert len(on_topic(gateway, "steps", traj)) == 5


def test_reused_key_with_another_body_is_refused(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    headers = {"Idempotency-Key": traj}
    assert gateway.http.post("/v1/steps", json=step(traj, 0), headers=headers).status_code == 202
    other = gateway.http.post("/v1/steps", json=step(traj, 1), headers=headers)
    assert other.status_code == 422 and other.json()["error"] == "idempotency_mismatch"
    assert [r["step_index"] for r in on_topic(gateway, "steps", traj)] == [0]


def test_resubmitted_step_keeps_its_generated_id(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    first = gateway.http.post("/v1/steps", json=step(traj, 0, reward=0.0, reward_final=False))
    final = gateway.http.post("/v1/steps", json=step(traj, 0, reward=1.0))
    assert first.status_code == final.status_code == 202
    assert first.json()["ids"] == final.json()["ids"]
    records = on_topic(gateway, "steps", traj)
    assert len({r["step_id"] for r in records}) == 1 and len({r["content_digest"] for r in records}) == 2


def test_feedback_is_keyed_by_its_target_and_produced_once(gateway: LiveGateway) -> None:
    target = f"step-{uuid.uuid4().hex[:8]}"
    body = [{"step_id": target, "reward": 0.5, "components": {"format": 1.0, "answer": 0.0},
             "source": "rule"},
            {"step_id": target, "label": "bad", "comment": "wrong tool", "correction": "use calc",
             "final": False, "source": "human"}]
    headers = {"Idempotency-Key": target}
    replies = [gateway.http.post("/v1/feedback", json=body, headers=headers) for _ in range(3)]
    assert [r.status_code for r in replies] == [202] * 3
    records = on_topic(gateway, "feedback", target)
    assert sorted(r["feedback_id"] for r in records) == sorted(replies[0].json()["ids"])
    rule, human = sorted(records, key=lambda r: r["source"], reverse=True)
    assert rule["target_kind"] == "step" and rule["components"] == {"format": 1.0, "answer": 0.0}
    assert (human["label"], human["correction"], human["final"]) == ("bad", "use calc", False)


def test_events_are_produced_once_with_their_payload(gateway: LiveGateway) -> None:
    traj = f"traj-{uuid.uuid4().hex[:8]}"
    turn = {"prompt_messages": [{"role": "user", "content": "2+2?"}], "response_text": "4", "model": "m",
            "reward": 1.0, "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    body = [{"kind": "turn", "trajectory_id": traj, "step_index": 0, "timestamp_ms": 1_700_000_000_000,
             "payload": turn},
            {"kind": "user_action", "trajectory_id": traj, "payload": {"action": "thumbs_up"}}]
    headers = {"Idempotency-Key": traj}
    replies = [gateway.http.post("/v1/events", json=body, headers=headers) for _ in range(2)]
    assert [r.status_code for r in replies] == [202, 202]
    produced = on_topic(gateway, "events", traj)
    assert sorted(r["event_id"] for r in produced) == sorted(replies[0].json()["ids"])
    records = {r["kind"]: r for r in produced}
    assert json.loads(records["turn"]["payload_json"]) == turn
    assert records["turn"]["timestamp_ms"] == 1_700_000_000_000 and records["turn"]["step_index"] == 0
    assert records["user_action"]["timestamp_ms"] == records["user_action"]["received_at_ms"]


def test_health_and_openapi(gateway: LiveGateway) -> None:
    health = gateway.http.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "parts": {"kafka": True},
                                                           "problems": {}}
    spec = gateway.http.get("/openapi.json").json()
    assert {"/v1/steps", "/v1/feedback", "/v1/events", "/healthz"} <= set(spec["paths"])
    schemas = set(spec["components"]["schemas"])
    assert {"StepIn", "FeedbackIn", "EventIn", "TurnPayload", "ErrorBody"} <= schemas


def test_a_request_is_one_envelope_per_partition(gateway: LiveGateway) -> None:
    run = uuid.uuid4().hex[:8]
    steps = [step(f"traj-{run}-{n}", 0) for n in range(20)]
    events = [{"kind": "user_action", "trajectory_id": f"traj-{run}-{n}", "payload": {}} for n in range(20)]
    feedback = [{"step_id": f"step-{run}-{n}", "reward": 1.0} for n in range(20)]
    for kind, body, key in (("steps", steps, "trajectory_id"), ("events", events, "trajectory_id"),
                            ("feedback", feedback, "step_id")):
        topic = getattr(gateway.topics, kind)
        before = message_count(gateway.bootstrap, topic)
        reply = gateway.http.post(f"/v1/{kind}", json=body)
        assert reply.status_code == 202, reply.text
        partitions = {partition_of(item[key], TEST_PARTITIONS) for item in body}
        assert message_count(gateway.bootstrap, topic) - before == len(partitions) == TEST_PARTITIONS
        produced = {k for k, _ in gateway.read(kind)}  # read_topic checks each record's partition
        assert {item[key] for item in body} <= produced


def test_an_envelope_too_large_for_kafka_is_split_and_only_a_record_too_large_alone_is_413(
        kafka_bootstrap: str) -> None:
    settings = Settings(max_request_bytes=4 * 1024 * 1024)
    with running_gateway(kafka_bootstrap, settings=settings,
                         producer_overrides={"message.max.bytes": 8000}) as small:
        traj = f"traj-{uuid.uuid4().hex[:8]}"
        body = [step(traj, n, prompt_token_ids=list(range(500))) for n in range(12)]  # ~2 KB each
        reply = small.http.post("/v1/steps", json=body)
        assert reply.status_code == 202, reply.text
        records = [r for k, r in small.read("steps") if k == traj]
        assert sorted(r["step_index"] for r in records) == list(range(12))
        assert 3 <= message_count(kafka_bootstrap, small.topics.steps) < 12
        alone = small.http.post("/v1/steps", json=step(f"{traj}-big", 0, prompt_token_ids=list(range(3000))))
        assert alone.status_code == 413 and alone.json()["error"] == "record_too_large", alone.text
        assert not [r for k, r in small.read("steps") if k == f"{traj}-big"]
