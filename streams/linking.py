"""Trajectory linking of turns: a bijection between calls and trajectories, or an explicit flag.

A turn continues an earlier step when its messages start with that step's prompt plus its reply
(compared canonically, ``clawr1.core.conversation``). Several steps can have the same prompt plus
reply: k GRPO rollouts of one task whose first actions are identical. Their states are identical,
so any one-to-one assignment is correct, and the linker keeps it one-to-one: a continuation goes
to a matching step that has not been continued yet (preferring a live step to a superseded one,
then the newest, then the one whose call came on the same client connection: ``_preference``),
never to one already continued. While such a free step
waits, the turn is never taken for a retry: rollout workers share one client, so a connection
says nothing about which rollout a call belongs to.

When every matching step has already been continued, the turn repeats the prompt of a step that
is there already (a sibling: same parent, same prompt): counting says it is a retry. It joins the
slot (trajectory and index) of the one sibling whose rollout has not gone on yet, and the earlier
call there is presumed thrown away (``superseded``); with several such slots no signal says
whose retry it is, and the turn starts a trajectory of its own flagged ``ambiguous`` (an *extra*:
it holds no rollout's slot). A retry of a step every rollout already went on from is
``superseded`` itself; a repeat with another prompt is a branch, ``ambiguous``.

Supersession follows the evidence and is revisited: when a turn continues a step, the other
uncontinued steps of that step's slot are superseded (its rollout went on without them); a
superseded step that a later turn continues is revived (``unsuperseded``), unless its slot
already went on with another step (a revival would fork the trajectory). Extras are settled by
counting: once as many steps with their prompt have been continued as there are rollout slots
holding it, every rollout has gone on, and whatever is left is superseded. A failed call is never
a parent and never continues its parent: its slot stays open, and the next call that takes it
supersedes the failure (the retry the client sent).

A turn that extends a step's prompt but not its reply is ``ambiguous``; a turn that keeps only
the conversation's root prompt (system + task) and then goes on with content no step produced is
``compacted``. Both name the step they most likely continue (``candidate_step_id``). A turn
nothing matches is a ``root``.

An explicit trajectory id (X-Claw header, the compat port's path, a service event) wins: the
turn is matched only within that trajectory, a turn matching nothing there follows its latest
step, and a continuation of an already-continued step is a retry (the agent said so).

Prompt groups: with ``n > 1`` every choice is a rollout of its own trajectory
(``<trajectory>:<choice>``) in one prompt group of size n. A first call without hints (no
explicit trajectory or group) that carries the same prompt, model, tools and channel as an
earlier first call within ``group_window_ms`` of that group's first call joins its group, marked
*inferred* (size unknown; the group takes no rollout after ``closes_at_ms``); otherwise it starts
one named after its event id. Continuations inherit their parent's group.

State is one ``LinkState`` per raw.llm key (explicit trajectory or conversation root). It is
bounded by event-time age (``horizon_ms``, relative to the newest event of the key) and, as a
safety valve, by a count. A redelivered event gets its first assignment while that is within the
horizon; an unknown event older than the horizon is refused (its first assignment may have
expired), never silently relinked.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from clawr1.core import registry
from clawr1.core.conversation import prefix_digests
from clawr1.core.routing import trajectory_named_after
from clawr1.streams import state_codec
from clawr1.streams.turns import InvalidEvent, Turn

LINKED, ROOT, AMBIGUOUS, COMPACTED, SUPERSEDED = "linked", "root", "ambiguous", "compacted", "superseded"
EXPIRED = "expired"
DEFAULT_GROUP_WINDOW_MS = registry.STREAMS_GROUP_WINDOW_MS.default


class Group(NamedTuple):
    """A step's prompt group: given (hints, n > 1) or inferred (``inferred``; size unknown)."""

    group_id: str | None = None
    size: int | None = None
    inferred: bool = False
    closes_at_ms: int | None = None  # inferred: no rollout joins after this event time


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
    continued: bool = False  # a call that did not fail went on from this step
    superseded: bool = False
    group_inferred: bool = False
    group_closes_at_ms: int | None = None
    group_key: str = ""  # the first call of an inferred group's rollout: digest of what groups it
    extra_of: str = ""  # a retry on a trajectory of its own: the tail it hangs off (settled by counting)

    @property
    def slot(self) -> tuple[str, int]:
        return self.trajectory_id, self.step_index

    @property
    def group(self) -> Group:
        return Group(self.group_id, self.group_size, self.group_inferred, self.group_closes_at_ms)


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
    prompt_group_inferred: bool = False
    prompt_group_closes_at_ms: int | None = None


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
    # Superseded steps this turn continued, so revived: (step id, trajectory id).
    unsuperseded: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"assignments": [state_codec.encode(a) for a in self.assignments],
                "superseded": [list(s) for s in self.superseded],
                "continued": None if self.continued is None else state_codec.encode(self.continued),
                "at_ms": self.at_ms, "unsuperseded": [list(s) for s in self.unsuperseded]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Linked:
        continued = data["continued"]
        return cls([state_codec.decode(Assignment, a) for a in data["assignments"]],
                   [(s, t) for s, t in data["superseded"]],
                   None if continued is None else state_codec.decode(Continued, continued), data["at_ms"],
                   [(s, t) for s, t in data.get("unsuperseded", [])])


