"""Consumer forms and failures over the real pool: iteration, waiting polls, training-ready batches,
closed consumers, and transport errors translated into the SDK's own."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from clawr1.consumer_sdk import (
    ConsumerClosed,
    PoolConsumer,
    PoolRequestError,
    PoolUnavailable,
    UsageError,
)
from clawr1.pool.store import PoolStore
from tests.support.pool import Pool, database_dsn, sdk_direct_source, step
from tests.support.ports import free_port


def test_iterator_and_context_manager(pool: Pool, source: str) -> None:
    pool.write(*(step(f"i{i}") for i in range(5)))
    got: list[str] = []
    with PoolConsumer(source, "iterate") as consumer:
        for batch in consumer.iter_batches(max_steps=2, idle_timeout=0.2):
            got.extend(batch.step_ids)
            consumer.commit()
        assert consumer.uncommitted == 0
    assert consumer.closed
    assert got == [f"i{i}" for i in range(5)]
    pool.write(step("i5"))
    with PoolConsumer(source, "iterate") as consumer:
        for batch in consumer:  # blocks until a batch comes; the trainer decides when to stop
            assert list(batch.step_ids) == ["i5"]
            break


def test_poll_waits_for_steps_that_arrive(pool: Pool, source: str) -> None:
    with PoolConsumer(source, "waiter") as consumer:
        started = time.monotonic()
        assert not consumer.poll(timeout=0.3)
        assert time.monotonic() - started >= 0.3
        writer = threading.Timer(0.3, pool.write, args=(step("arrives"),))
        writer.start()
        try:
            batch = consumer.poll(timeout=20)
        finally:
            writer.join()
        assert list(batch.step_ids) == ["arrives"]


def test_polled_batch_is_training_ready(pool: Pool, source: str) -> None:
    pool.write(
        step("a", prompt_group_id="g", prompt_group_size=2, prompt_token_ids=[7, 8, 9],
             response_token_ids=[10, 11], response_logprobs=[-0.1, -0.2], reward=1.0, policy_version=2,
             prompt_messages='[{"role": "user", "content": "hi"}]', token_provenance="engine"),
        step("b", prompt_group_id="g", prompt_group_size=2, prompt_token_ids=[7, 8, 9],
             response_token_ids=[12], reward=0.0, policy_version=2),
    )
    with PoolConsumer(source, "train", with_text=True) as consumer:
        batch = consumer.poll()
    a, b = batch
    assert a.prompt_token_ids.tolist() == [7, 8, 9] and a.response_logprobs is not None
    assert b.response_logprobs is None
    assert a.metadata["token_provenance"] == "engine" and a.metadata["source_kind"] == "whitebox_agent"
    assert "hi" in a.metadata["prompt_messages"]
    arrays = batch.to_numpy()
    assert arrays.input_ids.tolist() == [[7, 8, 9, 10, 11], [7, 8, 9, 12, 0]]
    assert arrays.loss_mask.sum() == 3
    assert np.allclose(arrays.old_logprobs[0, 3:], [-0.1, -0.2])
    assert arrays.rewards.tolist() == [1.0, 0.0] and arrays.group_index.tolist() == [0, 0]
    table = batch.to_arrow()
    assert table.num_rows == 2 and "prompt_token_ids" in table.column_names
    packed = batch.pack_tree(advantages=[1.0, -1.0])
    assert packed.tree_tokens == 3 + 2 + 1 and packed.total_tokens == 9


def test_without_text_columns_by_default(pool: Pool, source: str) -> None:
    pool.write(step("plain", prompt_messages="[]"))
    with PoolConsumer(source, "lean") as consumer:
        (s,) = consumer.poll()
    assert "prompt_messages" not in s.metadata and "response_text" not in s.metadata


def test_closed_consumer_refuses_work(pool: Pool, source: str) -> None:
    consumer = PoolConsumer(source, "closing")
    consumer.close()
    consumer.close()  # idempotent
    for call in (consumer.poll, consumer.commit, lambda: consumer.seek("latest")):
        with pytest.raises(ConsumerClosed):
            call()


def test_usage_errors_are_named(pool: Pool) -> None:
    src = pool.direct_source
    with pytest.raises(UsageError, match="member"):
        PoolConsumer(src, "g", member=2, members=2)
    with pytest.raises(UsageError, match="group"):
        PoolConsumer(src, "")
    with pytest.raises(UsageError, match="whole_groups"):
        PoolConsumer(src, "g", whole_groups=True, ready=None)
    with PoolConsumer(src, "g") as consumer:
        with pytest.raises(UsageError, match="max_steps"):
            consumer.poll(max_steps=0)
        with pytest.raises(UsageError, match="max_groups"):
            consumer.poll(max_groups=1)
        with pytest.raises(UsageError, match="seek position"):
            consumer.seek("yesterday")  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="policy version"):
            consumer.report_policy_version("7")  # type: ignore[arg-type]


def test_unreachable_api_is_pool_unavailable() -> None:
    with PoolConsumer(f"http://127.0.0.1:{free_port()}", "nowhere", request_timeout=2) as consumer, \
            pytest.raises(PoolUnavailable, match="did not answer"):
        consumer.poll()


def test_unreachable_clickhouse_server_is_pool_unavailable() -> None:
    with pytest.raises(PoolUnavailable, match=r"cannot open the pool at http://u:\*\*\*@127.0.0.1"):
        PoolConsumer(f"clickhouse://u:secret@127.0.0.1:{free_port()}/db", "nowhere")


def test_api_refusal_is_a_pool_request_error(api_url: str) -> None:
    with PoolConsumer(f"{api_url}/not-the-api", "lost") as consumer, pytest.raises(PoolRequestError) as info:
        consumer.poll()
    assert info.value.status == 404


def test_unmigrated_pool_is_a_pool_request_error(pool_dsn: str) -> None:
    database = f"bare_{uuid.uuid4().hex[:8]}"
    with PoolStore(pool_dsn, database=database) as store:
        try:
            with PoolConsumer(sdk_direct_source(database_dsn(pool_dsn, database)), "bare") as consumer, \
                    pytest.raises(PoolRequestError) as info:
                consumer.poll()
        finally:
            store.command(f"DROP DATABASE {database}")
    assert "consumer_positions" in str(info.value)
