"""Backpressure: a pipeline that falls behind slows its producers down, instead of letting its lag and
freshness grow without bound while the ingest edge keeps accepting.

How far behind is a time, summed over the pipeline's stages (the consumer groups a step passes
through: the stream worker on the raw topics and its own work topic, the pool's sink on the worker's
outputs): per stage, how long its group needs to reach what waits for it now. From two cheap numbers
per look (no record is read): the records behind (end of log minus the group's committed offset, summed)
and the rate the group committed at over the last ``window_s``, ``behind / rate``; capped by the time
since the group was last seen caught up, which bounds the age of anything waiting (a burst after an idle
spell is not "behind" because the rate was 0 a moment ago, and a worker that stopped is as far behind as
the time since it last had nothing to do). A partition behind by one offset only is caught up: that is
the commit marker a transactional producer (the worker) leaves after its last records.

``LagGate`` closes at ``close_ratio`` of the bound, not at the bound itself: what was accepted before it
closed still has its way to go, and a raw record becomes work-topic records, which wait again (offered
more than the worker could take, the lag went on to 1.6-1.9 times what it was when a gate closing at the
bound closed, sampled once a second: bench/RESULTS.md, "Overload"). The rest of the bound is that
margin, so the lag, and the freshness of what was accepted, stay under it while the pipeline's capacity
holds. It opens again at ``resume_ratio``, so it does not flap.

``LagClock`` (the estimate) and ``LagGate`` (the refusal) are pure; ``PipelineLag`` samples the
offsets on a daemon thread, at most every ``interval_s``, so a request only reads the latest verdict.
While every stage is caught up it looks less often (``look_interval``): each look is requests the broker
answers, most of an idle stack's share of it; an overload starting right after a look is seen within a
third of the lag at which the gate closes (4 s at most), before the lag gets there.
A stage whose group has committed nothing on its topics yet adds nothing (no worker or sink has consumed
them: a stall, which /healthz names, not an overload); with no stage known, nothing is held back.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer

from clawr1.core.metrics import PIPELINE_LAG_SECONDS
from clawr1.core.offsets import Offsets, Partition, group_offsets, group_reader

log = logging.getLogger(__name__)

CLOSE_RATIO = 0.4
RESUME_RATIO = 0.2
WINDOW_S = 10.0
_WARN_EVERY_S = 30.0
_CAUGHT_UP_INTERVAL_S = 4.0


@dataclass
class LagClock:
    """Seconds behind, from successive looks at a group's offsets on its input topics."""

    window_s: float = WINDOW_S
    _last: dict[Partition, int] = field(default_factory=dict)
    _consumed: int = 0  # records the group committed past, since the first look
    _history: deque[tuple[float, int]] = field(default_factory=deque)  # (when, _consumed then)
    _caught_up_at: float | None = None

    def observe(self, now: float, offsets: Mapping[Partition, Offsets]) -> float | None:
        """The lag in seconds now (``inf``: records wait and nothing moves); None while the group has
        never committed on any of these partitions (unknown)."""
        if all(at.unset for at in offsets.values()):
            return None
        self._consumed += sum(max(0, at.committed - self._last[p])
                              for p, at in offsets.items() if p in self._last)
        self._last = {p: at.committed for p, at in offsets.items()}
        self._history.append((now, self._consumed))
        while len(self._history) > 2 and now - self._history[1][0] >= self.window_s:
            self._history.popleft()
        behind = sum(at.lag for at in offsets.values() if at.lag > 1)  # 1: a trailing commit marker
        if behind == 0 or self._caught_up_at is None:
            self._caught_up_at = now
        if behind == 0:
            return 0.0
        since, consumed = self._history[0]
        rate = (self._consumed - consumed) / (now - since) if now > since else 0.0
        return min(now - self._caught_up_at, behind / rate if rate > 0 else math.inf)


@dataclass(frozen=True)
class Verdict:
    """What a request reads: whether to refuse it, the lag, and when to come back."""

    closed: bool = False
    lag_s: float = 0.0
    retry_after_s: int = 1

    def reason(self, bound_s: float) -> str:
        behind = "with nothing moving" if math.isinf(self.lag_s) else f"{self.lag_s:.0f}s behind"
        return (f"the pipeline is {behind} (the bound is {bound_s:g}s): retry after {self.retry_after_s}s; "
                "nothing of this request was taken")


