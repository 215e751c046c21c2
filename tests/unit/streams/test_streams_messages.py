"""The worker's own messages: one envelope per partition, entries intact and in order, bad shapes refused."""

from __future__ import annotations

import numpy as np
import pytest

from clawr1.streams import messages
from clawr1.streams.normalize import StepFact, wire_fact


def test_an_envelope_restores_every_entry_in_order() -> None:
    entries = [(f"id-{i}", messages.message(messages.TARGET, step_id=f"s{i}", target={"n": i, "é": [1, 2]}))
               for i in range(50)]
    assert messages.unpack(messages.pack(entries)) == entries


@pytest.mark.parametrize("data", [b"[]", b'{"messages": 3}', b'{"messages": [["k", {"no": "kind"}]]}',
                                  b"\xff"])
def test_a_malformed_envelope_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        messages.unpack(data)


def test_a_fact_crosses_with_its_arrays_packed_and_reads_back_as_an_envelope_gives_it() -> None:
    ids = np.arange(2_048, dtype=np.int32)
    fact = StepFact({"step_id": "s", "prompt_token_ids": ids, "response_token_ids": [7, 8],
                     "response_logprobs": [-0.5, -1e-7], "prompt_group_id": "g"}, [{"reward": 1.0}])
    wire = wire_fact(fact.to_json())
    assert isinstance(wire["step"]["prompt_token_ids"], str) and wire_fact(wire) is wire  # packed once
    entry = [("g", messages.message(messages.GROUP_STEP, fact=wire))]
    back = StepFact.from_json(messages.unpack(messages.pack(entry))[0][1]["fact"])
    prompt = back.step["prompt_token_ids"]
    assert prompt.dtype == np.int32 and np.array_equal(prompt, ids)
    assert list(back.step["response_token_ids"]) == [7, 8] and back.step["response_logprobs"] == [-0.5, -1e-7]
    assert (back.step["prompt_group_id"], back.feedback) == ("g", [{"reward": 1.0}])
    bare = {"step": {"response_logprobs": None}, "feedback": []}
    assert wire_fact(bare) is bare
