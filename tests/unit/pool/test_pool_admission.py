"""The ledger of SQL places: a killed query the engine still runs frees its key's share and its live place
at once, and counts apart until the engine stops, a key's share of them per key and a pool's worth in all."""

from __future__ import annotations

import pytest

from clawr1.pool.admission import ANALYSTS, KILLED, Caller, Ledger, SqlBusy, overran
from clawr1.pool.sql import SqlLimits


def ledger(kills: list[tuple[str, str]], sessions: int = 2, stops: bool = False) -> Ledger:
    """``stops``: a kill ends the query there and then (an analyst process's), not at the engine's next
    block (``KILL QUERY``)."""
    def kill(query_id: str, tag: str) -> bool:
        kills.append((query_id, tag))
        return stops

    return Ledger(SqlLimits(max_concurrent=sessions, key_share=0.5), kill)


ALICE = Caller("alice", ANALYSTS, limited=True)
BOB = Caller("bob", ANALYSTS, limited=True)


def test_a_killed_query_frees_its_key_and_place_at_once_and_counts_apart_until_the_engine_stops() -> None:
    kills: list[tuple[str, str]] = []
    places = ledger(kills, sessions=4)  # a key's share: 2
    first, second = places.admit(ALICE), places.admit(ALICE)
    first.started("tag-1", 2.0)
    with pytest.raises(SqlBusy, match="its share"):
        places.admit(ALICE)
    first.cancel(overran(2.0))
    assert [tag for _, tag in kills] == ["tag-1"]
    assert places.running(ANALYSTS, "alice") == 1 and places.running(ANALYSTS, "alice", KILLED) == 1
    third = places.admit(ALICE)  # her share is hers again while the engine is still in the call
    third.cancel(overran(2.0))  # a second killed one: her share of those
    with pytest.raises(SqlBusy, match="2 queries of the key 'alice' ran past their limit"):
        places.admit(ALICE)
    places.admit(BOB).release()  # no one else's
    first.release()
    first.release()  # the stream's end and an error path may both release
    assert places.running(ANALYSTS, "alice", KILLED) == 1
    places.admit(ALICE).release()
    for admission in (second, third):
        admission.release()
    assert places.running(ANALYSTS) == 0 and places.running(ANALYSTS, state=KILLED) == 0


def test_killed_queries_fill_at_most_a_pool_of_their_own() -> None:
    places = ledger([], sessions=1)
    anyone = Caller()  # the one caller of a key-less stack has no share to keep
    first = places.admit(anyone)
    with pytest.raises(SqlBusy, match="the 1 SQL sessions of the analysts are in use"):
        places.admit(anyone)
    first.cancel(overran(1.0))
    with pytest.raises(SqlBusy, match="1 queries of the analysts ran past their limit"):
        places.admit(anyone)
    first.release()
    places.admit(anyone).release()


def test_a_query_cancelled_before_it_starts_is_killed_as_it_starts() -> None:
    kills: list[tuple[str, str]] = []
    places = ledger(kills)
    admission = places.admit(BOB)
    admission.cancel("the client went away")
    admission.cancel("again")  # one kill, one reason
    assert kills == [] and admission.reason == "the client went away"
    admission.started("tag-2", 2.0)
    assert [tag for _, tag in kills] == ["tag-2"]
    admission.release()
    assert places.running(ANALYSTS, state=KILLED) == 0 and places.running(ANALYSTS, "bob") == 0


def test_a_query_whose_kill_stops_it_frees_everything_at_once() -> None:
    """An analyst process killed at the limit: nothing runs on, so nothing counts apart."""
    kills: list[tuple[str, str]] = []
    places = ledger(kills, sessions=4, stops=True)
    first, second = places.admit(ALICE), places.admit(ALICE)
    first.started("tag-3", 2.0)
    first.cancel(overran(2.0))
    assert [tag for _, tag in kills] == ["tag-3"]
    assert places.running(ANALYSTS, "alice") == 1 and places.running(ANALYSTS, "alice", KILLED) == 0
    first.release()  # the stream's own end after the kill changes nothing
    second.release()
    assert places.running(ANALYSTS) == 0 and places.running(ANALYSTS, state=KILLED) == 0
