"""The analysts' snapshot of an engine path: active parts linked (the same files, no copy), other parts,
parts being written and pending mutations left out, the rest copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clawr1.pool.snapshot import link_snapshot

TABLE = Path("store/d05/d05ed021-4739-40d2-93a4-7d46ddf24f6d")


def part(root: Path, name: str) -> Path:
    folder = root / TABLE / name
    folder.mkdir(parents=True)
    for file in ("checksums.txt", "data.bin", "columns.txt"):
        (folder / file).write_text(f"{name}/{file}")
    return folder


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    (root / "metadata").mkdir(parents=True)
    (root / "metadata" / "pool.sql").write_text("ATTACH DATABASE _ UUID '3d0d' ENGINE = Atomic")
    (root / "metadata" / "pool").symlink_to("../store/3d0/3d0d")
    (root / "store" / "3d0" / "3d0d").mkdir(parents=True)
    (root / "store" / "3d0" / "3d0d" / "t.sql").write_text("ATTACH TABLE _ UUID 'd05e' (a UInt64)")
    (root / "data" / "pool").mkdir(parents=True)
    (root / "data" / "pool" / "t").symlink_to(f"../../{TABLE}")
    for name in ("all_1_1_0", "all_2_2_0", "all_1_2_1", "tmp_insert_all_3_3_0"):
        part(root, name)
    (root / TABLE / "format_version.txt").write_text("1")
    (root / TABLE / "mutation_4.txt").write_text("DELETE WHERE a = 1")
    (root / TABLE / "detached").mkdir()
    (root / "status").write_text("PID: 1")
    (root / "tmp").mkdir()
    return root


def test_active_parts_are_linked_and_the_rest_left_out(engine: Path, tmp_path: Path) -> None:
    target = tmp_path / "snapshot"
    active = [str(engine / TABLE / "all_1_2_1") + "/"]  # as system.parts writes a path
    assert link_snapshot(engine, target, active) == 1
    parts = sorted(p.name for p in (target / TABLE).iterdir() if p.is_dir())
    assert parts == ["all_1_2_1"]  # merged-away parts, a part being written, detached ones: out
    linked, source = target / TABLE / "all_1_2_1" / "data.bin", engine / TABLE / "all_1_2_1" / "data.bin"
    assert os.stat(linked).st_ino == os.stat(source).st_ino  # a hard link, not a copy
    assert (target / TABLE / "format_version.txt").read_text() == "1"
    assert not (target / TABLE / "mutation_4.txt").exists()
    assert os.stat(target / "store/3d0/3d0d/t.sql").st_ino != os.stat(engine / "store/3d0/3d0d/t.sql").st_ino
    assert os.readlink(target / "metadata" / "pool") == "../store/3d0/3d0d"
    assert os.readlink(target / "data" / "pool" / "t") == f"../../{TABLE}"
    assert not (target / "status").exists() and not (target / "tmp").exists()


def test_a_part_removed_meanwhile_is_left_out_whole(engine: Path, tmp_path: Path) -> None:
    gone = str(engine / TABLE / "all_9_9_0")  # listed active, then merged away and dropped before the copy
    assert link_snapshot(engine, tmp_path / "snapshot", [gone, str(engine / TABLE / "all_1_1_0")]) == 1
    assert not (tmp_path / "snapshot" / TABLE / "all_9_9_0").exists()


def test_a_part_that_cannot_be_linked_fails_the_snapshot(engine: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Another filesystem cannot hold hard links: a snapshot missing parts silently would be wrong."""
    def cross_device(_src: str, _dst: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    with pytest.raises(Exception, match="cross-device"):
        link_snapshot(engine, tmp_path / "snapshot", [str(engine / TABLE / "all_1_1_0")])
