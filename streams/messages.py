"""What the worker sends itself across partitions on ``clawr1.internal.work``.

Most work happens where its input landed: a white-box trajectory is keyed by its own id, a black-box
call's trajectory is named after the call (``clawr1.core.routing``), so linking, the join and the
trajectory's prefix tree share one partition. What belongs elsewhere (an index entry under an engine's
response id, feedback for a step of another partition, a step's prompt group, its merge scope) goes to that
partition as a message of this topic. Only this worker reads the topic, so it carries plain JSON with
no schema-evolution contract; one message holds a checkpoint's messages for one partition::

    {"messages": [[key, {"kind": ..., ...}], ...]}
"""

from __future__ import annotations

from typing import Any

import orjson

# Trajectory messages (key: trajectory id), applied in the trajectory's partition.
STEP = "step"  # {"fact": StepFact}, its arrays packed across partitions (``normalize.wire_fact``)
STEP_FEEDBACK = "step_feedback"  # {"step_id", "feedback"}
TRAJECTORY_FEEDBACK = "trajectory_feedback"  # {"feedback"}
SUPERSEDE = "supersede"  # {"step_id"}
UNSUPERSEDE = "unsupersede"  # {"step_id"}: a superseded step continued after all (linking's revival)
# Target messages (key: target id), in the target's partition (clawr1.streams.targets).
TARGET = "target"  # {"step_id", "target": Target fields}
FEEDBACK = "feedback"  # {"feedback", "origin": the raw feedback's position and bytes, for a dead letter}
# Feedback for a routable step id (key: the id), in the partition the id names.
ROUTED_FEEDBACK = "routed_feedback"  # {"feedback", "origin"}
# A step naming a prompt group, before its trajectory: the group's owner decides where it goes (key: the
# group id; ``clawr1.streams.ownership``). ``named``: [group id, owner] of the group the step named, when
# the group of the key is the step's own instead.
GROUP_STEP = "group_step"  # {"fact": StepFact, "named"?}
# A tokenized step for a prompt group's merge scope (key: scope id).
SCOPE_STEP = "scope_step"  # ScopeStep.to_message(): token ids packed

TRAJECTORY_KINDS = frozenset({STEP, STEP_FEEDBACK, TRAJECTORY_FEEDBACK, SUPERSEDE, UNSUPERSEDE})


def message(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, **fields}


def pack(messages: list[tuple[str, dict[str, Any]]]) -> bytes:
    return orjson.dumps({"messages": messages}, option=orjson.OPT_SERIALIZE_NUMPY)


def unpack(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    decoded = orjson.loads(data)
    if not isinstance(decoded, dict) or not isinstance(decoded.get("messages"), list):
        raise ValueError("an internal message must be {\"messages\": [[key, message], ...]}")
    out = []
    for entry in decoded["messages"]:
        key, body = entry
        if not isinstance(body, dict) or "kind" not in body:
            raise ValueError(f"internal message for {key!r} without a kind")
        out.append((str(key), body))
    return out
