"""Who may run SQL now, and until when: the pools of sessions, each key's share, and every query's place.

Fair shares (docs/security.md): trainers (``consume`` keys) and analysts (``read`` keys) draw on two pools
of sessions, and one key holds at most its share of its pool, so no analyst's queries starve a trainer and
no key takes all of its pool. Every query gets a deadline (``clawr1.pool.watchdog``): at its limit it is
killed (``KILL QUERY``, taking effect at the engine's next block), its caller is answered, and its key's
share is free again at once. The engine cannot stop inside one function call (``editDistance`` over two
60k strings runs to its end), so a killed query is counted apart until the engine has stopped
(``Ledger``): what the engine runs stays bounded, and no key piles such queries up.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clawr1.pool.watchdog import WATCHDOG, WATCHDOG_GRACE_S

TRAINERS = "trainers"
ANALYSTS = "analysts"
LIVE = "live"
KILLED = "killed"


class SqlError(ValueError):
    """The query failed or is malformed; the message says why (HTTP 400)."""


class WriteRefused(SqlError):
    """The query would write, change settings, or reach outside the pool (HTTP 403)."""


class SqlBusy(SqlError):
    """The caller's pool, or the caller's share of it, is in use (HTTP 429)."""


class Shares(Protocol):
    """How many sessions a pool has, and how many of them one key may hold (``SqlLimits``)."""

    def slots(self, pool: str) -> int: ...
    def key_slots(self, pool: str) -> int: ...


@dataclass(frozen=True)
class Caller:
    """Whose query: the API key's name and the pool its sessions come from. ``limited``: the key holds at
    most its share of the pool (not for the one caller of a key-less stack, or the CLI)."""

    name: str = "anonymous"
    pool: str = ANALYSTS
    limited: bool = False


def overran(limit_s: float) -> str:
    return f"the query ran past the time limit of {limit_s:g} s (max_execution_time) and was cancelled"


class Ledger:
    """The places taken in each pool, and by each key; ``admit`` hands them out or says what is full.

    A query is live from ``admit`` until it is killed or ends. A killed query the engine still runs (it is
    inside one function call) no longer takes its key's share or a live place: it counts apart, at most a
    key's share of them per key and a pool's worth in all, so its key may query again at once, no key fills
    the pool with them, and the engine never runs more than twice the pool's queries.
    """

    def __init__(self, shares: Shares, kill: Callable[[str, str], bool]) -> None:
        """``kill(query_id, tag)`` stops a running query (``AnalystSql.kill``): True when it has stopped
        (its process is gone), False when the engine will stop it later, without waiting for that."""
        self.shares = shares
        self.kill = kill
        self._pool: Counter[tuple[str, str]] = Counter()  # (LIVE or KILLED, pool)
        self._key: Counter[tuple[str, str, str]] = Counter()  # (LIVE or KILLED, pool, key name)
        self._lock = threading.Lock()

    def admit(self, caller: Caller) -> Admission:
        pool, name = caller.pool, caller.name
        slots, share = self.shares.slots(pool), self.shares.key_slots(pool)
        with self._lock:
            live, killed = self._key[(LIVE, pool, name)], self._key[(KILLED, pool, name)]
            if caller.limited and live >= share:
                raise SqlBusy(f"the key {name!r} already runs {live} queries, its share of the {slots} "
                              f"sessions of the {pool}; retry shortly")
            if caller.limited and killed >= share:
                raise SqlBusy(f"{killed} queries of the key {name!r} ran past their limit and the engine is "
                              f"still in a call it cannot interrupt, its share of the {pool}; retry once "
                              "they end")
            if self._pool[(LIVE, pool)] >= slots:
                raise SqlBusy(f"the {slots} SQL sessions of the {pool} are in use; retry shortly")
            if self._pool[(KILLED, pool)] >= slots:
                raise SqlBusy(f"{slots} queries of the {pool} ran past their limit and the engine is still "
                              "in calls it cannot interrupt; retry once they end")
            self._pool[(LIVE, pool)] += 1
            self._key[(LIVE, pool, name)] += 1
        return Admission(self, caller)

    def running(self, pool: str, key: str | None = None, state: str = LIVE) -> int:
        """``state`` queries of ``pool`` (of ``key``'s only, when given)."""
        with self._lock:
            return self._pool[(state, pool)] if key is None else self._key[(state, pool, key)]

    def killed(self, caller: Caller) -> None:
        """One of ``caller``'s live queries was killed (the engine may still run it)."""
        with self._lock:
            self._count(LIVE, caller, -1)
            self._count(KILLED, caller, 1)

    def ended(self, caller: Caller, state: str) -> None:
        with self._lock:
            self._count(state, caller, -1)

    def _count(self, state: str, caller: Caller, by: int) -> None:
        self._pool[(state, caller.pool)] += by
        self._key[(state, caller.pool, caller.name)] += by


class Admission:
    """One query's place, from ``Ledger.admit`` until the engine has stopped with it.

    ``cancel`` kills the query (its caller left, or it ran past the time limit): it stops being live, so its
    key's share and its live place are free at once, and counts as killed until the engine notices (at its
    next block, or after the function call it is in); the query then fails with ``reason`` and ``release``
    ends its count.
    """

    def __init__(self, ledger: Ledger, caller: Caller) -> None:
        self.caller = caller
        self.reason: str | None = None
        self._ledger = ledger
        self._tag: str | None = None
        self._query_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._limit_s = 0.0
        self._state = LIVE
        self._released = False

    def started(self, tag: str, limit_s: float) -> dict[str, str]:
        """The query runs on the session tagged ``tag``: the watchdog starts; the settings give the
        query its id (a server's; chDB names its queries itself and is found by the session's tag)."""
        with self._lock:
            self._tag = tag
            pending = self.reason
            self._limit_s = limit_s
        WATCHDOG.watch(self, limit_s + WATCHDOG_GRACE_S)
        if pending is not None:
            self._kill()
        return {"query_id": self._query_id}

    def cancel(self, reason: str) -> None:
        """Kill the query (idempotent; before it started, it is killed as soon as it starts)."""
        with self._lock:
            if self.reason is not None or self._released:
                return
            self.reason = reason
            running = self._tag is not None
            self._state = KILLED
            self._ledger.killed(self.caller)
        if running:
            self._kill()

    def overdue(self) -> None:
        """The watchdog's call at the deadline: a query still running then is cancelled."""
        self.cancel(overran(self._limit_s))

    def release(self) -> None:
        """The engine has stopped with the query (idempotent)."""
        with self._lock:
            if self._released:
                return
            self._released = True
            self._ledger.ended(self.caller, self._state)

    def _kill(self) -> None:
        assert self._tag is not None
        if self._ledger.kill(self._query_id, self._tag):
            self.release()  # nothing of it runs on: its place is free before its caller hears of it
