"""Curation requests become feedback items; a scope's packed ribbon and mask thumbnail; SSE framing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clawr1.dashboard.curation import CurateRequest, curation_feedback, mask_thumbnail, sharing_runs
from clawr1.dashboard.live import sse
from clawr1.prefix_tree.packing import pack_tree
from clawr1.prefix_tree.tree import StepTokens


def test_a_curation_is_one_labelled_feedback_per_label_and_the_note_once() -> None:
    request = CurateRequest(step_ids=["a", "b"], labels=["tidy"], quality="bad", trainable=False,
                            exclude=True, note="tool output ignored")
    assert request.labels_to_set() == ["tidy", "quality:bad", "untrainable", "excluded"]
    items = curation_feedback(request, ["a", "b"])
    assert len(items) == 8
    assert items[0] == {"step_id": "a", "source": "curation", "final": True, "label": "tidy",
                        "comment": "tool output ignored"}
    assert [i.get("comment") for i in items[:4]] == ["tool output ignored", None, None, None]
    assert curation_feedback(CurateRequest(filters={}, note="look"), ["c"]) == [
        {"step_id": "c", "source": "curation", "final": True, "comment": "look"}]


@pytest.mark.parametrize("body", [
    {"step_ids": ["a"]},  # nothing to set
    {"labels": ["x"]},  # no target
    {"step_ids": ["a"], "filters": {}, "labels": ["x"]},  # two targets
    {"step_ids": ["a"], "exclude": False},  # labels only add: an exclusion cannot be withdrawn
    {"step_ids": ["a"], "labels": ["has space"]},
    {"step_ids": ["a\r\nb"], "exclude": True},  # ids as every way in takes them (was a 500 writing feedback)
    {"step_ids": ["a" * 257], "exclude": True},
])
def test_invalid_curations_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CurateRequest(**body)


def test_ribbon_counts_the_steps_sharing_each_packed_run_and_the_mask_shrinks() -> None:
    packed = pack_tree([StepTokens("s1", [1, 2, 3], [4]), StepTokens("s2", [1, 2, 3], [5, 6])])
    # Depth-first: the shared prompt 1 2 3, then s1's reply 4, then s2's reply 5 6.
    assert sharing_runs(packed) == [{"start": 0, "end": 3, "shared": 2}, {"start": 3, "end": 6, "shared": 1}]
    full = mask_thumbnail(packed, cells=64)
    assert len(full) == packed.num_tokens and full[5][3] == 0.0 and full[5][2] == 1.0
    small = mask_thumbnail(packed, cells=2)
    assert len(small) == 2 and small[0][1] == 0.0 and 0 < small[1][0] <= 1


def test_server_sent_event_framing() -> None:
    assert sse("pulse", {"steps": 3}) == b'event: pulse\ndata: {"steps":3}\n\n'