@dataclass
class LinkState:
    nodes: dict[str, Node] = field(default_factory=dict)  # step id -> node
    assigned: dict[str, Linked] = field(default_factory=dict)  # event id -> what linking decided
    clock_ms: int = 0  # newest event time seen: the horizon is measured from here

    def to_json(self) -> dict[str, Any]:
        """Parts by field name, defaults left out: the state is rewritten on every call of its key."""
        return {"nodes": {k: state_codec.encode(n) for k, n in self.nodes.items()},
                "assigned": {k: a.to_json() for k, a in self.assigned.items()}, "clock_ms": self.clock_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LinkState:
        if not data or "nodes" not in data:  # nothing, or the pre-bijection layout: start over
            return cls()
        return cls({k: state_codec.decode(Node, n) for k, n in data["nodes"].items()},
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
    prompt = turn.message_digests
    return [*prompt, *prefix_digests(reply_messages, prompt[-1] if prompt else None)][-1]


_DIGEST_CHARS = 32  # 128 bits: collisions within one key are out of reach, and the state stays small


def _digests(turn: Turn) -> list[str]:
    return [d[:_DIGEST_CHARS] for d in turn.message_digests]


def _prompt_digest(turn: Turn) -> str:
    digests = turn.message_digests
    return digests[-1][:_DIGEST_CHARS] if digests else ""


def _group_key(turn: Turn, prompt: str) -> str:
    """What rollouts of one prompt group share on their first call: prompt, model, tools, channel."""
    facts = [prompt, turn.model, turn.metadata.get("tools"), turn.channel]
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS]


def _preference(turn: Turn, step_id: str, node: Node) -> tuple[bool, int, bool, str]:
    """Among equally valid steps: a live one before a superseded one (reviving it is the last resort),
    then the newest (an identical step left by a rollout that ended long ago, the same prompt's previous
    epoch, is not the one a call made now goes on from), then the one from the same client connection."""
    same = bool(turn.connection) and node.connection == turn.connection
    return (node.superseded, -node.at_ms, not same, step_id)


def _best(turn: Turn, state: LinkState, step_ids: list[str]) -> str:
    return min(step_ids, key=lambda s: _preference(turn, s, state.nodes[s]))


@dataclass(frozen=True)
class _Place:
    """Where the turn goes before n > 1 splits it: a parent to follow, a retry slot, or a start."""

    status: str
    parent: str | None = None  # step to continue (linked)
    sibling: str | None = None  # step whose slot a retry shares
    candidate: str | None = None  # the likely parent of an ambiguous / compacted start
    extra_of: str = ""  # a retry whose slot no signal decides: the tail of the steps it may follow


def _place(state: LinkState, turn: Turn) -> _Place:
    """Where the turn goes: where its messages place it (``_place_by_messages``), except that a start
    (a trajectory of its own) takes the slot of a failed start with the same prompt instead: nothing can
    follow a failure, so its slot stays open for the retry."""
    place = _place_by_messages(state, turn)
    if place.parent or place.sibling or turn.trajectory_id is not None or len(turn.replies) > 1:
        return place
    prompt = _prompt_digest(turn)
    failed = [s for s, n in state.nodes.items() if not n.tail and not n.superseded and n.prompt == prompt
              and n.parent_step_id is None and n.step_index == 0]
    return replace(place, sibling=_best(turn, state, failed)) if failed else place


def _place_by_messages(state: LinkState, turn: Turn) -> _Place:
    """Where the turn's messages place it among the key's steps: after the step whose prompt and reply
    they continue, beside a sibling they repeat, or a start (root, ambiguous or compacted)."""
    scope = {s: n for s, n in state.nodes.items()
             if turn.trajectory_id is None or n.explicit == turn.trajectory_id}
    live = {s: n for s, n in scope.items() if not n.superseded}
    moved_on = {n.slot for n in scope.values() if n.continued}  # slots whose rollout went on
    # What a continuation can follow: live steps, and superseded ones whose slot has not gone on.
    parents = {s: n for s, n in scope.items() if n.tail and (not n.superseded or n.slot not in moved_on)}
    digests = _digests(turn)
    prompt = digests[-1] if digests else ""
    depth_of = {d: i for i, d in enumerate(digests)}
    # The deepest step whose prompt plus reply the turn starts with, and the deepest whose prompt only.
    tails = [(depth_of[n.tail], s) for s, n in parents.items() if n.tail in depth_of]
    extended = [(depth_of[n.prompt], s) for s, n in live.items()
                if n.prompt in depth_of and depth_of[n.prompt] < len(digests) - 1]
    tail_depth = max((i for i, _ in tails), default=-1)
    prompt_depth = max((i for i, _ in extended), default=-1)
    if tail_depth >= 0 and tail_depth >= prompt_depth:
        matching = [s for i, s in tails if i == tail_depth]
        # Free: no answer stands after it (a failed try, or one thrown away, leaves it open).
        answered = {n.parent_step_id for n in live.values() if n.tail}
        free = [s for s in matching if s not in answered]
        if free:  # another rollout's identical step may be waiting: never a retry then
            # A step whose only continuation with this prompt failed first: the client's retry goes there.
            retried = {n.parent_step_id for n in live.values() if not n.tail and n.prompt == prompt}
            return _Place(LINKED, parent=_best(turn, state, [s for s in free if s in retried] or free))
        children = [s for s, n in live.items() if n.parent_step_id in matching]
        siblings = [s for s in children if live[s].prompt == prompt]
        if turn.trajectory_id is not None and (siblings or children):
            return _Place(LINKED, sibling=_best(turn, state, siblings or children))
        return _all_taken(state, turn, matching, children, prompt, moved_on)
    # An unknown prompt (a span without its messages) is not evidence of a retry: it matches nothing.
    same_prompt = [s for s, n in live.items() if prompt and n.prompt == prompt]
    if turn.trajectory_id is not None:
        if same_prompt:
            return _Place(LINKED, sibling=_best(turn, state, same_prompt))
        if live:
            latest = max(live, key=lambda s: (live[s].step_index, live[s].at_ms, s))
            return _Place(LINKED, parent=latest)
        return _Place(ROOT)
    if prompt_depth < 0:
        return _Place(ROOT)  # a new conversation, or another rollout of a known first prompt
    deepest = [s for i, s in extended if i == prompt_depth]
    if all(live[s].step_index == 0 for s in deepest):
        # Only the task survives: a compacted context. Its likely parent is a trajectory's newest tip.
        roots = {live[s].trajectory_id for s in deepest}
        tips = [s for s, n in live.items() if n.trajectory_id in roots and not n.continued]
        return _Place(COMPACTED, candidate=max(tips or deepest, key=lambda s: (
            bool(turn.connection) and live[s].connection == turn.connection, live[s].at_ms, s)))
    return _Place(AMBIGUOUS, candidate=_best(turn, state, deepest))


def _all_taken(state: LinkState, turn: Turn, matching: list[str], children: list[str], prompt: str,
               moved_on: set[tuple[str, int]]) -> _Place:
    """Every step the turn could follow was continued. Counting decides where it can: each of those
    steps is one rollout, holding one slot (its continuations); a call beyond that is a retry. But a
    rollout's retry may have taken a waiting identical step (never a retry while one waits), and then
    it holds two slots with one prompt, one of them never to go on: where such a pair may be, the turn
    may be the displaced rollout's own call, and it starts a trajectory of its own, flagged (an extra,
    settled by counting in ``_went_on``). Otherwise a repeat of a sibling's prompt joins the one slot
    that has not gone on (the earlier answer there presumed thrown away), or is superseded itself when
    every slot went on; a call with another prompt is a branch."""
    nodes = state.nodes
    slot_prompt = {nodes[s].slot: nodes[s].prompt for s in children}
    shared = Counter(slot_prompt.values())
    doubtful = {slot for slot, p in slot_prompt.items() if slot not in moved_on and shared[p] > 1}
    siblings = [s for s in children if nodes[s].prompt == prompt]
    waiting = [s for s in siblings if nodes[s].slot not in moved_on]
    open_slots = {nodes[s].slot for s in waiting}
    if siblings and len(open_slots) <= 1 and doubtful <= open_slots:
        return _Place(LINKED, sibling=_best(turn, state, waiting or siblings))
    if not siblings and not doubtful:
        return _Place(AMBIGUOUS, candidate=_best(turn, state, matching))  # a branch
    # The candidate: the step after which the earliest answer still waits (a retry replaces an older one).
    doubts = waiting or [s for s in children if nodes[s].slot in doubtful]
    likely = min(doubts, key=lambda s: (nodes[s].at_ms, s))
    return _Place(AMBIGUOUS, candidate=nodes[likely].parent_step_id, extra_of=nodes[matching[0]].tail)


def _inferred_group(state: LinkState, turn: Turn, window_ms: int) -> tuple[Group, str]:
    """The open inferred group of the turn's first call (same prompt, model, tools, channel, within the
    window of the group's first call), or a new one named after the turn; and the key it is found by."""
    key = _group_key(turn, _prompt_digest(turn))
    open_groups = [n for n in state.nodes.values() if n.group_key == key
                   and n.group_closes_at_ms is not None and turn.created_at_ms <= n.group_closes_at_ms]
    if open_groups:
        return max(open_groups, key=lambda n: (n.group_closes_at_ms or 0, n.group_id or "")).group, key
    return Group(turn.event_id, None, True, turn.created_at_ms + window_ms), key


def _group(turn: Turn, parent: Node | None) -> Group:
    if turn.prompt_group_id:
        return Group(turn.prompt_group_id, turn.prompt_group_size)
    if len(turn.replies) > 1:
        return Group(turn.event_id, len(turn.replies))
    if parent is not None:
        return parent.group
    return Group()


def _infers_group(turn: Turn, place: _Place, window_ms: int) -> bool:
    """A rollout's first call without hints: no explicit trajectory or group, one reply, not failed."""
    return (place.status == ROOT and window_ms > 0 and turn.trajectory_id is None and not turn.prompt_group_id
            and len(turn.replies) == 1 and not turn.failed)


def _assign(state: LinkState, turn: Turn, step_ids: list[str], place: _Place, group: Group | None
            ) -> list[Assignment]:
    """One assignment per step: n > 1 choices of a start become trajectories ``<id>:<choice>``."""
    if turn.step_index is not None:  # an explicit position (service event): the join finds the parent
        status = ROOT if turn.step_index == 0 else LINKED
        trajectory = turn.trajectory_id or trajectory_named_after(turn.event_id)
        return [Assignment(trajectory, turn.step_index, None, status, None, *_group(turn, None))]
    anchor = place.parent or place.sibling
    if anchor is not None:
        node = state.nodes[anchor]
        parent = node if place.parent else state.nodes.get(node.parent_step_id or "")
        group = group or _group(turn, parent)
        trajectory = node.trajectory_id
        parent_id: str | None
        if place.parent:
            index, parent_id = node.step_index + 1, anchor
        else:
            index, parent_id = node.step_index, node.parent_step_id
        if len(step_ids) == 1:
            status = place.status if place.status == AMBIGUOUS else ROOT if index == 0 else LINKED
            return [Assignment(trajectory, index, parent_id, status, place.candidate, *group)]
        return [Assignment(f"{trajectory}:{i}", index, parent_id, LINKED if index else ROOT, None, *group)
                for i in range(len(step_ids))]
    group = group or _group(turn, None)
    base = turn.trajectory_id or trajectory_named_after(turn.event_id)
    if len(step_ids) == 1:
        return [Assignment(base, 0, None, place.status, place.candidate, *group)]
    return [Assignment(f"{base}:{reply.index}", 0, None, place.status, place.candidate, *group)
            for reply in turn.replies]


def _record(state: LinkState, turn: Turn, step_ids: list[str], assignments: list[Assignment], extra_of: str,
            group_key: str) -> None:
    prompt = _prompt_digest(turn)
    replies = turn.replies if turn.replies else [None]
    for step_id, assignment, reply in zip(step_ids, assignments, replies, strict=True):
        tail = "" if turn.failed or reply is None else reply_digest(turn, reply.messages)[:_DIGEST_CHARS]
        state.nodes[step_id] = Node(
            assignment.trajectory_id, assignment.step_index, assignment.parent_step_id, prompt, tail,
            turn.created_at_ms, turn.connection, turn.trajectory_id, assignment.prompt_group_id,
            assignment.prompt_group_size, turn.engine_response_id if len(step_ids) > 1 else None,
            group_inferred=assignment.prompt_group_inferred,
            group_closes_at_ms=assignment.prompt_group_closes_at_ms, group_key=group_key, extra_of=extra_of)


def _hangs_off(state: LinkState, node: Node) -> str:
    """The tail a step follows: its parent's, or for an extra the tail of the steps it may follow."""
    parent = state.nodes.get(node.parent_step_id or "")
    return node.extra_of or (parent.tail if parent is not None else "")


def _went_on(state: LinkState, step_id: str) -> tuple[set[str], list[str]]:
    """A turn continued ``step_id``: it is revived if it was superseded, and the uncontinued steps of its
    slot are superseded (its rollout went on without them). Where extras hang off the same tail, every
    rollout that reached it holds a slot there (extras come only then): once as many of the tail's
    continuations went on as there are slots, whatever is left was thrown away. Returns (superseded,
    revived) step ids."""
    node = state.nodes[step_id]
    node.continued = True
    revived = [step_id] if node.superseded else []
    node.superseded = False
    open_ = {s: n for s, n in state.nodes.items() if not n.continued and not n.superseded}
    dropped = {s for s, n in open_.items() if n.slot == node.slot}
    tail = _hangs_off(state, node)
    if tail and any(n.extra_of == tail for n in state.nodes.values()):
        children = {s: n for s, n in state.nodes.items() if n.explicit == node.explicit
                    and _hangs_off(state, n) == tail}
        slots = {n.slot for n in children.values() if not n.extra_of}
        if sum(n.continued for n in children.values()) >= len(slots):
            dropped |= {s for s in children if s in open_}
    for dropped_id in dropped:
        state.nodes[dropped_id].superseded = True
    return dropped, revived


def _expire(state: LinkState, horizon_ms: int, max_entries: int) -> None:
    oldest = state.clock_ms - horizon_ms
    for mapping in (state.nodes, state.assigned):
        for key in [k for k, v in mapping.items() if v.at_ms < oldest]:
            del mapping[key]
        if len(mapping) > max_entries:  # sorted only then: this runs on every call of the key
            for _, key in sorted((v.at_ms, k) for k, v in mapping.items())[: len(mapping) - max_entries]:
                del mapping[key]


def _settle(state: LinkState, turn: Turn, place: _Place, assignments: list[Assignment]
            ) -> tuple[list[Assignment], set[str], list[str]]:
    """What placing the turn decides about the steps already there: the assignments (superseded from
    the start when the turn retries a slot whose rollout already went on), and the steps superseded
    and revived (``_went_on``). A turn that is not a failure also takes the place of one failed try of
    its prompt that stands on a trajectory of its own after the same steps (the client's retry)."""
    if turn.step_index is not None:
        return assignments, set(), []
    slot = _slot(state, assignments[0])
    if any(n.continued for n in slot.values()):
        # A retry of a step the trajectory already went on from: thrown away from the start.
        return [replace(a, link_status=SUPERSEDED) for a in assignments], set(), []
    # A retry: the agent asked again, so it threw the earlier answers at this slot away (a failed call
    # there included); revisited if one of them is continued after all.
    dropped, revived = set(slot), list[str]()
    parent = state.nodes.get(assignments[0].parent_step_id or "")
    if not turn.failed:
        if parent is not None:
            went, revived = _went_on(state, assignments[0].parent_step_id or "")
            dropped |= went
        tail = parent.tail if parent is not None else place.extra_of
        prompt = _prompt_digest(turn)
        tries = [s for s, n in state.nodes.items() if tail and n.extra_of == tail and n.prompt == prompt
                 and not n.tail and not n.superseded and s not in dropped]
        if tries:
            dropped.add(min(tries, key=lambda s: (state.nodes[s].at_ms, s)))
    for step_id in dropped:
        state.nodes[step_id].superseded = True
    return assignments, dropped, revived


def link_turn(state: LinkState, turn: Turn, horizon_ms: int, max_entries: int,
              group_window_ms: int = DEFAULT_GROUP_WINDOW_MS) -> Linked:
    """Assign ``turn`` and record it in ``state`` (mutated). A redelivered turn gets its first result.

    ``group_window_ms`` (``CLAWR1_STREAMS_GROUP_WINDOW_MS``): how long after a group's first call a first
    call with the same prompt still joins it; 0 infers no group."""
    known = state.assigned.get(turn.event_id)
    if known is not None:
        return known
    if turn.created_at_ms < state.clock_ms - horizon_ms:
        raise InvalidEvent(f"event time {turn.created_at_ms} is older than the linking horizon ({horizon_ms} "
                           f"ms before {state.clock_ms}); its first assignment may have expired")
    step_ids = step_ids_of(turn)
    place = _place(state, turn) if turn.step_index is None else _Place(LINKED)
    group, group_key = _inferred_group(state, turn, group_window_ms) \
        if _infers_group(turn, place, group_window_ms) else (None, "")
    assignments, dropped, revived = _settle(state, turn, place, _assign(state, turn, step_ids, place, group))
    parent_id = assignments[0].parent_step_id
    parent = state.nodes.get(parent_id or "")
    continued = None
    if parent is not None and parent_id is not None and parent.response_id:
        continued = Continued(parent.response_id, parent.trajectory_id, parent_id, parent.at_ms)
    _record(state, turn, step_ids, assignments, place.extra_of, group_key)
    if assignments[0].link_status == SUPERSEDED:
        for step_id in step_ids:
            state.nodes[step_id].superseded = True
    linked = Linked(assignments, sorted((s, state.nodes[s].trajectory_id) for s in dropped), continued,
                    turn.created_at_ms, [(s, state.nodes[s].trajectory_id) for s in revived])
    state.assigned[turn.event_id] = linked
    state.clock_ms = max(state.clock_ms, turn.created_at_ms)
    _expire(state, horizon_ms, max_entries)
    return linked


def after_expiry(state: LinkState, turn: Turn, linked: Linked) -> Linked:
    """``linked`` for a turn on a conversation whose link state had expired (CLAWR1_STREAMS_STATE_TTL_S):
    a turn that carries an earlier reply continued what expired, so its new trajectory says so
    (``expired``) instead of passing for a new conversation (``root``)."""
    if not any(m.get("role") == "assistant" for m in turn.messages):
        return linked
    flagged = replace(linked, assignments=[replace(a, link_status=EXPIRED) if a.link_status == ROOT else a
                                           for a in linked.assignments])
    state.assigned[turn.event_id] = flagged
    return flagged


def _slot(state: LinkState, assignment: Assignment) -> dict[str, Node]:
    """The live steps already at the assignment's trajectory and index (a retry shares their slot)."""
    slot = (assignment.trajectory_id, assignment.step_index)
    return {s: n for s, n in state.nodes.items() if n.slot == slot and not n.superseded}
