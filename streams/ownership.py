"""Who may write to a trajectory: the source that created it.

A trajectory belongs to the source (``source_name``: the API key's name, or the capture proxy's
identity for calls it took without a key) of its first step. A later step from another source is not
joined: it becomes a dead letter saying ``not_owner``, kept whole, so nothing is lost and nothing of the
owner's changes. Feedback from another source counts only when it is ``privileged`` (sent with a key
of kind ``reward``, or ``curate`` for labels and notes, or by the stack's own reward worker); other
feedback is a dead letter the same way. Feedback that came before any step waits in the trajectory's
state and is held to the rule once its first step names the owner.

Keyless calls are all named ``anonymous`` (no key may take that name), so without keys a trajectory
takes steps and feedback from anyone, as it always did. State written before owners were kept has
none: the first step after the upgrade names it, and feedback already joined stays.
"""

from __future__ import annotations

from typing import Any

from clawr1.gateway.auth import ANONYMOUS

NOT_OWNER = "not_owner"


def may_write(owner: str | None, source: str) -> bool:
    """Whether a step (or unprivileged feedback) from ``source`` may join a trajectory of ``owner``."""
    return owner is None or source == owner or ANONYMOUS in (owner, source)


def counts(owner: str | None, fact: dict[str, Any]) -> bool:
    """Whether a feedback fact may join a trajectory of ``owner``."""
    return bool(fact.get("privileged")) or may_write(owner, fact["source_name"])


def refusal(owner: str, source: str, what: str, trajectory_id: str) -> str:
    """A dead letter's reason: what was refused, and whose the trajectory is."""
    return (f"{NOT_OWNER}: {what} from source {source!r} for trajectory {trajectory_id}, which belongs to "
            f"source {owner!r}: not joined (feedback on another source's trajectory needs a key of kind "
            "reward; steps never join it)")
