"""What the sink reads out of an ``expire`` dead letter: the feedback, whether the worker cited it as a
fact (JSON) or as the raw feedback event it held."""

from __future__ import annotations

import orjson

from clawr1.schemas.codec import codec_for
from clawr1.sinks.late_feedback import expired_feedback
from tests.support.events import feedback

CODEC = codec_for("")


def test_a_held_raw_event_and_a_cited_fact_read_as_the_same_feedback() -> None:
    raw = feedback("fb-1", "step", "s-1", reward=0.5, at=1_760_000_000_000)
    held = {"stage": "expire", "original_value": CODEC.encode("feedback", raw), "dlq_id": "a"}
    fact = expired_feedback(held, CODEC)
    assert fact is not None
    assert (fact["feedback_id"], fact["target_id"], fact["reward"]) == ("fb-1", "s-1", 0.5)
    cited = {"stage": "expire", "original_value": orjson.dumps(fact), "dlq_id": "b"}
    assert expired_feedback(cited, CODEC) == fact


def test_other_dead_letters_and_unreadable_ones_carry_no_feedback() -> None:
    assert expired_feedback({"stage": "validate", "original_value": b"{}"}, CODEC) is None
    assert expired_feedback({"stage": "expire", "original_value": b"\x00junk", "dlq_id": "c"}, CODEC) is None
    assert expired_feedback({"stage": "expire", "original_value": None}, CODEC) is None
