"""Feedback the worker could no longer join (its step's state had expired) reaches the step in the pool:
the sink folds it into the step's last version, once, however often the dead letter is replayed."""

from __future__ import annotations

import json

import orjson

from clawr1.core.settings import Settings
from clawr1.pool.store import PoolStore
from tests.integration.pool.kafka_helpers import produce
from tests.integration.pool.records import record, step
from tests.integration.pool.test_pool_sink import sink_config, sink_until_committed

TRAJECTORY = "t-expired"


def _fact(feedback_id: str, target_kind: str, target_id: str, reward: float, **extra: object) -> bytes:
    """Feedback of a key that may give it on any trajectory (``privileged``), unless ``extra`` says not."""
    return orjson.dumps({"feedback_id": feedback_id, "target_kind": target_kind, "target_id": target_id,
                         "reward": reward, "components": {}, "final": True, "source": "human",
                         "source_name": "curator", "label": None, "comment": None, "correction": None,
                         "received_at_ms": 1_760_000_100_000, "privileged": True, **extra})


def _letter(dlq_id: str, fact: bytes) -> dict[str, object]:
    return record("dead_letter", dlq_id=dlq_id, reason="feedback for a step whose state had expired",
                  stage="expire", source_topic="clawr1.raw.feedback", original_value=fact,
                  failed_at_ms=1_760_000_100_000)


def _steps(pool_store: PoolStore) -> dict[str, dict[str, object]]:
    rows = pool_store.query("SELECT step_id, version, reward, reward_status, trajectory_reward, "
                            "trajectory_reward_status, feedback_json, ready, prompt_token_ids FROM steps "
                            "WHERE trajectory_id = {t:String}", parameters={"t": TRAJECTORY})
    return {str(r["step_id"]): r for r in rows}


def test_expired_feedback_is_joined_in_the_pool_once(kafka_bootstrap: str, unique: str,
                                                      pool_store: PoolStore) -> None:
    config = sink_config(unique)
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_partitions=2)
    produce(kafka_bootstrap, config.steps_topic, [
        (s, "step", step(s, 3, trajectory_id=TRAJECTORY, step_index=i, reward_status="pending",
                         trajectory_reward_status="pending", feedback_json="[]"))
        for i, s in enumerate(("e0", "e1"))
    ])
    sink_until_committed(settings, pool_store, config)
    assert {s: r["version"] for s, r in _steps(pool_store).items()} == {"e0": 3, "e1": 3}

    letters = [
        ("on-trajectory", _fact("fb-t", "trajectory", TRAJECTORY, 0.75, terminal=True)),
        ("on-step", _fact("fb-s", "step", "e1", 1.0)),
        ("on-nothing", _fact("fb-x", "step", "no-such-step", 1.0)),
        # Another source's step, unprivileged: as the worker would, the sink leaves it a dead letter only.
        ("not-owner", _fact("fb-o", "step", "e0", -5.0, privileged=False, source_name="mallory")),
    ]
    produce(kafka_bootstrap, config.dlq_topic, [(k, "dead_letter", _letter(k, f)) for k, f in letters])
    sink_until_committed(settings, pool_store, config)
    steps = _steps(pool_store)
    assert {s: r["trajectory_reward"] for s, r in steps.items()} == {"e0": 0.75, "e1": 0.75}
    assert steps["e1"]["reward"] == 1.0 and steps["e1"]["reward_status"] == "final"
    assert steps["e0"]["reward"] is None
    assert steps["e0"]["version"] == 4 and steps["e1"]["version"] == 5  # one version per fact folded in
    assert list(steps["e1"]["prompt_token_ids"]) == [1, 2, 3]  # the rest of the step is as it was
    assert {f["feedback_id"] for f in json.loads(str(steps["e1"]["feedback_json"]))} == {"fb-t", "fb-s"}
    kept = pool_store.query("SELECT dlq_id FROM dead_letters WHERE stage = 'expire'")
    assert {r["dlq_id"] for r in kept} >= {k for k, _ in letters}  # the dead letters stay as the record

    # The same dead letters again (a replay): the steps hold their feedback already, nothing changes.
    produce(kafka_bootstrap, config.dlq_topic, [(k, "dead_letter", _letter(k, f)) for k, f in letters])
    sink_until_committed(settings, pool_store, config)
    assert {s: r["version"] for s, r in _steps(pool_store).items()} == {"e0": 4, "e1": 5}
