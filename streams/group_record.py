"""A prompt group's state in the worker (``Namespace.GROUP``, in the group's partition): its merge scope
(``clawr1.streams.prefix_scope``), where each merged step's tokens are, and its owner.

The owner is the source of the first step that named the group (``clawr1.streams.ownership``); it goes
with the rest of the record when the state expires. Records name their fields (``state_codec``); those
written before owners were kept (a plain dict of ``scope``, ``where``, ``chunks``, ``touched_ms``,
``after_expiry``, without ``"v"``) read as records without an owner: the next step names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clawr1.streams import state_codec


@dataclass
class GroupRecord:
    scope: dict[str, Any] | None = None  # ``ScopeState.to_json()``; None before the first merge
    where: dict[str, int] = field(default_factory=dict)  # step id -> the token chunk holding it
    chunks: int = 0  # token chunks written so far; the next one is numbered this
    touched_ms: int | None = None  # when a checkpoint last wrote it (``clawr1.streams.expiry``)
    # Started again after its earlier state expired: not merged into (the pool holds the tree of the
    # state that expired, which a new one would contradict).
    after_expiry: bool = False
    owner: str | None = None  # the source of the first step that named it; None in older state

    def to_json(self) -> dict[str, Any]:
        return {"v": state_codec.STATE_VERSION, **state_codec.encode(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> GroupRecord:
        return cls() if not data else state_codec.decode(cls, data)
