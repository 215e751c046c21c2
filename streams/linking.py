"""Trajectory linking of turns: a bijection between calls and trajectories, or an explicit flag.

A turn continues an earlier step when its messages start with that step's prompt plus its reply
(compared canonically, ``clawr1.core.conversation``). Several steps can have the same prompt plus
reply: k GRPO rollouts of one task whose first actions are identical. Their states are identical,
so any one-to-one assignment is correct, and the linker keeps it one-to-one: a continuation goes
to a matching step that has not been continued yet (preferring the one whose call came on the
same client connection, then the oldest), never to one already continued. The one exception is a
retry told apart by its client connection (below).

When every matching step has already been continued, or when the turn repeats the prompt of a
sibling that came on the turn's own client connection (and no free step did), the turn is a retry
(its prompt equals a sibling's: same parent, same prompt); otherwise, with every match continued,
it is a branch. A retry joins the sibling's trajectory
at the same index and supersedes the earlier call there (the agent asked again: it threw that
answer away); a retry of a step the trajectory already went on from is ``superseded`` itself.
A branch the linker cannot place starts a new trajectory marked ``ambiguous``; so does a turn that
extends a step's prompt but not its reply. A turn that keeps only the conversation's root prompt
(system + task) and then goes on with content no step produced is ``compacted``. Both name the
step they most likely continue (``candidate_step_id``). A turn nothing matches is a ``root``.

An explicit trajectory id (X-Claw header, the compat port's path, a service event) wins: the
turn is matched only within that trajectory, a turn matching nothing there follows its latest
step, and a continuation of an already-continued step is a retry (the agent said so).

With ``n > 1`` every choice is a rollout of its own trajectory (``<trajectory>:<choice>``) in one
prompt group of size n; continuations inherit their parent's group.

State is one ``LinkState`` per raw.llm key (explicit trajectory or conversation root). It is
bounded by event-time age (``horizon_ms``, relative to the newest event of the key) and, as a
safety valve, by a count. A redelivered event gets its first assignment while that is within the
horizon; an unknown event older than the horizon is refused (its first assignment may have
expired), never silently relinked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from clawr1.core.conversation import prefix_digests
from clawr1.streams.turns import InvalidEvent, Turn

LINKED, ROOT, AMBIGUOUS, COMPACTED, SUPERSEDED = "linked", "root", "ambiguous", "compacted", "superseded"


@dataclass
class Node:
    """What the linker remembers of a step."""

    trajectory_id: str
    step_index: int
    parent_step_id: str | None
    prompt: str  # digest of the prompt
    tail: str  # digest of prompt + reply; "" for a failed call (never a parent)
    at_ms: int
    connection: str = ""
    explicit: str | None = None  # the trajectory id the call named
    group_id: str | None = None
    group_size: int | None = None
    response_id: str | None = None  # the engine's id of the call, for a choice of an n > 1 call
    continued: bool = False
    superseded: bool = False


@dataclass(frozen=True)
class Assignment:
    """Where one step sits: trajectory, index, parent (if known), how it was linked, its group."""

    trajectory_id: str
    step_index: int
    parent_step_id: str | None
    link_status: str = LINKED
    candidate_step_id: str | None = None
    prompt_group_id: str | None = None
    prompt_group_size: int | None = None


@dataclass(frozen=True)
class Continued:
    """A choice of an n > 1 call that a turn continued: feedback by the call's id resolves to it."""

    response_id: str
    trajectory_id: str
    step_id: str
    created_at_ms: int


@dataclass(frozen=True)
class Linked:
    """What linking one turn decided; re-published as is when the turn is redelivered."""

    assignments: list[Assignment]  # one per step of the turn (``step_ids_of``)
    superseded: list[tuple[str, str]] = field(default_factory=list)  # (step id, trajectory id)
    continued: Continued | None = None
    at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"assignments": [list(vars(a).values()) for a in self.assignments],
                "superseded": [list(s) for s in self.superseded],
                "continued": None if self.continued is None else list(vars(self.continued).values()),
                "at_ms": self.at_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Linked:
        continued = data["continued"]
        return cls([Assignment(*a) for a in data["assignments"]], [(s, t) for s, t in data["superseded"]],
                   None if continued is None else Continued(*continued), data["at_ms"])


