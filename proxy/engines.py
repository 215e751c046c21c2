"""Which engine serves a call when ``CLAWR1_UPSTREAM`` lists several: pure bookkeeping, no I/O.

- Affinity: a rollout (its trajectory hint, else its conversation root, as the linker finds it) keeps the
  engine it was first given while that engine serves, so the engine's prefix cache holds the growing
  conversation. New rollouts are placed by consistent hashing: an engine that comes or goes moves only
  the rollouts it held.
- Bounded load: a rollout is placed, and a call sent, only where the engine stays within ``LOAD_FACTOR``
  times the mean (of rollouts held, of calls in flight); otherwise the next engine on the ring takes it.
  An engine may always have one call in flight per rollout it holds; past that and the bound (a rollout
  with many calls at once, e.g. GRPO siblings sharing their prompt), the call spills to the next engine
  and the rollout keeps its engine.
- States: ``serving``; ``draining`` (an operator's drain: no new calls, in-flight ones finish) until
  ``resume`` puts it back at a policy version; ``out`` (it refused a connection) until a probe finds it
  up again. A call is never sent to an engine that is not serving.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["serving", "draining", "out"]
LOAD_FACTOR = 1.25
# Ring points per engine: enough that three engines split the ring within a few percent.
POINTS = 160
# Rollouts remembered (least recently used forgotten first) and how long an idle one keeps its engine.
MAX_ROLLOUTS = 100_000
ROLLOUT_IDLE_S = 600.0


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(eq=False)
class Engine:
    """One engine; compared by identity (its table holds each once)."""

    url: str
    state: State = "serving"
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    policy_version: int | None = None
    rollouts: int = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": self.url, "state": self.state, "in_flight": self.in_flight, "served": self.served,
                "failures": self.failures, "policy_version": self.policy_version, "rollouts": self.rollouts}


class EngineTable:
    """The engines of one proxy process, the rollouts placed on them, their loads."""

    def __init__(self, urls: list[str], load_factor: float = LOAD_FACTOR, max_rollouts: int = MAX_ROLLOUTS,
                 idle_s: float = ROLLOUT_IDLE_S) -> None:
        if not urls:
            raise ValueError("an engine table needs at least one engine")
        self.engines = {url: Engine(url) for url in urls}
        self._ring = sorted((_point(f"{url}#{i}"), url) for url in urls for i in range(POINTS))
        self._points = [point for point, _ in self._ring]
        self._factor = load_factor
        self._max_rollouts = max_rollouts
        self._idle_s = idle_s
        # rollout key -> (engine url, last use), least recently used first.
        self._rollouts: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, url: str) -> Engine | None:
        return self.engines.get(url)

    def serving(self) -> list[Engine]:
        return [engine for engine in self.engines.values() if engine.state == "serving"]

    def _bound(self, total: int, serving: int) -> int:
        """The most any serving engine may hold once one more is added: ``LOAD_FACTOR`` times the mean,
        rounded down (rounded up, 8 rollouts over 3 engines could split 4/3/1), but never below the
        mean rounded up (so the bound always leaves room)."""
        mean = (total + 1) / serving
        return max(math.ceil(mean), math.floor(self._factor * mean))

    def _walk(self, key: str) -> list[Engine]:
        """Every engine once, in ring order from the key's point."""
        start = bisect_right(self._points, _point(key))
        seen: dict[str, Engine] = {}
        for index in range(len(self._ring)):
            url = self._ring[(start + index) % len(self._ring)][1]
            if url not in seen:
                seen[url] = self.engines[url]
                if len(seen) == len(self.engines):
                    break
        return list(seen.values())

    def _expire(self, now: float) -> None:
        while self._rollouts:
            key, (url, used) = next(iter(self._rollouts.items()))
            if len(self._rollouts) <= self._max_rollouts and now - used < self._idle_s:
                return
            del self._rollouts[key]
            self.engines[url].rollouts -= 1

    def _place(self, key: str, url: str, now: float) -> None:
        previous = self._rollouts.pop(key, None)
        if previous is not None:
            self.engines[previous[0]].rollouts -= 1
        self._rollouts[key] = (url, now)
        self.engines[url].rollouts += 1
        self._expire(now)

    def pick(self, key: str, now: float, avoid: frozenset[str] = frozenset()) -> Engine | None:
        """The engine for the next call of rollout ``key`` (None when none serves); not yet counted
        in flight (``start`` does). ``avoid``: engines this call already failed on."""
        self._expire(now)
        serving = [e for e in self.serving() if e.url not in avoid]
        if not serving:
            return None
        flight_bound = self._bound(sum(e.in_flight for e in serving), len(serving))
        placed = self._rollouts.get(key)
        if placed is not None:
            engine = self.engines[placed[0]]
            if engine in serving:
                self._rollouts.move_to_end(key)
                self._rollouts[key] = (engine.url, now)
                # One call in flight per rollout held is never too many (the rollouts are spread already):
                # only a rollout with many calls at once (siblings sharing a prompt) spills past the bound.
                if engine.in_flight < max(flight_bound, engine.rollouts):
                    return engine
                # Full for now: this call spills, the rollout keeps its engine.
                return self._first_within(key, serving, flight_bound, None)
        rollout_bound = self._bound(sum(e.rollouts for e in serving), len(serving))
        engine = self._first_within(key, serving, flight_bound, rollout_bound)
        self._place(key, engine.url, now)
        return engine

    def _first_within(self, key: str, serving: list[Engine], flight_bound: int,
                      rollout_bound: int | None) -> Engine:
        candidates = [e for e in self._walk(key) if e in serving]
        for engine in candidates:
            if engine.in_flight < flight_bound and (rollout_bound is None or engine.rollouts < rollout_bound):
                return engine
        return min(candidates, key=lambda e: (e.in_flight, e.rollouts))

    def start(self, engine: Engine) -> None:
        engine.in_flight += 1

    def finish(self, engine: Engine, answered: bool) -> None:
        """A call on ``engine`` ended; ``answered``: the engine sent a response."""
        engine.in_flight = max(0, engine.in_flight - 1)
        if answered:
            engine.served += 1

    def mark_out(self, url: str) -> bool:
        """The engine refused or dropped a call before answering: no calls until a probe finds it up.
        True when this took it out (a draining engine stays draining: the operator owns it)."""
        engine = self.engines.get(url)
        if engine is None:
            return False
        engine.failures += 1
        if engine.state != "serving":
            return False
        engine.state = "out"
        return True

    def probed(self, url: str, up: bool) -> bool:
        """A probe's verdict on an out engine; True when this put it back."""
        engine = self.engines.get(url)
        if engine is None or engine.state != "out" or not up:
            return False
        engine.state = "serving"
        return True

    def drain(self, url: str) -> Engine:
        """No new calls for ``url`` (KeyError when it is not one of the engines)."""
        engine = self.engines[url]
        engine.state = "draining"
        return engine

    def resume(self, url: str, policy_version: int | None) -> Engine:
        """``url`` serves again, now with the weights of ``policy_version`` (None keeps the one known)."""
        engine = self.engines[url]
        engine.state = "serving"
        if policy_version is not None:
            engine.policy_version = policy_version
        return engine

    def describe(self) -> list[dict[str, Any]]:
        return [engine.describe() for engine in self.engines.values()]

    def control(self) -> dict[str, dict[str, Any]]:
        """What an operator set (drained or not, policy version), for the proxy's other processes."""
        return {url: {"draining": e.state == "draining", "policy_version": e.policy_version}
                for url, e in self.engines.items()}

    def apply(self, control: dict[str, dict[str, Any]]) -> None:
        """Take what an operator set through another process (``control``); engines this process found
        out stay out until its own probe finds them up."""
        for url, wanted in control.items():
            engine = self.engines.get(url)
            if engine is None:
                continue
            if wanted.get("draining"):
                engine.state = "draining"
            elif engine.state == "draining":
                engine.state = "serving"
            version = wanted.get("policy_version")
            if isinstance(version, int):
                engine.policy_version = version
