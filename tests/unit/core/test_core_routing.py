"""Kafka's partitioner in Python, and ids that carry the partition of their step."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from clawr1.core import routing

# Kafka's own test vectors (clients/src/test/.../UtilsTest.java, testMurmur2), as unsigned ints.
KAFKA_VECTORS = {
    b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, bytes([97, 98, 99]): 479470107,
}


def test_murmur2_is_kafkas() -> None:
    for data, signed in KAFKA_VECTORS.items():
        assert routing.murmur2(data) == signed & 0xFFFFFFFF


@given(st.text(max_size=40), st.binary(max_size=16), st.integers(1, 64))
def test_a_routable_id_lands_with_its_home(home: str, seed: bytes, partitions: int) -> None:
    minted = routing.routable_id(home, seed)
    parsed = uuid.UUID(minted)
    assert parsed.version == 8 and parsed.variant == uuid.RFC_4122 and str(parsed) == minted
    assert routing.id_tag(minted) == routing.id_tag(f"{minted}:3") == routing.key_hash(home)
    home_part = routing.partition_of(home, partitions)
    assert routing.home_partition(f"traj-{minted}", partitions) == home_part
    assert routing.home_partition(f"traj-{minted}:1", partitions) == home_part
    assert routing.home_partition(minted, partitions) == home_part
    assert routing.routable_id(home, seed) == minted  # deterministic


def test_other_ids_are_not_routable_and_live_where_they_hash() -> None:
    for name in ("t1", "chatcmpl-42", str(uuid.uuid4()), str(uuid.uuid5(uuid.NAMESPACE_URL, "x")), "traj-c1"):
        assert routing.id_tag(name) is None and routing.trajectory_home(name) is None
        assert routing.home_partition(name, 7) == routing.partition_of(name, 7)
