"""Where a key's data lives: Kafka's partitioner, and ids that say which partition holds their step.

Every producer hashes keys with Java's murmur2 (``partitioner=murmur2_random`` on confluent-kafka, the
Java client's default), so ``partition_of`` tells any role where a key lands without asking a broker.

Ids the stack mints for steps (white-box step ids at the gateway, black-box event ids at the proxy,
hence the trajectory ids the linker derives from them) are *routable*: RFC 9562 version-8 UUIDs whose
first 32 bits are ``murmur2`` of the key the step is partitioned by (its *home*: the trajectory id, or
the raw call's Kafka key). Feedback that names such an id reaches the step's partition from the id
alone, and there a trajectory keyed by the same hash holds the step: no index entry per step has to be
written, kept and replicated to resolve it. Ids that are not routable (an engine's response id, a step
id a service chose) are indexed as before (``clawr1.streams.targets``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as an unsigned 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length - whole
    if rest >= 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_of_hash(hashed: int, partitions: int) -> int:
    """Java's ``toPositive(murmur2(key)) % partitions``."""
    return (hashed & 0x7FFFFFFF) % partitions


@functools.lru_cache(maxsize=16384)
def _hash_of(key: str) -> int:
    """``murmur2`` of a text key, remembered: the worker hashes a trajectory's or a conversation's key
    several times per step, and murmur2 in Python costs more than the lookup (about 5 of 6 calls hit)."""
    return murmur2(key.encode())


def partition_of(key: str, partitions: int) -> int:
    """The partition a message keyed ``key`` lands in."""
    return partition_of_hash(_hash_of(key), partitions)


def key_hash(key: str) -> str:
    """``murmur2(key)`` as 8 hex digits: the tag a routable id carries, and a trajectory's state key."""
    return f"{_hash_of(key):08x}"


_UUID8 = r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_ROUTABLE_ID = re.compile(rf"({_UUID8})(?::\d+)?")
_ROUTABLE_TRAJECTORY = re.compile(rf"traj-({_UUID8})(?::\d+)?")


def routable_id(home: str, seed: bytes) -> str:
    """A version-8 UUID tagged with ``home``'s hash; the other 90 bits from ``seed`` (deterministic)."""
    digest = hashlib.sha256(seed).hexdigest()
    rest = f"{digest[:4]}8{digest[4:7]}{'89ab'[int(digest[7], 16) & 3]}{digest[8:11]}{digest[11:23]}"
    return f"{key_hash(home)}-{rest[:4]}-{rest[4:8]}-{rest[8:12]}-{rest[12:]}"


def id_tag(value: str) -> str | None:
    """The home hash a routable step id (``<uuid8>`` or ``<uuid8>:<choice>``) carries, else None."""
    match = _ROUTABLE_ID.fullmatch(value)
    return match.group(1)[:8] if match else None


def trajectory_named_after(call_id: str) -> str:
    """The id of the trajectory a call (or one choice of it, ``<id>:<n>``) starts when no trajectory id was
    given: named after it, so the call's own id finds it without an index."""
    return f"traj-{call_id}"


def trajectory_home(trajectory_id: str) -> str | None:
    """The home hash of a trajectory the linker named after a routable call (``traj-<uuid8>[:<n>]``)."""
    match = _ROUTABLE_TRAJECTORY.fullmatch(trajectory_id)
    return match.group(1)[:8] if match else None


@functools.lru_cache(maxsize=16384)
def home_hash(name: str) -> str:
    """The hash of where the state named ``name`` (a trajectory, a prompt group) lives: the call it was
    named after when the name says so (``traj-<uuid8>[:<n>]``, ``<uuid8>[:<n>]``: that call's raw key),
    else the name's own (an explicit trajectory id is the raw topics' key, so its steps arrive there)."""
    return trajectory_home(name) or id_tag(name) or key_hash(name)


def home_partition(name: str, partitions: int) -> int:
    """The partition of ``home_hash``: where the state named ``name`` lives."""
    return partition_of_hash(int(home_hash(name), 16), partitions)
