"""Engine choice: spread, rollout affinity, bounded load, failover and drain (clawr1.proxy.engines)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from clawr1.proxy.engines import LOAD_FACTOR, EngineTable

URLS = ["http://e1:8000", "http://e2:8000", "http://e3:8000"]


def _rollouts(table: EngineTable, rollouts: int, turns: int, concurrent: bool) -> dict[str, list[str]]:
    """Each rollout's engines, turn by turn; ``concurrent``: every rollout's call is in flight at once."""
    served: dict[str, list[str]] = {f"rollout-{r}": [] for r in range(rollouts)}
    now = 0.0
    for _ in range(turns):
        picked = []
        for key in served:
            engine = table.pick(key, now)
            assert engine is not None
            table.start(engine)
            served[key].append(engine.url)
            picked.append(engine)
            if not concurrent:
                table.finish(engine, answered=True)
            now += 1.0
        if concurrent:
            for engine in picked:
                table.finish(engine, answered=True)
    return served


@pytest.mark.parametrize("concurrent", [True, False])
def test_eight_rollouts_of_four_turns_spread_and_keep_their_engine(concurrent: bool) -> None:
    table = EngineTable(URLS)
    served = _rollouts(table, 8, 4, concurrent)
    calls = Counter(url for urls in served.values() for url in urls)
    assert all(calls[url] >= 0.15 * 32 for url in URLS), calls
    kept = sum(len(set(urls)) == 1 for urls in served.values())
    assert kept / len(served) >= 0.95, served
    assert {e.served for e in table.engines.values()} <= {8, 12, 16} and sum(calls.values()) == 32


def test_any_eight_rollouts_split_three_three_two() -> None:
    """Whatever the rollouts hash to: the bound (1.25x the mean, rounded down) leaves no 4/3/1 split."""
    rng = random.Random(11)
    for _ in range(200):
        table = EngineTable(URLS)
        for rollout in range(8):
            table.pick(f"{rng.random()}-{rollout}", 0.0)
        assert sorted(e.rollouts for e in table.engines.values()) == [2, 3, 3]


def test_no_engine_takes_more_than_the_bound_of_calls_in_flight() -> None:
    table = EngineTable(URLS)
    rng = random.Random(7)
    in_flight = []
    for call in range(600):
        engine = table.pick(f"rollout-{rng.randrange(5)}", float(call))  # few hot rollouts
        assert engine is not None
        total = sum(e.in_flight for e in table.engines.values())
        assert engine.in_flight + 1 <= -(-LOAD_FACTOR * (total + 1) // 3)
        table.start(engine)
        in_flight.append(engine)
        if len(in_flight) > 30:
            table.finish(in_flight.pop(rng.randrange(len(in_flight))), answered=True)
    loads = [e.in_flight for e in table.engines.values()]
    assert max(loads) <= LOAD_FACTOR * sum(loads) / 3 + 1, loads


def test_a_failed_engine_is_avoided_and_its_rollouts_move_while_others_stay() -> None:
    table = EngineTable(URLS)
    first = {f"r{i}": table.pick(f"r{i}", 0.0) for i in range(30)}
    down = URLS[0]
    assert table.mark_out(down) and not table.mark_out(down)  # taken out once
    again = {key: table.pick(key, 1.0) for key in first}
    assert all(e is not None and e.url != down for e in again.values())
    stayed = [key for key, e in first.items() if e is not None and e.url != down]
    assert stayed and all(again[key] is first[key] for key in stayed)  # the others keep their engines
    retry = table.pick("r0", 2.0, avoid=frozenset({URLS[1]}))
    assert retry is not None and retry.url == URLS[2]
    assert table.probed(down, up=True) and table.get(down).state == "serving"  # type: ignore[union-attr]


def test_no_engine_serving_gives_none() -> None:
    table = EngineTable(URLS[:1])
    table.mark_out(URLS[0])
    assert table.pick("r", 0.0) is None
    assert not table.probed(URLS[0], up=False) and table.pick("r", 1.0) is None


def test_drain_takes_no_new_rollouts_and_resume_sets_the_version() -> None:
    table = EngineTable(URLS)
    drained = table.drain(URLS[1])
    picked = {table.pick(f"r{i}", float(i)) for i in range(40)}
    assert drained not in picked and len(picked) == 2
    assert not table.mark_out(URLS[1]) and drained.state == "draining"  # the operator owns a drained engine
    table.resume(URLS[1], 7)
    assert drained.state == "serving" and drained.policy_version == 7
    assert drained in {table.pick(f"new-{i}", 100.0 + i) for i in range(40)}
    assert table.describe()[1]["policy_version"] == 7


def test_idle_rollouts_are_forgotten() -> None:
    table = EngineTable(URLS, idle_s=10.0, max_rollouts=5)
    for i in range(8):
        table.pick(f"r{i}", 0.0)
    assert sum(e.rollouts for e in table.engines.values()) == 5
    table.pick("late", 20.0)
    assert sum(e.rollouts for e in table.engines.values()) == 1
