"""The JSON messages the stream stages pass each other on the ``clawr1.internal.*`` topics.

Internal topics are read only by this worker, so they carry plain JSON (no schema evolution
contract); every message names its ``kind``.
"""

from __future__ import annotations

import json
from typing import Any

from clawr1.streams.normalize import StepFact

# clawr1.internal.trajectories (key: trajectory id)
STEP = "step"  # {"fact": StepFact}
STEP_FEEDBACK = "step_feedback"  # {"step_id", "feedback"}
TRAJECTORY_FEEDBACK = "trajectory_feedback"  # {"feedback"}
SUPERSEDE = "supersede"  # {"step_id"}
# clawr1.internal.targets (key: target id)
TARGET = "target"  # {"step_id", "target": clawr1.streams.targets.Target fields}
FEEDBACK = "feedback"  # {"feedback", "origin": the raw feedback's position and bytes, for a dead letter}


def encode(kind: str, **fields: Any) -> bytes:
    return json.dumps({"kind": kind, **fields}, ensure_ascii=False, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict) or "kind" not in message:
        raise ValueError("internal message without a kind")
    return message


def step_message(fact: StepFact) -> bytes:
    return encode(STEP, fact=fact.to_json())
