"""Resolving feedback targets (step ids, response ids) to exactly one step, or refusing with a reason.

Feedback is keyed by the id it targets, which says nothing about the trajectory. Normalization
publishes an index entry ``target id -> (trajectory, step)`` for every step id and response id to
the same internal topic the feedback is re-keyed into, so both meet in one partition, in one
``TargetState``. Engines reuse response ids (Ollama draws ``chatcmpl-<0..998>``; content-hash ids
are shared by identical replies), so a target may name several steps. Feedback resolves once, when
it first meets at least one step:

- one step: that step;
- several: the only one created within ``window_ms`` before the feedback was received, if exactly
  one is; otherwise the feedback is refused (dead letter) with the candidates in the reason;
- the bare id of an ``n > 1`` call (each choice has ``<id>:<choice>`` too): the choice the agent
  continued with, when exactly one was; otherwise refused.

Feedback that arrives before its target is held until the target appears. The outcome is kept, so
a re-delivered entry or feedback repeats it (the join ignores facts it already folded in; a
dead letter has the raw feedback's position as its id) and a step that shows up later under the
same id never gets feedback that already resolved elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from clawr1.streams.rewards import fact_digest


@dataclass
class Target:
    """A step a target id names."""

    trajectory_id: str
    created_at_ms: int
    choice: bool = False  # named by the bare id of an n > 1 call
    continued: bool = False  # (choices) the agent continued from it


@dataclass
class Held:
    """Feedback for this target, where it came from (for a dead letter) and how it resolved."""

    fact: dict[str, Any]
    origin: dict[str, Any]
    step_id: str | None = None
    refused: str | None = None


@dataclass(frozen=True)
class Forward:
    """Feedback for one step, to be sent to that step's trajectory."""

    trajectory_id: str
    step_id: str
    feedback: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """Feedback that resolves to no single step: the dead letter's reason and the raw event's origin."""

    reason: str
    origin: dict[str, Any]


@dataclass
class TargetState:
    steps: dict[str, Target] = field(default_factory=dict)  # step id -> what the target knows of it
    feedback: list[Held] = field(default_factory=list)  # distinct by content digest

    def to_json(self) -> dict[str, Any]:
        return {"steps": {k: asdict(t) for k, t in self.steps.items()},
                "feedback": [asdict(h) for h in self.feedback]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TargetState:
        if not data:
            return cls()
        return cls({k: Target(**t) for k, t in data["steps"].items()}, [Held(**h) for h in data["feedback"]])


Outcome = tuple[bool, list[Forward], list[Refusal]]  # (state changed, forwards, refusals)


def _resolve(state: TargetState, target_id: str, fact: dict[str, Any],
             window_ms: int) -> tuple[str | None, str]:
    """(step id, "") when the feedback names exactly one step, else (None, why not)."""
    choices = sorted(s for s, t in state.steps.items() if t.choice)
    if choices:
        continued = [s for s in choices if state.steps[s].continued]
        if len(continued) == 1:
            return continued[0], ""
        return None, (f"{target_id} names a call with {len(choices)} choices {choices}, of which "
                      f"{len(continued)} were continued {continued}; target one step id instead")
    if len(state.steps) == 1:
        return next(iter(state.steps)), ""
    received = fact["received_at_ms"]
    recent = sorted(s for s, t in state.steps.items() if received - window_ms <= t.created_at_ms <= received)
    if len(recent) == 1:
        return recent[0], ""
    candidates = ", ".join(f"{s} (trajectory {t.trajectory_id}, created {t.created_at_ms})"
                           for s, t in sorted(state.steps.items()))
    return None, (f"{target_id} is ambiguous: {len(recent)} of its steps were created within {window_ms} ms "
                  f"before the feedback; candidates: {candidates}")


def _outcome(state: TargetState, held: Held) -> tuple[list[Forward], list[Refusal]]:
    if held.step_id is not None:
        return [Forward(state.steps[held.step_id].trajectory_id, held.step_id, held.fact)], []
    if held.refused is not None:
        return [], [Refusal(held.refused, held.origin)]
    return [], []


def _settle(state: TargetState, target_id: str, held: Held, window_ms: int) -> bool:
    """Resolve held feedback when the target names a step now; True when that changed it."""
    if held.step_id is not None or held.refused is not None or not state.steps:
        return False
    step_id, reason = _resolve(state, target_id, held.fact, window_ms)
    held.step_id, held.refused = step_id, reason or None
    return True


def add_target(state: TargetState, target_id: str, step_id: str, target: Target, window_ms: int) -> Outcome:
    """Record that the target names ``step_id`` (or that the agent continued that choice)."""
    known = state.steps.get(step_id)
    if known is not None and target.continued is False:
        target.continued = known.continued
    changed = known != target
    state.steps[step_id] = target
    forwards: list[Forward] = []
    refusals: list[Refusal] = []
    for held in state.feedback:
        settled = _settle(state, target_id, held, window_ms)
        changed = changed or settled
        if settled or held.step_id == step_id:  # new outcome, or a re-delivered entry: repeat it
            more, refused = _outcome(state, held)
            forwards += more
            refusals += refused
    return changed, forwards, refusals


def add_feedback(state: TargetState, target_id: str, fact: dict[str, Any], origin: dict[str, Any],
                 window_ms: int) -> Outcome:
    """Hold the feedback and resolve it if the target names a step; a re-delivery repeats its outcome."""
    digest = fact_digest(fact)
    held = next((h for h in state.feedback if fact_digest(h.fact) == digest), None)
    changed = held is None
    if held is None:
        held = Held(fact, origin)
        state.feedback.append(held)
    changed = _settle(state, target_id, held, window_ms) or changed
    forwards, refusals = _outcome(state, held)
    return changed, forwards, refusals
