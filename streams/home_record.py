"""A home's record: the link state of the raw keys hashing to it and, while that link state names a
single trajectory, the trajectory's record too.

A black-box agent's conversation is one raw key (its link state) and, usually, one trajectory named
after its first call, which lives in the same partition (``clawr1.core.routing.home_hash``). Kept under
one state key (``R/<hash>``), a call touches one key per checkpoint instead of two: one changelog
record. A key whose link state names several trajectories (GRPO rollouts sharing a prompt, retries on
a trajectory of their own, branches) keeps each trajectory in a record of its own (``T/<hash of its
id>``), as white-box trajectories are, so no record ever carries many trajectories' tails; a
trajectory moves out of the home record the checkpoint its link state names a second one.

Feedback naming a routable step id finds the step by scanning the records kept under the id's hash
(``R`` and ``T``), or by an ``S`` index entry. A step needs that entry only where the scan would miss
it, and where the scan looks depends on where the trajectory is kept, so ``index_entries`` decides when
a checkpoint knows that (its flush).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from clawr1.core.routing import (
    home_hash,
    home_partition,
    id_tag,
    key_hash,
    partition_of,
    trajectory_named_after,
)
from clawr1.streams import state_codec

# {"l": raw key -> link state, "t": trajectory id -> record, "touched_ms": when a checkpoint last wrote
# it (``clawr1.streams.expiry``), "v": ``state_codec.STATE_VERSION``}
HomeRecord = dict[str, Any]


class Home(NamedTuple):
    """Where a home record is kept: its partition, and the hash that names it in ``Namespace.HOME``."""

    partition: int
    hash: str

    @classmethod
    def of_raw_key(cls, key: str, partitions: int) -> Home:
        """The home of a raw key's link state."""
        return cls(partition_of(key, partitions), key_hash(key))

    @classmethod
    def of_trajectory(cls, trajectory_id: str, partitions: int) -> Home:
        """The home a trajectory is kept in while its link state names it alone (a black-box call's
        trajectory hashes as its conversation does, ``clawr1.core.routing.home_hash``)."""
        return cls(home_partition(trajectory_id, partitions), home_hash(trajectory_id))


def empty() -> HomeRecord:
    return {"l": {}, "t": {}, "v": state_codec.STATE_VERSION}


def sole_trajectory(record: HomeRecord) -> str | None:
    """The one trajectory the record's link states name (their nodes' first field), if just one."""
    named = {node["trajectory_id"] if isinstance(node, dict) else node[0]  # by name, or a version-1 list
             for link in record["l"].values() for node in link["nodes"].values()}
    return named.pop() if len(named) == 1 else None


def index_entries(trajectory_id: str, step_ids: Iterable[str], kept_under: str,
                  found_under: str | None) -> list[str]:
    """Steps that need an ``S`` entry now that the trajectory is kept under hash ``kept_under``: the
    routable ids a scan there misses, other than the trajectory's namesake, that were found before (a
    scan under ``found_under``, where it was kept; None for steps not yet indexed at all)."""
    wanted = []
    for step_id in step_ids:
        tag = id_tag(step_id)
        if tag is None or tag == kept_under or trajectory_id == trajectory_named_after(step_id):
            continue
        if found_under is None or tag == found_under:
            wanted.append(step_id)
    return wanted
