"""Who may run SQL now, and until when: the pools of sessions, each key's share, and every query's place.

Fair shares (docs/security.md): trainers (``consume`` keys) and analysts (``read`` keys) draw on two pools
of sessions, and one key holds at most its share of its pool, so no analyst's queries starve a trainer and
no key takes all of its pool. Every query gets a deadline (``clawr1.pool.watchdog``): at its limit it is
killed (``KILL QUERY``, taking effect at the engine's next block), its caller is answered, and its key's
share is free again at once. The engine cannot stop inside one function call (``editDistance`` over two
60k strings runs to its end), so the query's place in its pool stays taken until the engine has stopped:
the pool counts what really runs, and no key can pile stopped-but-running queries past it.
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


class SqlError(ValueError):
    """The query failed or is malformed; the message says why (HTTP 400)."""


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
    """The places taken in each pool, and by each key; ``admit`` hands them out or says what is full."""

    def __init__(self, shares: Shares, kill: Callable[[str, str], None]) -> None:
        """``kill(query_id, tag)`` stops a running query without waiting (``AnalystSql.kill``)."""
        self.shares = shares
        self.kill = kill
        self._running: Counter[str] = Counter()
        self._by_key: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def admit(self, caller: Caller) -> Admission:
        pool, key = caller.pool, (caller.pool, caller.name)
        with self._lock:
            if caller.limited and self._by_key[key] >= self.shares.key_slots(pool):
                raise SqlBusy(f"the key {caller.name!r} already runs {self._by_key[key]} queries, "
                              f"its share of the {self.shares.slots(pool)} sessions of the {pool}; "
                              "retry shortly")
            if self._running[pool] >= self.shares.slots(pool):
                raise SqlBusy(f"the {self.shares.slots(pool)} SQL sessions of the {pool} are in use; "
                              "retry shortly")
            self._running[pool] += 1
            self._by_key[key] += 1
        return Admission(self, caller)

    def running(self, pool: str, key: str | None = None) -> int:
        """Places taken in ``pool`` (by ``key``'s queries only, when given)."""
        with self._lock:
            return self._running[pool] if key is None else self._by_key[(pool, key)]

    def free_key(self, caller: Caller) -> None:
        with self._lock:
            self._by_key[(caller.pool, caller.name)] -= 1

    def free_pool(self, caller: Caller) -> None:
        with self._lock:
            self._running[caller.pool] -= 1


class Admission:
    """One query's place, from ``Ledger.admit`` until the engine has stopped with it.

    ``cancel`` kills the query (its caller left, or it ran past the time limit) and gives its key's share
    back; the query then fails with ``reason`` once the engine notices (at its next block, or after the
    function call it is in), and only then frees its place in the pool (``release``).
    """

    def __init__(self, ledger: Ledger, caller: Caller) -> None:
        self.caller = caller
        self.reason: str | None = None
        self._ledger = ledger
        self._tag: str | None = None
        self._query_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._limit_s = 0.0
        self._key_held = True
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
        """Kill the query and free its key's share (idempotent; before it started, it is killed as soon as
        it starts)."""
        with self._lock:
            if self.reason is not None or self._released:
                return
            self.reason = reason
            running = self._tag is not None
        self._free_key()
        if running:
            self._kill()

    def overdue(self) -> None:
        """The watchdog's call at the deadline: a query still running then is cancelled."""
        self.cancel(overran(self._limit_s))

    def release(self) -> None:
        """The engine has stopped with the query: its place (and its key's share, if still held) is free."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._free_key()
        self._ledger.free_pool(self.caller)

    def _free_key(self) -> None:
        with self._lock:
            held, self._key_held = self._key_held, False
        if held:
            self._ledger.free_key(self.caller)

    def _kill(self) -> None:
        assert self._tag is not None
        self._ledger.kill(self._query_id, self._tag)