@dataclass
class LagGate:
    """Closes above ``close_ratio`` of ``bound_s``, opens again at or below ``resume_ratio`` of it; a bound of
    0 never closes."""

    bound_s: float
    close_ratio: float = CLOSE_RATIO
    resume_ratio: float = RESUME_RATIO
    verdict: Verdict = field(default_factory=Verdict)

    def update(self, lag_s: float | None) -> Verdict:
        """Fold in a new lag (None: unknown, which holds nothing back)."""
        lag = 0.0 if lag_s is None else lag_s
        resume = self.bound_s * self.resume_ratio
        limit = resume if self.verdict.closed else self.bound_s * self.close_ratio
        closed = self.bound_s > 0 and lag > limit
        # Until the lag is back at the resume mark, at a second per second: from 1 s up to the bound.
        wait = math.ceil(min(max(lag - resume, 1.0), max(self.bound_s, 1.0)))
        self.verdict = Verdict(closed, lag, wait)
        return self.verdict


def look_interval(verdict: Verdict, interval_s: float, bound_s: float) -> float:
    """Seconds to the next look: ``interval_s`` while anything is behind; while every stage is caught up,
    up to a third of the closing mark (at most ``_CAUGHT_UP_INTERVAL_S``), never less than ``interval_s``."""
    if verdict.lag_s > 0:
        return interval_s
    return max(interval_s, min(_CAUGHT_UP_INTERVAL_S, bound_s * CLOSE_RATIO / 3))


def pipeline_lag(lags: Iterable[float | None]) -> float | None:
    """The stages' lags summed (a step waits at each in turn); None when no stage is known."""
    known = [lag for lag in lags if lag is not None]
    return sum(known) if known else None


class PipelineLag:
    """Samples the lag of each stage (``stages``: consumer group -> its input topics) every ``interval_s`` on
    a daemon thread; ``verdict()`` is the latest. A failed look keeps the last verdict (Kafka away is the
    publisher's 503 to tell)."""

    def __init__(self, bootstrap: str, stages: Mapping[str, Iterable[str]], bound_s: float,
                 interval_s: float = 1.0) -> None:
        self.bound_s = bound_s
        self._bootstrap = bootstrap
        self._stages = {group: list(topics) for group, topics in stages.items()}
        self._interval_s = interval_s
        self._clocks = {group: LagClock() for group in self._stages}
        self._gate = LagGate(bound_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clawr1-pipeline-lag", daemon=True)
        self._warned = -math.inf

    def start(self) -> PipelineLag:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def verdict(self) -> Verdict:
        return self._gate.verdict

    def _run(self) -> None:
        readers = {group: group_reader(self._bootstrap, group) for group in self._stages}
        try:
            while not self._stop.wait(look_interval(self._gate.verdict, self._interval_s, self.bound_s)):
                self._look(readers)
        finally:
            for reader in readers.values():
                reader.close()

    def _look(self, readers: Mapping[str, Consumer]) -> None:
        try:
            offsets = {group: group_offsets(readers[group], topics) for group, topics in self._stages.items()}
        except Exception as exc:  # noqa: BLE001 - Kafka away: the last verdict stands
            now = time.monotonic()
            if now - self._warned >= _WARN_EVERY_S:
                self._warned = now
                log.warning("cannot read the pipeline's lag (%s): %s", ", ".join(self._stages), exc)
            return
        now = time.monotonic()
        was = self._gate.verdict.closed
        lags = {group: self._clocks[group].observe(now, looked) for group, looked in offsets.items()}
        verdict = self._gate.update(pipeline_lag(lags.values()))
        PIPELINE_LAG_SECONDS.set(min(verdict.lag_s, 1e9))
        if verdict.closed != was:
            log.warning("the pipeline is %.1fs behind (%s): %s", verdict.lag_s,
                        ", ".join(f"{g} {lag:.1f}s" for g, lag in lags.items() if lag is not None),
                        "refusing new work (429)" if verdict.closed else "accepting again")
