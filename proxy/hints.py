"""Trajectory hints an agent may send as ``X-Claw-*`` headers; they never reach the upstream.

Agents that can set headers name their trajectory, GRPO prompt group, policy version, agent, channel
(train | val) and the last call of an episode; everything else is inferred downstream from the
captured messages. With API keys configured, hints count only with a credential (``X-Claw-Key``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clawr1.core.ids import id_problem

TRAJECTORY = "x-claw-trajectory-id"
PROMPT_GROUP = "x-claw-prompt-group-id"
PROMPT_GROUP_SIZE = "x-claw-prompt-group-size"
POLICY_VERSION = "x-claw-policy-version"
AGENT = "x-claw-agent"
TERMINAL = "x-claw-terminal"
CHANNEL = "x-claw-channel"
# The agent's API key, the proxy credential hints need when keys are configured (clawr1.proxy.addons.hints).
KEY = "x-claw-key"
# The capture note of a call whose hints were ignored for want of that credential.
HINTS_IGNORED = ("X-Claw-* hints ignored: API keys are configured and the call carried no proxy "
                 "credential (X-Claw-Key with a key of kind steps, or the compat port's seal)")
HEADER_PREFIX = "x-claw-"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_CHANNEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class HintError(ValueError):
    """A hint header the agent sent is malformed; the message names the header and the value."""


@dataclass(frozen=True)
class Hints:
    trajectory_id: str | None = None
    prompt_group_id: str | None = None
    prompt_group_size: int | None = None
    policy_version: int | None = None
    agent: str | None = None
    terminal: bool = False
    channel: str = "train"
    # The API key that called through the compat port, when its seal is right (clawr1.core.relay_source).
    source_name: str | None = None


def _identifier(name: str, value: str | None) -> str | None:
    """An id as every way in takes one (``clawr1.core.ids``)."""
    if value is None:
        return None
    value = value.strip()
    problem = id_problem(value)
    if problem is not None:
        raise HintError(f"{name}: {problem}")
    return value


def _integer(name: str, value: str | None, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise HintError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum or number >= 2**63:
        raise HintError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def _flag(name: str, value: str | None) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    raise HintError(f"{name} must be true or false, got {value!r}")


def _channel(value: str | None) -> str:
    if value is None:
        return "train"
    if not _CHANNEL.fullmatch(value.strip()):
        raise HintError(f"X-Claw-Channel must be 1 to 64 letters, digits, '_', '.' or '-', got {value!r}")
    return value.strip()


def parse_hints(headers: Iterable[tuple[str, str]]) -> Hints:
    """Hints from request headers (names case-insensitive; the first value of a repeated header wins)."""
    found: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered.startswith(HEADER_PREFIX):
            found.setdefault(lowered, value)
    return Hints(
        trajectory_id=_identifier("X-Claw-Trajectory-Id", found.get(TRAJECTORY)),
        prompt_group_id=_identifier("X-Claw-Prompt-Group-Id", found.get(PROMPT_GROUP)),
        prompt_group_size=_integer("X-Claw-Prompt-Group-Size", found.get(PROMPT_GROUP_SIZE), 1),
        policy_version=_integer("X-Claw-Policy-Version", found.get(POLICY_VERSION), 0),
        agent=_identifier("X-Claw-Agent", found.get(AGENT)),
        terminal=_flag("X-Claw-Terminal", found.get(TERMINAL)),
        channel=_channel(found.get(CHANNEL)),
    )


def hint_header_names(headers: Iterable[str]) -> list[str]:
    """Every ``X-Claw-*`` header present, known or not: none of them is meant for the upstream."""
    return sorted({name for name in headers if name.lower().startswith(HEADER_PREFIX)})
