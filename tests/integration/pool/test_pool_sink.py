"""The sink against the real broker: every curated topic lands in its table, bad messages become dead
letters, and a crash between insert and commit still leaves each step once, at its newest version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from clawr1.core.settings import Settings
from clawr1.pool.store import PoolStore
from clawr1.schemas.codec import codec_for, pack_record
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.pool_sink import EXIT_AFTER_INSERT_CODE
from tests.support.kafka import committed_lag, produce, wait_committed
from tests.support.pool import sink_config, sink_until_committed
from tests.support.records import record, step

REPO = Path(__file__).resolve().parents[3]


def test_sink_stores_every_topic_and_dead_letters_bad_messages(
        kafka_bootstrap: str, unique: str, pool_store: PoolStore) -> None:
    config = sink_config(unique)
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_partitions=2)
    produce(kafka_bootstrap, config.steps_topic, [
        *[(f"s{i}", "step", step(f"s{i}", 1, trajectory_id=f"t{i % 3}", step_index=i)) for i in range(30)],
        *[(f"s{i}", "step", step(f"s{i}", 2, trajectory_id=f"t{i % 3}", step_index=i, reward=float(i),
                                 reward_status="final", ready=True)) for i in range(0, 30, 2)],
        ("junk", "step", b"\x00not avro at all"),
        ("neg", "step", step("neg", 1, prompt_token_ids=[5, -1])),
    ])
    produce(kafka_bootstrap, config.feedback_topic, [
        ("s1", "feedback", record("feedback", feedback_id="f1", target_kind="step", target_id="s1",
                                  reward=1.0, received_at_ms=1_760_000_000_500)),
    ])
    produce(kafka_bootstrap, config.prefix_nodes_topic, [
        ("g1", "prefix_node", record("prefix_node", scope_id="g1", scope_kind="prompt_group", node_id="n1",
                                     token_ids=[1, 2], version=v, total_tokens=10 * v, tree_tokens=4 * v,
                                     forks=v, updated_at_ms=1_760_000_000_000 + v)) for v in (1, 2)
    ])
    produce(kafka_bootstrap, config.dlq_topic, [
        ("raw", "dead_letter", record("dead_letter", dlq_id="raw:0:7", reason="missing step_id",
                                      stage="validate", source_topic="clawr1.raw.steps", original_value=b"{}",
                                      failed_at_ms=1_760_000_000_000)),
    ])

    sink_until_committed(settings, pool_store, config)

    steps = {r["step_id"]: r for r in pool_store.query("SELECT step_id, version, reward, ready FROM steps")}
    assert len(steps) == 30
    assert all(steps[f"s{i}"]["version"] == (2 if i % 2 == 0 else 1) for i in range(30))
    assert steps["s4"]["reward"] == 4.0 and steps["s4"]["ready"] == 1
    feedback = pool_store.query("SELECT feedback_id, reward FROM feedback")
    assert feedback == [{"feedback_id": "f1", "reward": 1.0}]
    assert pool_store.query("SELECT total_tokens, tree_tokens, forks, savings_ratio FROM prefix_savings") == [
        {"total_tokens": 20, "tree_tokens": 8, "forks": 2, "savings_ratio": 2.5}]
    dead = {r["dlq_id"]: r for r in pool_store.query(
        "SELECT dlq_id, stage, reason, source_topic, original_value FROM dead_letters")}
    assert dead["raw:0:7"]["stage"] == "validate" and dead["raw:0:7"]["reason"] == "missing step_id"
    sink_made = [r for r in dead.values() if r["stage"] == "sink"]
    assert len(sink_made) == 2
    reasons = " | ".join(r["reason"] for r in sink_made)
    assert "undecodable" in reasons and "prompt_token_ids holds ids outside" in reasons
    assert any(r["original_value"] == "\x00not avro at all" for r in sink_made)


def envelope(schema: str, records: list[dict[str, object]]) -> bytes:
    return codec_for().encode_batch(schema, [pack_record(schema, r) for r in records])


def test_sink_stores_envelopes_as_columns_and_words_a_bad_record_alone(
        kafka_bootstrap: str, unique: str, pool_store: PoolStore) -> None:
    config = sink_config(unique)
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_partitions=2)
    good = [step(f"e{i}", 1, trajectory_id="te", step_index=i, prompt_token_ids=list(range(i, i + 50)),
                 response_logprobs=[-0.25, -0.5]) for i in range(10)]
    mixed = [step(f"m{i}", 1, trajectory_id="tm", step_index=i) for i in range(5)]
    mixed[3]["prompt_token_ids"] = [1, -2]
    odd = pack_record("step", step("o1", 1, trajectory_id="to"))
    odd["prompt_token_ids"] += b"\x01"  # no int32 array has 13 bytes
    produce(kafka_bootstrap, config.steps_topic, [
        ("te", "step", envelope("step", good)), ("tm", "step", envelope("step", mixed)),
        ("to", "step", codec_for().encode_batch("step", [odd]))])
    produce(kafka_bootstrap, config.prefix_nodes_topic, [("g", "prefix_node", envelope("prefix_node", [
        record("prefix_node", scope_id="g", scope_kind="prompt_group", node_id=f"n{i}", token_ids=[i, i + 1],
               version=1, total_tokens=4, tree_tokens=2, forks=1, updated_at_ms=1_760_000_000_000)
        for i in range(3)]))])

    sink_until_committed(settings, pool_store, config)

    steps = {r["step_id"]: r for r in pool_store.query(
        "SELECT step_id, prompt_token_ids, response_logprobs FROM steps")}
    assert sorted(steps) == sorted([*(f"e{i}" for i in range(10)), "m0", "m1", "m2", "m4"])
    assert steps["e7"]["prompt_token_ids"] == list(range(7, 57)) and steps["e7"]["response_logprobs"] == [
        -0.25, -0.5]
    letters = pool_store.query("SELECT dlq_id, reason, original_value FROM dead_letters")
    [dead] = [d for d in letters if "#" in d["dlq_id"]]  # a record of an envelope
    [odd_dead] = [d for d in letters if "#" not in d["dlq_id"]]  # a whole message
    assert "prompt_token_ids holds ids outside" in dead["reason"]
    assert dead["dlq_id"].endswith("#3")
    assert codec_for().decode(bytes.fromhex(dead["original_value"]))[1]["step_id"] == "m3"  # cited alone
    assert "invalid 'step' record" in odd_dead["reason"]
    assert codec_for().writer_of(bytes.fromhex(odd_dead["original_value"])).name == "step_batch"  # as it came
    assert pool_store.query("SELECT count() AS n FROM prefix_nodes") == [{"n": 3}]


def _sink_env(config: SinkConfig, bootstrap: str, pool_path: Path, exit_after_insert: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWR1_")}
    env.update({
        "CLAWR1_KAFKA_BOOTSTRAP": bootstrap, "CLAWR1_CLICKHOUSE_DSN": f"chdb://{pool_path}",
        "CLAWR1_TOPIC_PARTITIONS": "2", "CLAWR1_SINK_STEPS_TOPIC": config.steps_topic,
        "CLAWR1_SINK_PREFIX_NODES_TOPIC": config.prefix_nodes_topic,
        "CLAWR1_SINK_DLQ_TOPIC": config.dlq_topic,
        "CLAWR1_SINK_FEEDBACK_TOPIC": config.feedback_topic, "CLAWR1_SINK_GROUP": config.group_id,
        "CLAWR1_SINK_BATCH_ROWS": "100000", "CLAWR1_SINK_BATCH_SECONDS": "1.0",
        "CLAWR1_SINK_SESSION_TIMEOUT_MS": "6000",
        "CLAWR1_SINK_EXIT_AFTER_INSERT": "1" if exit_after_insert else "0",
        "PYTHONPATH": str(REPO),
    })
    return env


def _query_pool(pool_path: Path, sql: str) -> list[dict[str, object]]:
    """Read the sink's pool from another process: this test process holds the session's chDB path."""
    out = subprocess.run([sys.executable, "-m", "clawr1.pool.sql_cli", "--dsn", f"chdb://{pool_path}",
                          "--format", "JSONEachRow", sql],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_sink_killed_between_insert_and_commit_keeps_each_step_once(
        kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    config = sink_config(unique)
    pool_path = tmp_path / "pool"
    produce(kafka_bootstrap, config.steps_topic, [
        *[(f"s{i}", "step", step(f"s{i}", 1, trajectory_id=f"t{i % 4}", step_index=i)) for i in range(50)],
        *[(f"s{i}", "step", step(f"s{i}", 3, trajectory_id=f"t{i % 4}", step_index=i, reward=1.0,
                                 reward_status="final")) for i in range(0, 50, 5)],
    ])
    sink = [sys.executable, "-m", "clawr1.sinks.runner"]

    crashed = subprocess.run(sink, env=_sink_env(config, kafka_bootstrap, pool_path, True), cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == EXIT_AFTER_INSERT_CODE, crashed.stderr[-2000:]
    lag = committed_lag(kafka_bootstrap, config.group_id, [config.steps_topic])
    assert lag == 60, "the crashed sink committed offsets"
    inserted = _query_pool(pool_path, "SELECT count() AS n FROM step_versions")[0]["n"]
    assert inserted, "the crashed sink inserted nothing"

    produce(kafka_bootstrap, config.steps_topic, [
        (f"s{i}", "step", step(f"s{i}", 2, trajectory_id=f"t{i % 4}", step_index=i)) for i in range(0, 50, 5)
    ])  # older than the v3 already stored: must not win
    restarted = subprocess.Popen(sink, env=_sink_env(config, kafka_bootstrap, pool_path, False), cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_committed(kafka_bootstrap, config.group_id, [config.steps_topic], timeout=90)
    finally:
        restarted.terminate()
        _, err = restarted.communicate(timeout=60)
    assert restarted.returncode == 0, err[-2000:]

    rows = _query_pool(pool_path, "SELECT step_id, version, reward_status FROM steps ORDER BY step_id")
    assert len(rows) == 50
    assert len({r["step_id"] for r in rows}) == 50
    for r in rows:
        newest = 3 if int(str(r["step_id"])[1:]) % 5 == 0 else 1
        assert r["version"] == newest, r
        assert r["reward_status"] == ("final" if newest == 3 else "pending")
