"""A stack that heals: `clawr1 up` under sustained mixed load (openai SDK through the proxy, streamed
and plain; gateway batches; feedback) while the worker, the proxy, the API and the broker are each
SIGKILLed once. It must keep running, /healthz must name what is missing and be 200 again within
90 s, every acknowledged step and every answered call must be in the pool exactly once, and Ctrl-C
must still stop it cleanly. The harness is tests/support/chaos.py; the full bench (bench/chaos.py) adds
more faults."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import partial

import pytest

from clawr1.core.registry import SINK_GROUP, STREAMS_APP_ID
from clawr1.core.topics import RAW_STEPS, STEPS
from clawr1.gateway.client import GatewayClient
from tests.support.chaos import (
    HEAL_TIMEOUT_S,
    QUICK_FAULTS,
    Stack,
    freeze_worker,
    kill_role,
    run_faults,
    running,
)
from tests.support.kafka import read_topic, wait_committed
from tests.support.waiting import wait_until

STALL_S = 10.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two workers (one is frozen in a test) and a short stall window, so a stuck worker shows soon."""
    work = tmp_path_factory.mktemp("chaos")
    with running(Stack(work / "data", work / "stack.log", env={"CLAWR1_STALL_S": str(STALL_S)},
                       workers=2)) as stack:
        yield stack


def _raw_copies(bootstrap: str, trajectory: str) -> int:
    """How many records of ``trajectory`` the raw steps topic holds (lone or in envelopes), read from
    the start; a fault may have put garbage there."""
    return sum(read.record["trajectory_id"] == trajectory
               for read in read_topic(bootstrap, RAW_STEPS.name, 60, skip_undecodable=True)
               if read.schema == RAW_STEPS.schema)


def test_a_batch_retried_after_the_api_died_lands_once(stack: Stack) -> None:
    """The API's idempotency memory dies with it: the retry with the same key is produced again,
    and deterministic step ids + the pool's ReplacingMergeTree keep one copy in `steps`."""
    trajectory = f"replayed-{uuid.uuid4().hex[:8]}"
    batch = [{"trajectory_id": trajectory, "step_index": n, "prompt_token_ids": [1, n],
              "response_token_ids": [2], "terminal": n == 2} for n in range(3)]
    key = uuid.uuid4().hex
    with GatewayClient(stack.api, retry_for_s=120) as client:
        first = client.post("/v1/steps", batch, idempotency_key=key)
        kill_role(stack, "api", signal.SIGKILL)
        again = client.post("/v1/steps", batch, idempotency_key=key)
    assert again == first
    assert _raw_copies(stack.bootstrap, trajectory) == 6, "the retry must really have been produced twice"
    query = f"SELECT step_id FROM steps WHERE trajectory_id = '{trajectory}'"
    wait_until(lambda: len(stack.sql(query)) >= 3, 120, interval=1,
               message=f"the steps of {trajectory} in the pool")
    # Every copy produced has gone through once the worker committed the raw topic to its end and then
    # the sink the steps it wrote (topics the worker writes in transactions).
    wait_committed(stack.bootstrap, STREAMS_APP_ID.default, [RAW_STEPS.name], 120)
    wait_committed(stack.bootstrap, SINK_GROUP.default, [STEPS.name], 120, transactional=True)
    rows = stack.sql(query)
    assert sorted(str(r["step_id"]) for r in rows) == sorted(first)


