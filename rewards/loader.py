"""Load a reward function by ``module:function`` and normalize what it returns.

Reward functions come from users (the seed system's ``CLAWR1_REWARD_FN`` contract): they are called with
keyword arguments and return either a float or a dict with ``score`` plus extra info. Everything that
calls one goes through :func:`compute_reward`, so the return contract is checked in one place and a bad
return is a clear :class:`RewardFnError` instead of a wrong number downstream.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

RewardFn = Callable[..., Any]


class RewardFnError(Exception):
    """A reward function could not be loaded, raised, or returned something that is not a reward."""


@dataclass(frozen=True)
class RewardResult:
    """One scored sample: the scalar reward and whatever extra info the function reported."""

    score: float
    extra: dict[str, Any] = field(default_factory=dict)


def load_reward_fn(spec: str) -> RewardFn:
    """Import ``module:function`` (the function may be a dotted attribute path) and return it."""
    module_name, sep, attr_path = spec.strip().partition(":")
    if not sep or not module_name or not attr_path:
        raise RewardFnError(f"reward function spec {spec!r} must look like 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardFnError(f"reward function {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise RewardFnError(
                f"reward function {spec!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if not callable(target):
        raise RewardFnError(f"reward function {spec!r} is a {type(target).__name__}, not a callable")
    fn: Callable[..., Any] = target
    return fn


def _as_score(value: Any, *, origin: str) -> float:
    # bool is an int subclass; a True/False "reward" is almost always a bug in the function.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardFnError(f"{origin} must be a number, got {type(value).__name__}: {value!r}")
    score = float(value)
    if not math.isfinite(score):
        raise RewardFnError(f"{origin} must be finite, got {score!r}")
    return score


def compute_reward(fn: RewardFn, **fields: Any) -> RewardResult:
    """Call ``fn(**fields)`` and normalize its return to a :class:`RewardResult`.

    A float (or int) is the score; a mapping must hold a numeric ``score`` and its other keys become
    ``extra`` (a nested ``extra``/``reward_extra_info`` mapping is merged in). An exception inside the
    function is re-raised as :class:`RewardFnError` with the original as its cause.
    """
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        value = fn(**fields)
    except Exception as exc:
        raise RewardFnError(f"reward function {name} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(value, Mapping):
        if "score" not in value:
            keys = sorted(str(key) for key in value)
            raise RewardFnError(f"reward function {name} returned a dict without 'score': keys {keys}")
        extra: dict[str, Any] = {}
        for key, item in value.items():
            if key == "score":
                continue
            if key in ("extra", "reward_extra_info") and isinstance(item, Mapping):
                extra.update(item)
            else:
                extra[str(key)] = item
        return RewardResult(score=_as_score(value["score"], origin=f"{name}()['score']"), extra=extra)
    return RewardResult(score=_as_score(value, origin=f"{name}() return"))
