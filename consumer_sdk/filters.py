"""Curation filters: what a consumer group trains on, compiled to a SQL WHERE with bound parameters.

User values never enter SQL text: every clause names a ``{f_name:Type}`` placeholder that
ClickHouse binds server-side. Filters are plain data, so a preset is just their JSON.

Missing values never pass a bound: a step with no reward fails ``min_reward``, one with no
``policy_version`` fails ``min_policy_version`` and ``max_staleness``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime
from typing import Any

from clawr1.consumer_sdk.errors import InvalidFilter, UsageError

__all__ = ["Filters", "filter_sql", "to_epoch_ms"]

REWARD_STATUSES = frozenset({"pending", "final"})
SOURCE_KINDS = frozenset({"blackbox_agent", "whitebox_agent", "blackbox_service", "otel"})
TOKEN_PROVENANCES = frozenset({"engine", "retokenized", "none"})
CURATION_EXCLUDED_LABELS = ("excluded", "untrainable")
"""Curation labels that take a step out of every consumer's batches unless ``include_excluded``."""


def to_epoch_ms(value: datetime | int, what: str) -> int:
    """Epoch milliseconds from an aware datetime or an int; naive datetimes are refused (whose zone?)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise UsageError(f"{what}: give a timezone-aware datetime (e.g. tzinfo=timezone.utc)")
        return int(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UsageError(f"{what}: expected an aware datetime or epoch milliseconds, got {value!r}")


def _strings(name: str, value: Any, vocabulary: frozenset[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Iterable) or isinstance(items, Mapping):
        raise InvalidFilter(f"{name}: expected a string or a list of strings, got {value!r}")
    out = tuple(items)
    for item in out:
        if not isinstance(item, str) or not item:
            raise InvalidFilter(f"{name}: expected non-empty strings, got {item!r}")
        if vocabulary is not None and item not in vocabulary:
            raise InvalidFilter(f"{name}: {item!r} is not one of {sorted(vocabulary)}")
    return out


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidFilter(f"{name}: expected a number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, minimum: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFilter(f"{name}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidFilter(f"{name}: must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Filters:
    """Which steps a consumer receives. Every field narrows; the defaults deliver every ready step
    of the ``train`` channel.

    String-set fields accept one string or a list; an empty set means "any".
    """

    ready: bool | None = True
    """True: ready steps only (default); False: not-ready only; None: both."""
    reward_status: tuple[str, ...] = ()
    """'pending' and/or 'final'."""
    min_reward: float | None = None
    max_reward: float | None = None
    quality_labels: tuple[str, ...] = ()
    """The step must carry all of these labels."""
    exclude_quality_labels: tuple[str, ...] = ()
    """The step must carry none of these labels."""
    min_quality_score: float | None = None
    source_kind: tuple[str, ...] = ()
    """'blackbox_agent', 'whitebox_agent', 'blackbox_service', 'otel'."""
    source_name: tuple[str, ...] = ()
    token_provenance: tuple[str, ...] = ()
    """'engine' (exact ids from the serving engine), 'retokenized', 'none'."""
    since: datetime | int | None = None
    """Steps created at or after this (aware datetime or epoch ms; stored as epoch ms)."""
    until: datetime | int | None = None
    """Steps created before this (exclusive)."""
    min_policy_version: int | None = None
    max_staleness: int | None = None
    """Steps at most this many versions behind the version the trainer reports."""
    include_superseded: bool = False
    """Also retries the agent threw away (``link_status = 'superseded'``); they are never ready."""
    include_excluded: bool = False
    """Also steps a curator excluded or marked untrainable (a label in ``CURATION_EXCLUDED_LABELS``,
    written by the dashboard's curation as feedback): by default no trainer gets them."""
    channel: tuple[str, ...] = ("train",)
    """The data channel (the seed system's ``train`` / ``val``): one string or a list; None or [] for
    every channel. Steps default to ``train``, so consumers that never name a channel get what they
    always got."""

    def __post_init__(self) -> None:
        if self.ready is not None and not isinstance(self.ready, bool):
            raise InvalidFilter(f"ready: expected True, False or None, got {self.ready!r}")
        for flag in ("include_superseded", "include_excluded"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidFilter(f"{flag}: expected a bool, got {getattr(self, flag)!r}")
        norm: dict[str, Any] = {
            "reward_status": _strings("reward_status", self.reward_status, REWARD_STATUSES),
            "quality_labels": _strings("quality_labels", self.quality_labels, None),
            "exclude_quality_labels": _strings("exclude_quality_labels", self.exclude_quality_labels, None),
            "source_kind": _strings("source_kind", self.source_kind, SOURCE_KINDS),
            "source_name": _strings("source_name", self.source_name, None),
            "token_provenance": _strings("token_provenance", self.token_provenance, TOKEN_PROVENANCES),
            "channel": _strings("channel", self.channel, None),
            "min_reward": _number("min_reward", self.min_reward),
            "max_reward": _number("max_reward", self.max_reward),
            "min_quality_score": _number("min_quality_score", self.min_quality_score),
            "min_policy_version": _integer("min_policy_version", self.min_policy_version),
            "max_staleness": _integer("max_staleness", self.max_staleness, minimum=0),
        }
        for name in ("since", "until"):
            value = getattr(self, name)
            try:
                norm[name] = None if value is None else to_epoch_ms(value, name)
            except UsageError as exc:
                raise InvalidFilter(str(exc)) from None
        for key, value in norm.items():
            object.__setattr__(self, key, value)
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise InvalidFilter(f"min_reward {self.min_reward} > max_reward {self.max_reward}")
        since, until = norm["since"], norm["until"]  # epoch ms now
        if since is not None and until is not None and since >= until:
            raise InvalidFilter(f"since {self.since} must be before until {self.until}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Filters:
        """Build filters from keyword arguments, naming any unknown one."""
        return cls().merged(**kwargs)

    def merged(self, **overrides: Any) -> Filters:
        """These filters with ``overrides`` applied (how a preset is refined per consumer)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InvalidFilter(f"unknown filter(s) {unknown}; known: {sorted(known)}")
        return replace(self, **overrides)

    def to_json(self) -> str:
        """Only the fields that differ from the defaults, so presets survive new filters being added."""
        default = Filters()
        data = {k: v for k, v in asdict(self).items() if v != getattr(default, k)}
        plain = {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
        return json.dumps(plain, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Filters:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidFilter(f"stored filters are not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidFilter(f"stored filters must be a JSON object, got {type(data).__name__}")
        return cls.from_kwargs(**data)


def filter_sql(filters: Filters, current_policy_version: int | None) -> tuple[list[str], dict[str, Any]]:
    """WHERE clauses (to be AND-ed) over the ``steps`` view, and the parameters they bind.

    ``current_policy_version`` is what the trainer last reported; ``max_staleness`` needs it.
    """
    clauses: list[str] = []
    params: dict[str, Any] = {}

    def bind(name: str, sql_type: str, value: Any, template: str) -> None:
        params[f"f_{name}"] = value
        clauses.append(template.format(p=f"{{f_{name}:{sql_type}}}"))

    if filters.ready is not None:
        clauses.append("ready = 1" if filters.ready else "ready = 0")
    if not filters.include_superseded and filters.ready is not True:  # ready steps are never superseded
        clauses.append("link_status != 'superseded'")
    if not filters.include_excluded:
        clauses.append(f"NOT hasAny(quality_labels, {list(CURATION_EXCLUDED_LABELS)!r})")
    if filters.reward_status:
        bind("reward_status", "Array(String)", list(filters.reward_status), "reward_status IN {p}")
    if filters.min_reward is not None:
        bind("min_reward", "Float64", filters.min_reward, "reward >= {p}")
    if filters.max_reward is not None:
        bind("max_reward", "Float64", filters.max_reward, "reward <= {p}")
    if filters.quality_labels:
        bind("quality_labels", "Array(String)", list(filters.quality_labels), "hasAll(quality_labels, {p})")
    if filters.exclude_quality_labels:
        bind("exclude_quality_labels", "Array(String)", list(filters.exclude_quality_labels),
             "NOT hasAny(quality_labels, {p})")
    if filters.min_quality_score is not None:
        bind("min_quality_score", "Float64", filters.min_quality_score, "quality_score >= {p}")
    for name in ("source_kind", "source_name", "token_provenance", "channel"):
        values = getattr(filters, name)
        if values:
            bind(name, "Array(String)", list(values), f"{name} IN {{p}}")
    if filters.since is not None:
        bind("since", "Int64", filters.since, "created_at_ms >= fromUnixTimestamp64Milli({p}, 'UTC')")
    if filters.until is not None:
        bind("until", "Int64", filters.until, "created_at_ms < fromUnixTimestamp64Milli({p}, 'UTC')")
    if filters.min_policy_version is not None:
        bind("min_policy_version", "Int64", filters.min_policy_version, "policy_version >= {p}")
    if filters.max_staleness is not None:
        if current_policy_version is None:
            raise UsageError("max_staleness needs the trainer's current policy version: "
                             "call report_policy_version(v) first")
        bind("fresh_policy_version", "Int64", current_policy_version - filters.max_staleness,
             "policy_version >= {p}")
    return clauses, params