def test_sigkill_of_each_role_under_load_loses_and_doubles_nothing(stack: Stack) -> None:
    # The worker is killed first, within seconds of the first traffic, as the stream layer's wedge was.
    result = run_faults(stack, QUICK_FAULTS, settle_s=3.0, drain_s=120.0, whitebox_clients=2)
    assert result["stack_stayed_up"], result
    faults = {f["name"]: f for f in result["faults"]}  # type: ignore[union-attr]
    assert list(faults) == ["SIGKILL worker", "SIGKILL proxy", "SIGKILL api", "SIGKILL broker"]
    assert all(f["healthy_after_s"] < HEAL_TIMEOUT_S for f in faults.values())
    # /healthz said what was missing meanwhile (nothing answers while the API itself restarts).
    assert "worker" in faults["SIGKILL worker"]["health_named"]
    assert "proxy" in faults["SIGKILL proxy"]["health_named"]
    assert "no answer" in faults["SIGKILL api"]["health_named"]
    assert "kafka" in faults["SIGKILL broker"]["health_named"]
    pool, load = result["pool"], result["load"]
    assert load["proxy_calls_answered"] > 0 and load["streamed_answered"] > 0 and load["steps_acked"] > 0
    assert pool["steps_in_pool"] == pool["steps_acked"] == load["steps_acked"], pool
    assert pool["steps_lost"] == 0 and pool["steps_duplicated"] == 0, pool
    assert pool["calls_captured"] == pool["calls_answered"] and pool["calls_lost"] == 0, pool
    assert pool["calls_duplicated"] == 0, pool
    assert pool["rewards_joined"] == pool["rewards_sent"] > 0, pool
    assert result["drained_s"] <= 120, result


def test_the_worker_is_a_static_group_member(stack: Stack) -> None:
    """clawr1 up names its worker's slot, so a restarted worker takes its partitions back at once instead
    of waiting out the dead member's session, and its transactional id fences the dead one's transaction."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    group = admin.describe_consumer_groups(["clawr1-streams"])["clawr1-streams"].result(30)
    assert sorted((m.group_instance_id, m.client_id) for m in group.members) == [
        ("up-0", "clawr1-streams-up-0"), ("up-1", "clawr1-streams-up-1")]


def test_a_frozen_worker_is_named_unhealthy_and_restarted_while_the_other_takes_its_partitions(
        stack: Stack) -> None:
    """SIGSTOP of one worker under load: it drops out of its group after its session timeout, the other
    worker takes its partitions (steps keep reaching the pool), /healthz names it with the reason once
    it has been out for the stall window, and the supervisor restarts it; nothing lost or doubled."""
    freeze = partial(freeze_worker, seconds=60.0)
    result = run_faults(stack, [("freeze", freeze)], settle_s=3.0, drain_s=120.0)
    figures = result["faults"][0]["figures"]  # type: ignore[index]
    session_s = 10.0  # CLAWR1_STREAMS_SESSION_TIMEOUT_S's default
    assert figures["named_unhealthy_after_s"] is not None, figures
    assert figures["named_unhealthy_after_s"] <= session_s + STALL_S + 10, figures
    assert "consumer group clawr1-streams" in figures["reason"], figures
    assert figures["restarted_after_s"] is not None, figures
    assert figures["steps_into_pool_while_frozen"] > 0, figures
    pool = result["pool"]
    assert pool["steps_lost"] == pool["steps_duplicated"] == pool["calls_lost"] == 0, pool  # type: ignore[index]
    assert pool["calls_duplicated"] == 0, pool  # type: ignore[index]


def test_status_names_the_restarts(stack: Stack) -> None:
    """Once every role runs again (status exits 1 while one is restarting: the frozen worker's test may
    leave one on its way back), status names each role's restarts and how it last went down."""
    outs: list[subprocess.CompletedProcess[str]] = []

    def running_again() -> bool:
        outs.append(subprocess.run([sys.executable, "-m", "clawr1.cli", "status", "--api", stack.api,
                                    "--data-dir", str(stack.data_dir)], capture_output=True, text=True,
                                   timeout=60))
        return outs[-1].returncode == 0

    wait_until(running_again, 90, interval=2,
               message=lambda: f"clawr1 status never exited 0:\n{outs[-1].stdout}{outs[-1].stderr}")
    assert "role api: running" in outs[-1].stdout and "last killed by SIGKILL" in outs[-1].stdout
