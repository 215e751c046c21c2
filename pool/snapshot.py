"""A hard-link copy of the embedded pool's committed parts, for an engine in a process of its own.

chDB opens a data path in one process only, so analysts cannot get a process apart from ingest on the
pool's own path. A MergeTree part never changes once committed (merges and mutations write new parts and
drop the old ones later), so linking the files of the parts that were active at one moment gives a second
engine a consistent, read-only view of that moment for no copy of data: only the small metadata files are
copied. Parts not active then (being written, merged away, detached) are left out, and so are pending
mutations (the copy shows the data as the parts hold it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Collection
from pathlib import Path

# What of a chDB path the copy takes: table definitions, their named links, and the tables' data.
COPIED = ("metadata", "data", "store")
PART_MARK = "checksums.txt"


def link_snapshot(source: Path, target: Path, active_parts: Collection[str]) -> int:
    """Fill the new folder ``target`` from the engine path ``source``: parts whose paths are in
    ``active_parts`` (``system.parts.path``) are hard-linked, other parts skipped, every other file copied.
    Returns the number of parts linked. A part removed while it is linked (merged away and dropped since
    the list was taken) is left out whole."""
    wanted = {os.path.normpath(path) for path in active_parts}
    target.mkdir(parents=True)
    linked = 0
    for top in COPIED:
        if (source / top).is_dir():
            linked += _copy_folder(source / top, target / top, wanted)
    return linked


def remove_snapshot(target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)


def _copy_folder(source: Path, target: Path, wanted: set[str]) -> int:
    target.mkdir(exist_ok=True)
    linked = 0
    for entry in _entries(source):
        path, into = Path(entry.path), target / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(path), into)
        elif entry.is_dir():
            if os.path.normpath(path) in wanted:
                linked += _link_part(path, into)
            elif not _skipped_folder(path):
                linked += _copy_folder(path, into, wanted)
        elif not _skipped_file(entry.name):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile (its table dropped)
                shutil.copyfile(path, into)
    return linked


def _link_part(source: Path, target: Path) -> int:
    try:
        shutil.copytree(source, target, copy_function=os.link, symlinks=True)
    except (FileNotFoundError, shutil.Error):
        shutil.rmtree(target, ignore_errors=True)
        if source.exists():
            raise  # not a part merged away meanwhile: the copy cannot be made (another filesystem?)
        return 0
    return 1


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


def _skipped_folder(path: Path) -> bool:
    """A part that was not active, one being written or removed, or a detached one."""
    name = path.name
    return (name.startswith(("tmp_", "tmp-", "delete_tmp_", "deleting_")) or name == "detached"
            or (path / PART_MARK).exists())


def _skipped_file(name: str) -> bool:
    """Half-written files, and mutations the copy must not run (it shows the parts as they are)."""
    return name.endswith(".tmp") or name.startswith("mutation_")
