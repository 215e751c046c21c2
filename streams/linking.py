"""Trajectory linking of turns by conversation continuation.

A turn continues an earlier step when its messages start with that step's prompt plus its reply;
the longest such prefix names the parent. An explicit trajectory id (X-Claw header, service
event) wins: the turn joins that trajectory whatever its content, after its latest step when no
content link is found. Otherwise a turn without a parent starts a new trajectory whose id derives
from the turn's event id, so replays assign the same ids.

The state is one ``LinkState`` per raw.llm key (trajectory hint or conversation root), which is
why it lives in the streams: several proxy instances feed the same key. It is bounded: each map
keeps its newest ``max_entries`` entries, so a continuation of a very old step (beyond the bound)
starts a new trajectory instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clawr1.conversation import prefix_digests
from streams.turns import Turn


@dataclass(frozen=True)
class StepRef:
    step_id: str
    trajectory_id: str
    step_index: int


@dataclass(frozen=True)
class Assignment:
    """Where a turn sits: its trajectory, its index there, its parent step (if known)."""

    trajectory_id: str
    step_index: int
    parent_step_id: str | None


@dataclass
class LinkState:
    links: dict[str, StepRef] = field(default_factory=dict)  # digest(prompt + reply) -> step
    assigned: dict[str, Assignment] = field(default_factory=dict)  # event id -> assignment
    latest: dict[str, StepRef] = field(default_factory=dict)  # explicit trajectory -> its latest step

    def to_json(self) -> dict[str, Any]:
        return {
            "links": {k: [r.step_id, r.trajectory_id, r.step_index] for k, r in self.links.items()},
            "assigned": {k: [a.trajectory_id, a.step_index, a.parent_step_id]
                         for k, a in self.assigned.items()},
            "latest": {k: [r.step_id, r.trajectory_id, r.step_index] for k, r in self.latest.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LinkState:
        if not data:
            return cls()
        return cls(
            links={k: StepRef(*v) for k, v in data["links"].items()},
            assigned={k: Assignment(*v) for k, v in data["assigned"].items()},
            latest={k: StepRef(*v) for k, v in data["latest"].items()},
        )


def step_ids_of(turn: Turn) -> list[str]:
    """Deterministic step ids: the event id, suffixed with the choice index when n > 1."""
    if turn.step_id is not None:
        return [turn.step_id]
    if len(turn.replies) <= 1:
        return [turn.event_id]
    return [f"{turn.event_id}:{reply.index}" for reply in turn.replies]


def reply_digest(turn: Turn, reply_messages: list[dict[str, Any]]) -> str:
    """Identity of ``prompt + reply``: the prefix a continuation of this reply starts with."""
    return prefix_digests([*turn.messages, *reply_messages])[-1]


def _find_parent(state: LinkState, turn: Turn) -> StepRef | None:
    for digest in reversed(prefix_digests(turn.messages)):
        ref = state.links.get(digest)
        if ref is not None and (turn.trajectory_id is None or ref.trajectory_id == turn.trajectory_id):
            return ref
    return None


def _assign(state: LinkState, turn: Turn) -> Assignment:
    parent = _find_parent(state, turn)
    if parent is None and turn.trajectory_id is not None and turn.step_index is None:
        parent = state.latest.get(turn.trajectory_id)
    if parent is not None:
        index = turn.step_index if turn.step_index is not None else parent.step_index + 1
        return Assignment(turn.trajectory_id or parent.trajectory_id, index, parent.step_id)
    return Assignment(turn.trajectory_id or f"traj-{turn.event_id}", turn.step_index or 0, None)


def _trim(mapping: dict[str, Any], bound: int) -> None:
    for key in list(mapping)[: max(0, len(mapping) - bound)]:
        del mapping[key]


def link_turn(state: LinkState, turn: Turn, max_entries: int) -> Assignment:
    """Assign ``turn`` and record it in ``state`` (mutated). Replaying a turn returns its first assignment."""
    known = state.assigned.get(turn.event_id)
    if known is not None:
        return known
    assignment = _assign(state, turn)
    state.assigned[turn.event_id] = assignment
    if not turn.failed:
        for step_id, reply in zip(step_ids_of(turn), turn.replies, strict=True):
            ref = StepRef(step_id, assignment.trajectory_id, assignment.step_index)
            state.links[reply_digest(turn, reply.messages)] = ref
            if turn.trajectory_id is not None:
                previous = state.latest.get(turn.trajectory_id)
                if previous is None or previous.step_index <= ref.step_index:
                    state.latest.pop(turn.trajectory_id, None)  # re-insert: newest last, trimmed last
                    state.latest[turn.trajectory_id] = ref
    for mapping in (state.links, state.assigned, state.latest):
        _trim(mapping, max_entries)
    return assignment
