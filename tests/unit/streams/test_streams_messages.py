"""The worker's own messages: one envelope per partition, entries intact and in order, bad shapes refused."""

from __future__ import annotations

import pytest

from clawr1.streams import messages


def test_an_envelope_restores_every_entry_in_order() -> None:
    entries = [(f"id-{i}", messages.message(messages.TARGET, step_id=f"s{i}", target={"n": i, "é": [1, 2]}))
               for i in range(50)]
    assert messages.unpack(messages.pack(entries)) == entries


@pytest.mark.parametrize("data", [b"[]", b'{"messages": 3}', b'{"messages": [["k", {"no": "kind"}]]}',
                                  b"\xff"])
def test_a_malformed_envelope_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        messages.unpack(data)
