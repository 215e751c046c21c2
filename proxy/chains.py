"""Responses-API ``previous_response_id`` chains: the full prompt of a call that names its parent.

An agent may continue a response by id instead of echoing its history; the engine then holds the
conversation. The proxy saw every call of the chain, so it rebuilds what the model saw: the parent's
effective input and output, then this call's input (``instructions`` are per call, as the API says).
The call is then stored and keyed like one that echoed its history, so the streams link it to its
parent by content like any other continuation.

Each captured response keeps only its own part (input and output) and its parent's id, in a bounded
map (least recently used out): a chain costs memory linear in its length. Records are built on the
emitter's one thread, in capture order, so a parent is known before its continuation. A parent this
proxy never saw (a restart, another proxy instance, or evicted) leaves the call with its own input
only and a capture note saying so: flagged, never a silently shortened prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import LRUCache

from clawr1.proxy.apis.base import Json
from clawr1.proxy.apis.openai_responses import request_messages

# Opens the note of a call whose parent response this proxy does not know.
UNKNOWN_PARENT_NOTE = "previous_response_id unknown to this proxy"


@dataclass(frozen=True)
class _Link:
    parent: str | None
    messages: list[Json]  # this call's own input (without instructions) and its output


class ResponseChains:
    """response id -> its own part of the conversation; used from one thread."""

    def __init__(self, max_entries: int = 20_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        self._links: LRUCache[str, _Link] = LRUCache(max_entries)

    def prompt(self, request: Json, notes: list[str]) -> list[Json]:
        """The call's effective conversation: its instructions, the history of the chain it continues
        (when it names one this proxy knows; else a note) and its own input."""
        instructions = request_messages({"instructions": request.get("instructions")})
        own = request_messages({**request, "instructions": None})
        parent = _parent(request)
        if parent is None:
            return [*instructions, *own]
        history = self._history(parent)
        if history is None:
            notes.append(f"{UNKNOWN_PARENT_NOTE}: {parent} (a restart, another proxy instance or evicted); "
                         "the prompt is only this call's input")
            return [*instructions, *own]
        notes.append(f"previous_response_id {parent}: the prompt holds the chain's {len(history)} "
                     "earlier messages")
        return [*instructions, *history, *own]

    def record(self, request: Json, response_id: str, reply: list[Json]) -> None:
        """Remember a completed call's own part (input and output) under its response id."""
        own = request_messages({**request, "instructions": None})
        self._links[response_id] = _Link(_parent(request), [*own, *reply])

    def _history(self, response_id: str) -> list[Json] | None:
        """The conversation up to and including ``response_id``'s output; None when any link of the
        chain is unknown."""
        parts: list[list[Json]] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current is not None:
            link = self._links.get(current)  # a use: an active chain keeps its ancestors
            if link is None or current in seen:
                return None
            seen.add(current)
            parts.append(link.messages)
            current = link.parent
        return [message for part in reversed(parts) for message in part]


def _parent(request: Json) -> str | None:
    parent = request.get("previous_response_id")
    return parent if isinstance(parent, str) and parent else None
