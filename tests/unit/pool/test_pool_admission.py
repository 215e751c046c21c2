"""The ledger of SQL places: a killed query gives its key's share back at once, and its place in the pool
only once the engine has stopped with it."""

from __future__ import annotations

import pytest

from clawr1.pool.admission import ANALYSTS, Caller, Ledger, SqlBusy, overran
from clawr1.pool.sql import SqlLimits


def ledger(kills: list[tuple[str, str]]) -> Ledger:
    return Ledger(SqlLimits(max_concurrent=2, key_share=0.5),
                  lambda query_id, tag: kills.append((query_id, tag)))


ALICE = Caller("alice", ANALYSTS, limited=True)
BOB = Caller("bob", ANALYSTS, limited=True)


def test_a_killed_query_frees_its_key_at_once_and_its_place_when_the_engine_stops() -> None:
    kills: list[tuple[str, str]] = []
    places = ledger(kills)
    running = places.admit(ALICE)
    running.started("tag-1", 2.0)
    with pytest.raises(SqlBusy, match="its share"):
        places.admit(ALICE)
    running.cancel(overran(2.0))
    assert [tag for _, tag in kills] == ["tag-1"]
    assert places.running(ANALYSTS, "alice") == 0 and places.running(ANALYSTS) == 1
    again = places.admit(ALICE)  # her share is back; the engine still holds one of the two places
    with pytest.raises(SqlBusy, match="sessions of the analysts are in use"):
        places.admit(BOB)
    running.release()
    running.release()  # the stream's end and an error path may both release
    assert places.running(ANALYSTS) == 1 and places.running(ANALYSTS, "alice") == 1
    again.release()
    assert places.running(ANALYSTS) == 0 and places.running(ANALYSTS, "alice") == 0


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
    assert places.running(ANALYSTS) == 0 and places.running(ANALYSTS, "bob") == 0
