"""The trajectory view and a prompt group's rollouts over the real chDB pool: steps in conversation
order with only what each added, feedback per step, and token ids decoded by the tokenizer that made them."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

from fastapi.testclient import TestClient

from clawr1.dashboard.decoding import load_decoder
from clawr1.pool.store import PoolStore
from clawr1.sinks.rows import STEPS_ROUTE
from tests.integration.dashboard.conftest import MESSAGES, T0, client_for, insert, step
from tests.support.events import build_tokenizer


def test_a_trajectory_lists_its_steps_in_order_with_their_feedback(client: TestClient) -> None:
    response = client.get("/v1/dashboard/trajectories/a")
    assert response.status_code == 200, response.text
    body = response.json()
    assert [s["step_id"] for s in body["steps"]] == ["a0", "a1", "a2"]
    head = body["trajectory"]
    assert (head["steps"], head["reward_sum"], head["policy_versions"], head["prompt_group_id"],
            head["terminal"], head["all_ready"]) == (3, 1.5, [1], "g1", True, True)
    a0, a1, _ = body["steps"]
    assert [f["feedback_id"] for f in a0["feedback_records"]] == ["f1"]  # aimed at the step
    assert [f["feedback_id"] for f in a1["feedback_records"]] == ["f2"]  # aimed at its response
    assert body["feedback_records"] == [] and body["more_steps"] is False and body["decoder"] is None
    assert a1["prompt"]["messages"] == json.loads(MESSAGES) and a1["response_text"] == "4"
    # Every scenario step sends prompt ids [1, 2, 3]: after a0's prompt + response nothing of a1's is new.
    assert (a1["prompt_ids"]["start"], a1["prompt_ids"]["ids"], a1["prompt_ids"]["pieces"]) == (3, [], None)


def test_feedback_on_the_whole_trajectory_and_a_failed_step_show(client: TestClient) -> None:
    body = client.get("/v1/dashboard/trajectories/c").json()
    assert [f["correction"] for f in body["feedback_records"]] == ["use the cache"]
    assert [(s["step_id"], s["status"], s["error"]) for s in body["steps"]] == [
        ("c0", "ok", None), ("c1", "failed", "upstream 502")]
    assert body["steps"][0]["tokenizer"] == "tok@abc" and body["trajectory"]["failed"] == 1


def test_a_prompt_group_shows_its_rollouts_and_their_shared_prompt(client: TestClient) -> None:
    response = client.get("/v1/dashboard/prompt-groups/g1")
    assert response.status_code == 200, response.text
    body = response.json()
    assert [(t["trajectory_id"], t["num_steps"], t["reward_sum"]) for t in body["trajectories"]] == [
        ("a", 3, 1.5), ("b", 2, 1.0)]


def test_unknown_trajectories_and_groups_are_404s_naming_them(client: TestClient) -> None:
    for path in ("/v1/dashboard/trajectories/nope", "/v1/dashboard/prompt-groups/nope"):
        response = client.get(path)
        assert response.status_code == 404 and "nope" in response.text, path


def test_a_conversation_is_decoded_with_the_tokenizer_that_made_its_ids(
        pool_store: PoolStore, tmp_path: Path) -> None:
    decoder = load_decoder(build_tokenizer(str(tmp_path / "tokenizer.json")))
    assert decoder is not None
    ids = decoder.tokenizer.token_to_id
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    turn = {"tokenizer": decoder.identity, "token_provenance": "retokenized"}
    records = [
        step("t0", "chat/1", 0, 1, prompt_messages=json.dumps(first), response_text="hello",
             prompt_token_ids=[ids("hi"), ids("there")], response_token_ids=[ids("hello")], **turn),
        step("t1", "chat/1", 1, 2, prompt_messages=json.dumps(second), response_text="answer",
             prompt_token_ids=[ids("hi"), ids("there"), ids("hello"), ids("more")],
             response_token_ids=[ids("answer")], **turn),
    ]
    insert(pool_store, STEPS_ROUTE, records, [T0] * 2)
    with client_for(pool_store, decoder) as client:
        response = client.get(f"/v1/dashboard/trajectories/{quote('chat/1', safe='')}")
        assert response.status_code == 200, response.text
        body = response.json()
    assert body["decoder"] == decoder.identity
    t0, t1 = body["steps"]
    assert (t0["prompt_ids"]["pieces"], t0["response_ids"]["pieces"]) == (["hi", "there"], ["hello"])
    # Step 1 adds one user message, and one token after step 0's prompt and reply.
    assert (t1["prompt"]["repeated"], t1["prompt"]["messages"]) == (3, [{"role": "user", "content": "more"}])
    assert (t1["prompt_ids"]["start"], t1["prompt_ids"]["pieces"], t1["response_ids"]["pieces"]) == (
        3, ["more"], ["answer"])
