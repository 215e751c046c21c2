"""Offsets over the real pool, on both transports: commit, redelivery, crash-resume, groups, members,
late-ready steps and seeks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clawr1.consumer_sdk import PoolConsumer
from tests.support.pool import Pool, step
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]


def ids(n: int, prefix: str = "s") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n)]


def drain(consumer: PoolConsumer) -> list[str]:
    """Everything the consumer gets now, without committing."""
    out: list[str] = []
    while batch := consumer.poll(max_steps=50):
        out.extend(batch.step_ids)
    return out


def test_commit_and_redelivery(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(6)))
    with PoolConsumer(source, "trainer") as first:
        a = first.poll(max_steps=3)
        assert list(a.step_ids) == ids(6)[:3]
        b = first.poll(max_steps=3)  # in flight steps are not handed out twice
        assert list(b.step_ids) == ids(6)[3:]
        assert not first.poll(max_steps=3)
        assert first.commit(a) == 3
        assert first.uncommitted == 3
    # Closed without committing b: the next consumer of the group gets b again, never a.
    with PoolConsumer(source, "trainer") as second:
        assert drain(second) == ids(6)[3:]
        assert second.commit() == 3
    with PoolConsumer(source, "trainer") as third:
        assert drain(third) == []


def killed(trainer: str, group: str, api_url: str, env: dict[str, str] | None = None,
           before_kill: Callable[[], bool] | None = None) -> Any:
    """Run ``trainer`` (code using the consumer ``c`` of ``group``, ending with a JSON line printed) in a
    process against the API; once it printed (and ``before_kill()`` came true), SIGKILL it. Returns what
    it printed."""
    child = ("import json, sys, time\nfrom clawr1.consumer_sdk import PoolConsumer\n"
             f"c = PoolConsumer(sys.argv[1], {group!r})\n{trainer}time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", child, api_url], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "child printed nothing"
        if before_kill is not None:
            wait_until(before_kill, 30, message="the child's state")
        return json.loads(line)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_crash_before_commit_redelivers_to_the_next_process(pool: Pool, api_url: str) -> None:
    """A consumer process killed (SIGKILL) after polling: uncommitted steps come again, committed never."""
    pool.write(*(step(s) for s in ids(6)))
    trainer = (
        "done = c.poll(max_steps=2); c.commit(sync=True)\n"
        "held = c.poll(max_steps=2)\n"
        "print(json.dumps([list(done.step_ids), list(held.step_ids)]), flush=True)\n"
    )
    committed, held = killed(trainer, "crashy", api_url)
    assert committed == ids(6)[:2] and held == ids(6)[2:4]
    with PoolConsumer(pool.direct_source, "crashy") as resumed:
        again = drain(resumed)
    assert again == ids(6)[2:]
    assert not set(again) & set(committed)


def test_a_trainer_killed_between_batches_gets_again_only_what_was_not_written(
    pool: Pool, api_url: str
) -> None:
    """Commits written in the background every 2 commits; SIGKILL between batches: the group's next
    consumer gets the batches whose commits were not written yet and the batch in hand, nothing written
    before, and nothing is skipped."""
    pool.write(*(step(s) for s in ids(12)))
    trainer = (
        "done = []\n"
        "for _ in range(5):\n"
        "    batch = c.poll(max_steps=2); c.commit(); done.extend(batch.step_ids)\n"
        "held = c.poll(max_steps=2)\n"
        "print(json.dumps([done, list(held.step_ids)]), flush=True)\n"
    )
    env = {**os.environ, "CLAWR1_SDK_COMMIT_BATCHES": "2", "CLAWR1_SDK_COMMIT_SECONDS": "600"}
    written = "SELECT count() AS n FROM consumer_commits WHERE group_name = 'killed'"
    # Killed once the writes after the 2nd and 4th commits, in the background, landed.
    committed, held = killed(trainer, "killed", api_url, env, lambda: pool.store.query(written)[0]["n"] >= 8)
    assert committed == ids(12)[:10] and held == ids(12)[10:]
    landed = int(pool.store.query(written)[0]["n"])
    assert landed in (8, 10)  # the 5th commit may have joined the 4th's write
    with PoolConsumer(pool.direct_source, "killed") as resumed:
        again = drain(resumed)
    assert again == ids(12)[landed:]  # what was committed and not written, and the batch in hand


def test_groups_are_independent(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(4)))
    with PoolConsumer(source, "g-one") as one:
        assert drain(one) == ids(4)
        one.commit()
    with PoolConsumer(source, "g-two") as two:
        assert drain(two) == ids(4)
    with PoolConsumer(source, "g-one") as one_again:
        assert drain(one_again) == []


def test_members_split_a_group_without_overlap(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(40)))
    seen: list[list[str]] = []
    members = [PoolConsumer(source, "split", member=i, members=3) for i in range(3)]
    try:
        for consumer in members:
            seen.append(drain(consumer))
            consumer.commit()
    finally:
        for consumer in members:
            consumer.close()
    flat = [s for part in seen for s in part]
    assert sorted(flat) == ids(40)  # union is everything, and no step twice
    assert all(seen), "with 40 steps every member should get a share"
    with PoolConsumer(source, "split", member=1, members=3) as again:
        assert drain(again) == []


def test_late_ready_step_is_delivered_when_it_becomes_ready(pool: Pool, source: str) -> None:
    pool.write(step("late", ready=False, reward_status="pending"), step("early"))
    with PoolConsumer(source, "late-group") as consumer:
        assert list(consumer.poll().step_ids) == ["early"]
        consumer.commit()
        assert not consumer.poll()
        pool.write(step("late", version=2, ready=True, reward=1.0, reward_status="final"))
        batch = consumer.poll()
        assert list(batch.step_ids) == ["late"]
        assert batch[0].version == 2 and batch[0].reward == 1.0
        consumer.commit()
        # A committed step is never delivered again, even when a newer version lands.
        pool.write(step("early", version=2, reward=0.5))
        assert not consumer.poll()


def test_redelivery_carries_the_newest_version(pool: Pool, source: str) -> None:
    pool.write(step("x", reward=0.1))
    with PoolConsumer(source, "versions") as first:
        assert first.poll()[0].reward == 0.1
    pool.write(step("x", version=2, reward=0.9))
    with PoolConsumer(source, "versions") as second:
        again = second.poll()
        assert again[0].version == 2 and again[0].reward == 0.9


def test_seek_earliest_latest_and_time(pool: Pool, source: str) -> None:
    old_ms = 1_700_000_000_000
    pool.write(*(step(s) for s in ids(3, "old")), ingested_at_ms=old_ms)
    pool.write(*(step(s) for s in ids(2, "mid")), ingested_at_ms=old_ms + 60_000)
    with PoolConsumer(source, "seeker") as consumer, PoolConsumer(source, "seeker") as peer:
        assert len(drain(consumer)) == 5
        consumer.commit()
        consumer.seek("earliest")  # a new epoch: commits are forgotten, everything comes again
        assert len(drain(consumer)) == 5
        consumer.seek("latest")
        assert drain(consumer) == []
        assert drain(peer) == []  # a seek moves the whole group
        pool.write(step("new"))
        assert drain(consumer) == ["new"]
        consumer.seek(datetime.fromtimestamp((old_ms + 30_000) / 1000, tz=UTC))
        assert drain(consumer) == [*ids(2, "mid"), "new"]
        consumer.seek(old_ms)
        assert len(drain(consumer)) == 6


def test_eligibility_is_judged_on_the_newest_version(pool: Pool, source: str) -> None:
    pool.write(step("retracted", reward=1.0, reward_status="final"))
    pool.write(step("retracted", version=2, ready=False, reward_status="pending"))
    with PoolConsumer(source, "newest") as consumer:
        assert not consumer.poll()
    with PoolConsumer(source, "newest-final", reward_status="final", ready=None) as consumer:
        assert not consumer.poll()


def test_large_commit_is_complete(pool: Pool, source: str) -> None:
    """More steps than one API insert body carries (5,000 rows) are all committed."""
    pool.write(*(step(f"big{i:05d}") for i in range(5_200)))
    with PoolConsumer(source, "big") as consumer:
        assert len(consumer.poll(max_steps=6_000)) == 5_200
        assert consumer.commit() == 5_200
    with PoolConsumer(source, "big") as again:
        assert not again.poll(max_steps=6_000)
