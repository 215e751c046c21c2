"""A real stream worker on the real broker replays the recorded mix: exact steps, dead letters and
prefix trees, and the same final state when the worker is SIGKILLed mid-stream and restarted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource
from tokenizers import Tokenizer

from clawr1.streams import quix_compat
from tests.integration.streams.conftest import (
    Outputs,
    Result,
    WorkerRun,
    final_state,
    kept_dead_letters,
    settled,
)
from tests.integration.streams.mix import (
    ENGINE_TOKENS,
    EXPECTED_DEAD_LETTERS,
    EXPECTED_STEPS,
    EXPECTED_TRAJECTORY_TREE,
    FEEDBACK_OF_G0,
    FIELDS,
    LINK_STATUS,
    MIX,
    RETOKENIZED_TEXT,
)


def test_latest_version_of_every_step_is_exact(uninterrupted: Result) -> None:
    latest = uninterrupted.steps
    assert {step_id: tuple(latest[step_id][f] for f in FIELDS) for step_id in latest} == EXPECTED_STEPS
    assert {step_id: record["link_status"] for step_id, record in latest.items()} == LINK_STATUS
    assert {record["channel"] for record in latest.values()} == {"train"}
    # Only the call without hints has an inferred group; hinted and n > 1 groups are given.
    assert {s for s, record in latest.items() if record["prompt_group_inferred"]} == {"c1", "c2", "c3"}
    assert {latest[s]["prompt_group_closes_at_ms"] for s in ("c1", "c2", "c3")} == {1_000 + 60_000}
    for step_id, (prompt, response) in ENGINE_TOKENS.items():
        assert (latest[step_id]["prompt_token_ids"], latest[step_id]["response_token_ids"]) == (
            prompt,
            response,
        )
        assert latest[step_id]["tokenizer"] is None


def test_the_state_changelog_is_the_one_the_worker_created(uninterrupted: Result) -> None:
    """The worker creates its changelog before Quix looks for it (``quix_compat.changelog_topic``): a
    Quix that named it otherwise would have made a second one, and state would go where the worker did
    not prepare it."""
    run = uninterrupted.run
    admin = AdminClient({"bootstrap.servers": run.bootstrap})
    listed = admin.list_topics(timeout=10).topics
    changelogs = {name for name in listed if name.startswith(f"changelog__{run.app_id}-")}
    expected = quix_compat.changelog_topic(run.app_id, run.topics.work)
    assert changelogs == {expected}
    assert len(listed[expected].partitions) == len(listed[run.topics.work].partitions)
    resource = ConfigResource(ConfigResource.Type.TOPIC, expected)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["cleanup.policy"].value == "compact"


def test_retokenized_steps_spell_the_template(uninterrupted: Result) -> None:
    tokenizer = Tokenizer.from_file(uninterrupted.run.tokenizer)
    latest = uninterrupted.steps
    for step_id, (prompt, response) in RETOKENIZED_TEXT.items():
        record = latest[step_id]
        assert record["prompt_token_ids"] == tokenizer.encode(prompt, add_special_tokens=False).ids
        assert record["response_token_ids"] == tokenizer.encode(response, add_special_tokens=False).ids
        assert record["tokenizer"].startswith(Path(uninterrupted.run.tokenizer).parent.name + "@sha256:")
    failed = latest["fail-1"]
    assert (failed["prompt_token_ids"], failed["response_token_ids"], failed["error"]) == (
        [],
        [],
        "upstream status 500",
    )


def test_feedback_kept_with_its_source(uninterrupted: Result) -> None:
    latest = uninterrupted.steps
    assert json.loads(latest["g:0"]["feedback_json"]) == FEEDBACK_OF_G0
    assert latest["g:0"]["quality_score"] == 1.0
    assert [f["feedback_id"] for f in json.loads(latest["c2"]["feedback_json"])] == [
        "fb-c2a",
        "fb-c2b",
        "fb-traj",
    ]
    assert latest["g:1"]["reward_components"] == {"format": 0.0}
    assert latest["g:0"]["policy_version"] == 7 and latest["c1"]["model"] == "m1"
    assert {latest[s]["source_kind"] for s in ("c1", "w0", "svc-1-0")} == {
        "blackbox_agent",
        "whitebox_agent",
        "blackbox_service",
    }


def test_dead_letters_carry_reason_position_and_bytes(uninterrupted: Result) -> None:
    letters = kept_dead_letters(uninterrupted.outputs, uninterrupted.run.topics)
    assert len(letters) == len(EXPECTED_DEAD_LETTERS)
    for (topic, stage, reason, value), expected in zip(letters, sorted(EXPECTED_DEAD_LETTERS), strict=True):
        assert (topic, stage, value) == (expected[0], expected[1], expected[3]) and expected[2] in reason
    for letter in uninterrupted.outputs.dead_letters:
        position = f"{letter['source_topic']}:{letter['source_partition']}:{letter['source_offset']}"
        assert letter["dlq_id"] == position and letter["source_offset"] is not None


def test_prefix_tree_of_the_conversation(uninterrupted: Result) -> None:
    scopes = uninterrupted.outputs.tree_nodes()
    conversation = scopes["c1"]  # its inferred prompt group (a rollout without hints)
    assert {n["scope_kind"] for n in conversation["nodes"].values()} == {"prompt_group"}
    nodes = sorted((n["depth_start"], n["token_ids"], n["step_ids"]) for n in conversation["nodes"].values())
    assert nodes == EXPECTED_TRAJECTORY_TREE["nodes"]
    assert conversation["figures"][1:] == (
        EXPECTED_TRAJECTORY_TREE["total_tokens"],
        EXPECTED_TRAJECTORY_TREE["tree_tokens"],
        EXPECTED_TRAJECTORY_TREE["forks"],
    )
    group = scopes["g"]  # both samples share the templated prompt
    assert {n["scope_kind"] for n in group["nodes"].values()} == {"prompt_group"}
    assert group["figures"][2] < group["figures"][1]
    assert "fail-1" not in json.dumps(scopes) and "tr-f" not in scopes


def test_sigkill_mid_stream_then_restart_reaches_the_same_final_state(
    uninterrupted: Result, worker_runs: Callable[[], tuple[WorkerRun, Outputs]]
) -> None:
    run, outputs = worker_runs()
    run.start()
    run.produce(MIX[:14])
    outputs.wait_for(lambda o: len(o.steps) >= 3, 60, run)
    run.kill()  # mid-stream: offsets and table changes since the last commit are uncommitted
    run.produce(MIX[14:])
    run.start()
    outputs.wait_for(settled, 90, run)
    outputs.poll(2.0)
    final, reference = final_state(Result(run, outputs)), final_state(uninterrupted)
    assert final["steps"] == reference["steps"]
    assert final["dead_letters"] == reference["dead_letters"]
    assert final["trees"] == reference["trees"]
    assert run.stop() == 0  # SIGTERM stops the worker cleanly
