"""State records name their fields and leave out those at their default: what ``encode`` writes,
``decode`` reads back as the same object, whatever the defaults are made of."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from clawr1.streams import state_codec

_serial = itertools.count()


@dataclass
class Record:
    name: str
    count: int = 0
    tags: list[str] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    # A factory whose value differs call by call: compared with a fresh one, as it always was.
    serial: int = field(default_factory=lambda: next(_serial))


def test_fields_at_their_default_are_left_out_and_read_back() -> None:
    record = Record("a")
    encoded = state_codec.encode(record)
    assert set(encoded) == {"name", "serial"}
    assert state_codec.decode(Record, encoded) == record


def test_an_empty_default_shared_by_the_codec_is_never_handed_out() -> None:
    """The codec keeps one empty list per field to compare with; decoding gives each record its own."""
    one, two = state_codec.decode(Record, {"name": "a"}), state_codec.decode(Record, {"name": "b"})
    one.tags.append("x")
    assert two.tags == [] and state_codec.encode(Record("c"))["name"] == "c"
    assert state_codec.encode(one)["tags"] == ["x"]


def test_values_beside_their_defaults_are_kept() -> None:
    record = Record("a", count=3, tags=["t"], seen={"k": 1}, serial=-1)
    assert state_codec.encode(record) == {"name": "a", "count": 3, "tags": ["t"], "seen": {"k": 1},
                                          "serial": -1}
    assert state_codec.decode(Record, state_codec.encode(record)) == record


def test_a_removed_field_is_ignored_and_version_one_lists_still_read() -> None:
    assert state_codec.decode(Record, {"name": "a", "gone": 1, "serial": 5}) == Record("a", serial=5)
    assert state_codec.decode(Record, ["a", 2, ["t"], {}, 7]) == Record("a", 2, ["t"], {}, 7)
