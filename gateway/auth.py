"""API keys: who is calling (the source name recorded on every event) and which routes they may use.

``CLAWR1_API_KEYS`` holds comma-separated entries ``name:key`` or ``name:key:kind1|kind2``, or
``@/path/to/file`` with one entry per line (``#`` comments allowed). Kinds (``KINDS``):

- ``steps``, ``feedback``, ``events``: submit to the ingest route of that name; what a key submits
  belongs to it, and steps or feedback for a trajectory another source created are not joined
  (``clawr1.streams.ownership``);
- ``reward``: feedback on any trajectory, whoever created it (reward services, reward models);
- ``read``: analyst SQL and the dashboard's data;
- ``consume``: the consumer SDK: SQL plus writing its own groups' commits and positions and its own
  presets (``owns_group``: ``<key name>`` or ``<key name>:...``);
- ``curate``: the dashboard's curation writes (labels, exclusions, notes as feedback), and labels and
  notes through ``/v1/feedback``, on any step;
- ``operate``: the capture proxy's engine routes (``/v1/engines``, drain and resume around a weight
  update), served on its reverse port (``clawr1.proxy.addons.engines``), not by the API.

An entry without kinds gets the ingest kinds only: reading or moving the pool is always granted by
name. ``ROUTE_KINDS`` is the route x kind matrix; a mounted route missing from it is refused to
every key. The source name always comes from the key, never from the request body. Keys are compared with
``hmac.compare_digest`` against every configured key, so timing reveals neither a key nor which
one matched. Error messages name entries by position, never by their secret.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

INGEST_KINDS = frozenset({"steps", "feedback", "events"})
REWARD = "reward"
CURATE = "curate"
KINDS = INGEST_KINDS | {REWARD, "read", "consume", CURATE, "operate"}
ANONYMOUS = "anonymous"

ROUTE_KINDS: dict[str, frozenset[str]] = {
    "/v1/steps": frozenset({"steps"}),
    # Labels need ``curate`` and other feedback ``feedback`` or ``reward`` (``feedback_standing``).
    "/v1/feedback": frozenset({"feedback", REWARD, CURATE}),
    "/v1/events": frozenset({"events"}),
    # OTLP/HTTP (gateway/otlp/): GenAI spans become service turn events, so they take an events key.
    "/v1/traces": frozenset({"events"}),
    "/v1/logs": frozenset({"events"}),
    "/v1/sql": frozenset({"read", "consume"}),
    "/v1/pool/insert/{table}": frozenset({"consume"}),
    "/v1/dashboard/summary": frozenset({"read"}),
    "/v1/dashboard/steps": frozenset({"read"}),
    "/v1/dashboard/steps/{step_id}": frozenset({"read"}),
    "/v1/dashboard/trajectories/{trajectory_id}": frozenset({"read"}),
    "/v1/dashboard/prompt-groups/{prompt_group_id}": frozenset({"read"}),
    "/v1/dashboard/preview": frozenset({"read"}),
    "/v1/dashboard/tree": frozenset({"read"}),
    "/v1/dashboard/live": frozenset({"read"}),
    "/v1/dashboard/curate": frozenset({"curate"}),
    # Prometheus metrics of the API process (gateway/metrics.py): traffic and pool sizes, read-only.
    "/metrics": frozenset({"read"}),
    # The compat port (compat/app.py): a route needs the kind of what it ends up writing. Agent calls
    # and registrations become captured steps, completion a trajectory reward; reward computation
    # serves both rollout workers and reward producers.
    "/init_trajectory": frozenset({"steps"}),
    "/{trajectory_uid}/{prompt_uid}/v1/register_trajectory": frozenset({"steps"}),
    **{f"/{{trajectory_uid}}/{{prompt_uid}}/v1/{api}": frozenset({"steps"})
       for api in ("chat/completions", "completions", "responses", "messages")},
    "/{trajectory_uid}/{prompt_uid}/v1/complete_trajectory": frozenset({"feedback"}),
    "/submit_steps": frozenset({"steps"}),
    "/generate": frozenset({"steps"}),
    "/compute_reward": frozenset({"steps", "feedback"}),
}
"""Which kinds may call each keyed route (by its path template, as in /openapi.json); docs/security.md
shows the matrix."""


class ApiKeyError(ValueError):
    """The key configuration is malformed; the message says which entry and why."""


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str
    kinds: frozenset[str] = INGEST_KINDS

    def owns_group(self, group: str) -> bool:
        """A consume key writes the offsets, positions and presets of the groups named after it
        (``<name>`` or ``<name>:<anything>``) and no others: two trainers cannot move each other.
        Key names never hold ``:``, so no name's groups fall inside another's."""
        return group == self.name or group.startswith(f"{self.name}:")

    def __repr__(self) -> str:
        return f"ApiKey(name={self.name!r}, kinds={sorted(self.kinds)})"


@dataclass(frozen=True)
class KeyRing:
    keys: tuple[ApiKey, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def identify(self, presented: str) -> ApiKey | None:
        """The key matching ``presented``, comparing fixed-length digests against all keys without an
        early exit, so neither the length nor the position of a key shows in the timing."""
        given = _digest(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(_digest(key.secret), given):
                found = key
        return found


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def parse_entry(entry: str, where: str) -> ApiKey:
    parts = entry.split(":")
    if len(parts) not in (2, 3):
        raise ApiKeyError(f"{where}: expected name:key or name:key:kind1|kind2")
    name, secret = parts[0].strip(), parts[1].strip()
    if not name:
        raise ApiKeyError(f"{where}: empty name")
    if name == ANONYMOUS:
        raise ApiKeyError(f"{where}: the name {ANONYMOUS!r} is the source of keyless calls; choose another")
    if not secret:
        raise ApiKeyError(f"{where} ({name}): empty key")
    if len(parts) == 2:
        return ApiKey(name, secret)  # ingest kinds only: reads and pool writes are granted by name
    kinds = frozenset(k.strip() for k in parts[2].split("|") if k.strip())
    unknown = kinds - KINDS
    if not kinds or unknown:
        raise ApiKeyError(f"{where} ({name}): kinds must be among {'|'.join(sorted(KINDS))}, "
                          f"got {parts[2].strip()!r}")
    return ApiKey(name, secret, kinds)


class FeedbackRefused(ValueError):
    """The key may not send this feedback; the message says which kind it needs."""


def feedback_standing(kinds: frozenset[str], *, labelled: bool, curation_only: bool) -> bool:
    """Whether feedback from a key of ``kinds`` counts on a trajectory another source created (the
    record's ``privileged``), or ``FeedbackRefused``. Labels (quality labels, ``excluded``,
    ``untrainable``) need ``curate``; anything beyond labels and comments (a reward, components, a
    correction, ``terminal``) needs ``feedback`` or ``reward``. ``reward`` counts everywhere, ``curate``
    for labels and comments; a plain ``feedback`` key only on its own trajectories."""
    if labelled and CURATE not in kinds:
        raise FeedbackRefused("a label (a quality label, an exclusion) needs a key of kind curate")
    if not curation_only and not kinds & {"feedback", REWARD}:
        raise FeedbackRefused("a reward, components, a correction or terminal need a key of kind "
                              "feedback or reward")
    return REWARD in kinds or (curation_only and CURATE in kinds)


def _entries(spec: str) -> Iterable[tuple[str, str]]:
    for position, item in enumerate(spec.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        if not item.startswith("@"):
            yield item, f"CLAWR1_API_KEYS entry {position}"
            continue
        path = Path(item[1:]).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ApiKeyError(f"cannot read API key file {path}: {exc.strerror}") from exc
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if line and not line.startswith("#"):
                yield line, f"{path}:{number}"


def parse_api_keys(spec: str) -> KeyRing:
    keys: list[ApiKey] = []
    seen: dict[str, str] = {}
    for entry, where in _entries(spec):
        key = parse_entry(entry, where)
        if key.secret in seen:
            raise ApiKeyError(f"{where} ({key.name}): the same key is already given to {seen[key.secret]!r}")
        seen[key.secret] = key.name
        keys.append(key)
    return KeyRing(tuple(keys))