@dataclass
class LinkState:
    nodes: dict[str, Node] = field(default_factory=dict)  # step id -> node
    assigned: dict[str, Linked] = field(default_factory=dict)  # event id -> what linking decided
    clock_ms: int = 0  # newest event time seen: the horizon is measured from here

    def to_json(self) -> dict[str, Any]:
        """Nodes as plain lists (field order): the state is rewritten on every call of its key."""
        return {"nodes": {k: list(vars(n).values()) for k, n in self.nodes.items()},
                "assigned": {k: a.to_json() for k, a in self.assigned.items()}, "clock_ms": self.clock_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LinkState:
        if not data or "nodes" not in data:  # nothing, or the pre-bijection layout: start over
            return cls()
        return cls({k: Node(*n) for k, n in data["nodes"].items()},
                   {k: Linked.from_json(a) for k, a in data["assigned"].items()}, data["clock_ms"])


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


_DIGEST_CHARS = 32  # 128 bits: collisions within one key are out of reach, and the state stays small


def _digests(messages: list[dict[str, Any]]) -> list[str]:
    return [d[:_DIGEST_CHARS] for d in prefix_digests(messages)]


def _prompt_digest(turn: Turn) -> str:
    digests = _digests(turn.messages)
    return digests[-1] if digests else ""


def _preference(turn: Turn, step_id: str, node: Node) -> tuple[bool, int, str]:
    """Among equally valid steps: the one from the same client connection, then the oldest."""
    same = bool(turn.connection) and node.connection == turn.connection
    return (not same, node.at_ms, step_id)


def _best(turn: Turn, state: LinkState, step_ids: list[str]) -> str:
    return min(step_ids, key=lambda s: _preference(turn, s, state.nodes[s]))


@dataclass(frozen=True)
class _Place:
    """Where the turn goes before n > 1 splits it: a parent to follow, a retry slot, or a start."""

    status: str
    parent: str | None = None  # step to continue (linked)
    sibling: str | None = None  # step whose slot a retry shares
    candidate: str | None = None  # the likely parent of an ambiguous / compacted start


def _place(state: LinkState, turn: Turn) -> _Place:
    live = {s: n for s, n in state.nodes.items() if not n.superseded
            and (turn.trajectory_id is None or n.explicit == turn.trajectory_id)}
    digests = _digests(turn.messages)
    prompt = digests[-1] if digests else ""
    depth_of = {d: i for i, d in enumerate(digests)}
    # The deepest step whose prompt plus reply the turn starts with, and the deepest whose prompt only.
    tails = [(depth_of[n.tail], s) for s, n in live.items() if n.tail in depth_of]
    extended = [(depth_of[n.prompt], s) for s, n in live.items()
                if n.prompt in depth_of and depth_of[n.prompt] < len(digests) - 1]
    tail_depth = max((i for i, _ in tails), default=-1)
    prompt_depth = max((i for i, _ in extended), default=-1)
    if tail_depth >= 0 and tail_depth >= prompt_depth:
        matching = [s for i, s in tails if i == tail_depth]
        free = [s for s in matching if not live[s].continued]
        retries = [s for s, n in live.items() if n.parent_step_id in matching and n.prompt == prompt]
        if free:
            # Content cannot tell a retry from another rollout's identical continuation; the client
            # connection can: a repeat of a sibling's prompt on that sibling's connection is a retry.
            mine = [s for s in retries if turn.connection and live[s].connection == turn.connection]
            if mine and all(live[s].connection != turn.connection for s in free):
                return _Place(LINKED, sibling=_best(turn, state, mine))
            return _Place(LINKED, parent=_best(turn, state, free))
        if retries or turn.trajectory_id is not None:
            children = retries or [s for s, n in live.items() if n.parent_step_id in matching]
            return _Place(LINKED, sibling=_best(turn, state, children))
        return _Place(AMBIGUOUS, candidate=_best(turn, state, matching))
    # An unknown prompt (a span without its messages) is not evidence of a retry: it matches nothing.
    same_prompt = [s for s, n in live.items() if prompt and n.prompt == prompt]
    if turn.trajectory_id is not None:
        if same_prompt:
            return _Place(LINKED, sibling=_best(turn, state, same_prompt))
        if live:
            latest = max(live, key=lambda s: (live[s].step_index, live[s].at_ms, s))
            return _Place(LINKED, parent=latest)
        return _Place(ROOT)
    if same_prompt or prompt_depth < 0:
        return _Place(ROOT)  # another rollout of a known prompt, or a new conversation
    deepest = [s for i, s in extended if i == prompt_depth]
    if all(live[s].step_index == 0 for s in deepest):
        # Only the task survives: a compacted context. Its likely parent is a trajectory's newest tip.
        roots = {live[s].trajectory_id for s in deepest}
        tips = [s for s, n in live.items() if n.trajectory_id in roots and not n.continued]
        return _Place(COMPACTED, candidate=max(tips or deepest, key=lambda s: (
            bool(turn.connection) and live[s].connection == turn.connection, live[s].at_ms, s)))
    return _Place(AMBIGUOUS, candidate=_best(turn, state, deepest))


def _group(turn: Turn, parent: Node | None) -> tuple[str | None, int | None]:
    if turn.prompt_group_id:
        return turn.prompt_group_id, turn.prompt_group_size
    if len(turn.replies) > 1:
        return turn.event_id, len(turn.replies)
    if parent is not None:
        return parent.group_id, parent.group_size
    return None, None


def _assign(state: LinkState, turn: Turn, step_ids: list[str]) -> list[Assignment]:
    """One assignment per step: n > 1 choices of a start become trajectories ``<id>:<choice>``."""
    if turn.step_index is not None:  # an explicit position (service event): the join finds the parent
        group = _group(turn, None)
        status = ROOT if turn.step_index == 0 else LINKED
        return [Assignment(turn.trajectory_id or f"traj-{turn.event_id}", turn.step_index, None, status,
                           None, *group)]
    place = _place(state, turn)
    anchor = place.parent or place.sibling
    if anchor is not None:
        node = state.nodes[anchor]
        parent = node if place.parent else state.nodes.get(node.parent_step_id or "")
        group = _group(turn, parent)
        trajectory = node.trajectory_id
        parent_id: str | None
        if place.parent:
            index, parent_id = node.step_index + 1, anchor
        else:
            index, parent_id = node.step_index, node.parent_step_id
        if len(step_ids) == 1:
            status = ROOT if index == 0 else LINKED
            return [Assignment(trajectory, index, parent_id, status, None, *group)]
        return [Assignment(f"{trajectory}:{i}", index, parent_id, LINKED if index else ROOT, None, *group)
                for i in range(len(step_ids))]
    group = _group(turn, None)
    base = turn.trajectory_id or f"traj-{turn.event_id}"
    if len(step_ids) == 1:
        return [Assignment(base, 0, None, place.status, place.candidate, *group)]
    return [Assignment(f"{base}:{reply.index}", 0, None, place.status, place.candidate, *group)
            for reply in turn.replies]


def _record(state: LinkState, turn: Turn, step_ids: list[str], assignments: list[Assignment]) -> None:
    prompt = _prompt_digest(turn)
    replies = turn.replies if turn.replies else [None]
    for step_id, assignment, reply in zip(step_ids, assignments, replies, strict=True):
        tail = "" if turn.failed or reply is None else reply_digest(turn, reply.messages)[:_DIGEST_CHARS]
        state.nodes[step_id] = Node(
            assignment.trajectory_id, assignment.step_index, assignment.parent_step_id, prompt, tail,
            turn.created_at_ms, turn.connection, turn.trajectory_id, assignment.prompt_group_id,
            assignment.prompt_group_size, turn.engine_response_id if len(step_ids) > 1 else None)


def _expire(state: LinkState, horizon_ms: int, max_entries: int) -> None:
    oldest = state.clock_ms - horizon_ms
    for mapping in (state.nodes, state.assigned):
        stale = [k for k, v in mapping.items() if v.at_ms < oldest]
        excess = sorted(((v.at_ms, k) for k, v in mapping.items() if v.at_ms >= oldest))
        stale += [k for _, k in excess[: max(0, len(excess) - max_entries)]]
        for key in stale:
            del mapping[key]


def link_turn(state: LinkState, turn: Turn, horizon_ms: int, max_entries: int) -> Linked:
    """Assign ``turn`` and record it in ``state`` (mutated). A redelivered turn gets its first result."""
    known = state.assigned.get(turn.event_id)
    if known is not None:
        return known
    if turn.created_at_ms < state.clock_ms - horizon_ms:
        raise InvalidEvent(f"event time {turn.created_at_ms} is older than the linking horizon ({horizon_ms} "
                           f"ms before {state.clock_ms}); its first assignment may have expired")
    step_ids = step_ids_of(turn)
    assignments = _assign(state, turn, step_ids)
    slot = _slot(state, assignments[0]) if turn.step_index is None else {}
    superseded: list[tuple[str, str]] = []
    if any(n.continued for n in slot.values()):
        # A retry of a step the trajectory already went on from: thrown away from the start.
        assignments = [replace(a, link_status=SUPERSEDED) for a in assignments]
    else:
        # A retry: the agent asked again, so it threw the earlier answers at this slot away.
        for node in slot.values():
            node.superseded = True
        superseded = sorted((s, n.trajectory_id) for s, n in slot.items())
    parent_id = assignments[0].parent_step_id
    parent = state.nodes.get(parent_id or "")
    continued = None
    if parent is not None and parent_id is not None:
        parent.continued = True
        if parent.response_id:
            continued = Continued(parent.response_id, parent.trajectory_id, parent_id, parent.at_ms)
    _record(state, turn, step_ids, assignments)
    if assignments[0].link_status == SUPERSEDED:
        for step_id in step_ids:
            state.nodes[step_id].superseded = True
    linked = Linked(assignments, superseded, continued, turn.created_at_ms)
    state.assigned[turn.event_id] = linked
    state.clock_ms = max(state.clock_ms, turn.created_at_ms)
    _expire(state, horizon_ms, max_entries)
    return linked


def _slot(state: LinkState, assignment: Assignment) -> dict[str, Node]:
    """The live steps already at the assignment's trajectory and index (a retry shares their slot)."""
    return {s: n for s, n in state.nodes.items() if n.trajectory_id == assignment.trajectory_id
            and n.step_index == assignment.step_index and not n.superseded}
