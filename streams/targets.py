"""Resolving feedback targets (step ids, response ids) to the trajectories that hold them.

Feedback is keyed by the id it targets, which says nothing about the trajectory. Normalization
publishes an index entry ``target id -> (trajectory, step)`` for every step id and response id to
the same internal topic the feedback is re-keyed into, so both meet in one partition, in one
``TargetState``. Feedback that arrives first is held there and forwarded when its target shows up;
a target that later gains more steps (a content-hash response id shared by identical replies)
gets the feedback already held. Re-delivered entries and feedback are forwarded again: the join
ignores facts it has already folded in, and forwarding again repairs a forward lost in a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streams.rewards import fact_digest


@dataclass(frozen=True)
class Forward:
    """Feedback for one step, to be sent to that step's trajectory."""

    trajectory_id: str
    step_id: str
    feedback: dict[str, Any]


@dataclass
class TargetState:
    steps: dict[str, str] = field(default_factory=dict)  # step id -> trajectory id
    feedback: list[dict[str, Any]] = field(default_factory=list)  # distinct by content digest

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "feedback": self.feedback}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TargetState:
        return cls(**data) if data else cls()


def add_target(state: TargetState, trajectory_id: str, step_id: str) -> tuple[bool, list[Forward]]:
    """Record that the target names ``step_id``; returns (state changed, feedback to forward)."""
    changed = state.steps.get(step_id) != trajectory_id
    state.steps[step_id] = trajectory_id
    return changed, [Forward(trajectory_id, step_id, fb) for fb in state.feedback]


def add_feedback(state: TargetState, fact: dict[str, Any]) -> tuple[bool, list[Forward]]:
    """Hold the feedback; returns (state changed, forwards to every step the target is known to name)."""
    digest = fact_digest(fact)
    changed = all(fact_digest(f) != digest for f in state.feedback)
    if changed:
        state.feedback.append(fact)
    forwards = [Forward(trajectory, step_id, fact) for step_id, trajectory in sorted(state.steps.items())]
    return changed, forwards
