"""Who may write to a trajectory or a prompt group: the source that created it.

A trajectory belongs to the source (``source_name``: the API key's name, or the capture proxy's
identity for calls it took without a key) of its first step. A later step from another source is not
joined: it becomes a dead letter saying ``not_owner``, kept whole, so nothing is lost and nothing of the
owner's changes. Feedback from another source counts only when it is ``privileged`` (sent with a key
of kind ``reward``, or ``curate`` for labels and notes, or by the stack's own reward worker); other
feedback is a dead letter the same way. Feedback that came before any step waits in the trajectory's
state and is held to the rule once its first step names the owner.

A prompt group (``prompt_group_id``: the rollouts of one prompt that GRPO compares) belongs the same
way to the source of the first step that named it, kept in the group's state in its partition. A step
of another source naming it does not join it: it joins a group of its own, ``own_group`` (the
group's id, ``@`` and its source), the same for each of that source's rollouts of it, so that source
still trains on whole groups of its own rollouts and the owner's group holds only the owner's. This is
what a GRPO trainer's user expects where trajectories get a dead letter instead: a step belongs to
its trajectory (its parent, its reward, its index mean nothing elsewhere) but only shares a prompt
with its group, and group ids are often the task's own id (``gsm8k-17``), which two keys training
on the same data name alike by right, and which a black-box call without hints takes from the
inferred group of the same prompt, model and tools, whoever sent it. Should that group of its own
already belong to yet another source (who named it on purpose), the step is a ``not_owner`` dead
letter, kept whole. A group's owner expires with its state (``clawr1.streams.scope_merger.claim``
says when): the first step naming it after that names the owner again, as a trajectory's does.

Keyless calls are all named ``anonymous`` (no key may take that name), so without keys a trajectory
takes steps and feedback from anyone, as it always did, and their steps go to their trajectory without
passing their group's owner. State written before owners were kept has none: the first step after
the upgrade names it, and feedback already joined stays.
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


def own_group(group_id: str, source: str) -> str:
    """The group a step of ``source`` joins instead of ``group_id``, which belongs to another source."""
    return f"{group_id}@{source}"


def group_refusal(step_id: str, source: str, named: tuple[str, str], own: tuple[str, str]) -> str:
    """A dead letter's reason: a step whose group, and the group of its own, belong to other sources
    (each given as (group id, owner))."""
    return (f"{NOT_OWNER}: step {step_id} from source {source!r} named prompt group {named[0]}, which "
            f"belongs to source {named[1]!r}, and its own group {own[0]} belongs to source {own[1]!r}: "
            "not joined")
