"""Every namespace of the worker's state, with what it holds: the first bytes of each state key.

A key is ``<namespace>/<name>`` (``clawr1.streams.store``); the letters are what existing state was
written under, so they never change. A value too large for one key is kept in chunks named
``chunk_name(<name>, n)``.
"""

from __future__ import annotations

from enum import StrEnum

SEP = "\x1f"  # between a chunked value's name and its chunk number


class Namespace(StrEnum):
    # A home record (``clawr1.streams.home_record``) by the hash of a raw key: the link state of the raw
    # keys with that hash, and the trajectory while it is the link state's only one.
    HOME = "R"
    # The records (``clawr1.streams.trajectory_record``) of the other trajectories, by the hash of their id.
    TRAJECTORY = "T"
    # A trajectory's step facts, chunk by chunk (``<trajectory><SEP><n>``).
    CHUNK = "C"
    # The trajectory of a routable step id that a scan of ``HOME`` and ``TRAJECTORY`` under its hash
    # misses (a black-box call named by its conversation, other than the call that started it, when its
    # trajectory is not in the home record).
    STEP_INDEX = "S"
    # Link state by raw key, as workers kept it before home records: read, then moved into the home record.
    LEGACY_LINK = "L"
    # Feedback that reached a routable step id before its step.
    HELD = "H"
    # Index entries and held feedback of target ids that are not routable (``clawr1.streams.targets``).
    TARGET = "X"
    # A prompt group's record (``clawr1.streams.group_record``): its merge scope
    # (``clawr1.streams.scope_merger``) and its owner, by scope id.
    GROUP = "G"
    # A prompt group's token chunks (``<scope><SEP><n>``).
    GROUP_CHUNK = "GC"
    # The expiry wheel (``clawr1.streams.expiry``).
    WHEEL = "E"
    # Markers of what expired, by trajectory, conversation or scope (``clawr1.streams.expiring``).
    EXPIRED = "Z"


def chunk_name(name: str, n: int) -> str:
    """The name of chunk ``n`` of the chunked value ``name`` (in ``CHUNK`` or ``GROUP_CHUNK``)."""
    return f"{name}{SEP}{n}"
