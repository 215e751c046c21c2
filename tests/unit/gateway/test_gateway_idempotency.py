"""The idempotency store replays answers, refuses misuse and stays within its bounds."""

from __future__ import annotations

import pytest

from clawr1.gateway.idempotency import IdempotencyConflict, IdempotencyStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def store(clock: Clock | None = None, ttl: float = 60.0, keys: int = 100,
          size: int = 10_000) -> IdempotencyStore:
    return IdempotencyStore(ttl, keys, size, clock or Clock())


def test_first_claim_owns_the_key_and_a_replay_gets_the_answer() -> None:
    s = store()
    key = ("agent", "steps", "k1")
    assert s.claim(key, "fp") is None
    s.finish(key, b'{"ids":["a"]}')
    assert s.claim(key, "fp") == b'{"ids":["a"]}'
    assert s.claim(("other", "steps", "k1"), "fp") is None


def test_same_key_while_running_or_with_another_body_conflicts() -> None:
    s = store()
    key = ("a", "steps", "k")
    s.claim(key, "fp")
    with pytest.raises(IdempotencyConflict) as running:
        s.claim(key, "fp")
    assert running.value.reason == "in_flight"
    with pytest.raises(IdempotencyConflict) as other:
        s.claim(key, "other-fp")
    assert other.value.reason == "mismatch"
    s.finish(key, b"x")
    with pytest.raises(IdempotencyConflict, match="mismatch"):
        s.claim(key, "other-fp")


def test_abandoned_key_can_be_claimed_again() -> None:
    s = store()
    key = ("a", "steps", "k")
    s.claim(key, "fp")
    s.abandon(key)
    assert s.claim(key, "fp") is None
    assert len(s) == 0


def test_answers_expire_after_ttl() -> None:
    clock = Clock()
    s = store(clock, ttl=10)
    s.claim(("a", "s", "1"), "fp")
    s.finish(("a", "s", "1"), b"x")
    clock.now = 9.9
    assert s.claim(("a", "s", "1"), "fp") == b"x"
    clock.now = 10.0
    assert s.claim(("a", "s", "1"), "fp") is None
    assert s.stored_bytes == 0


@pytest.mark.parametrize(("keys", "size"), [(3, 10_000), (100, 30)])
def test_store_is_bounded_by_keys_and_bytes(keys: int, size: int) -> None:
    s = store(keys=keys, size=size)
    for i in range(10):
        key = ("a", "s", str(i))
        s.claim(key, "fp")
        s.finish(key, b"0123456789")
    assert len(s) == 3 and s.stored_bytes == 30
    assert s.claim(("a", "s", "6"), "fp") is None
    assert s.claim(("a", "s", "9"), "fp") == b"0123456789"


def test_answer_larger_than_the_store_is_not_kept() -> None:
    s = store(size=5)
    s.claim(("a", "s", "k"), "fp")
    s.finish(("a", "s", "k"), b"0123456789")
    assert len(s) == 0 and s.claim(("a", "s", "k"), "fp") is None
