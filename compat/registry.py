"""Per-trajectory owners and registrations (channel, policy version, metadata), kept across restarts.

A trajectory belongs to the API key that first used it (``init_trajectory``, a registration, an agent
call, a submitted step or a completion): from then on that key alone may register it, call under its
base URL, submit its steps and complete it; another key is refused (``NotOwner``), so nobody continues,
relabels or scores someone else's episode. Without API keys every caller is the same one.

The seed keeps registrations in process memory, so a gateway restart silently turns a ``val``
trajectory into ``train`` steps of policy version 0. Here they live in a small SQLite file under the
data directory: an API restart in the middle of an episode keeps applying them. The file is bounded:
only the newest ``max_entries`` trajectories are kept (an episode older than that many newer ones is
long over; its id can then be claimed again).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from clawr1.compat.steps import Registration

_SCHEMA = """
CREATE TABLE IF NOT EXISTS registrations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    trajectory_id TEXT NOT NULL UNIQUE,
    channel TEXT NOT NULL,
    policy_version INTEGER,
    metadata_json TEXT,
    owner TEXT
)
"""


class NotOwner(PermissionError):
    """The trajectory belongs to another key."""

    def __init__(self, trajectory_id: str) -> None:
        super().__init__(f"trajectory {trajectory_id!r} belongs to another API key: only the key that "
                         "created it may register, continue or complete it")


class Registry:
    """One connection, used from the event loop's thread only; each call is a few indexed statements."""

    def __init__(self, path: Path, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(registrations)")}
        if "owner" not in columns:  # a file from before owners: their next use claims its trajectories
            self._db.execute("ALTER TABLE registrations ADD COLUMN owner TEXT")
        self._max_entries = max_entries

    def claim(self, trajectory_id: str, owner: str) -> Registration:
        """The trajectory's registration (the seed's defaults when it has none), making it ``owner``'s
        when nobody holds it; ``NotOwner`` when another key does."""
        row = self._db.execute(
            "SELECT owner, channel, policy_version, metadata_json FROM registrations WHERE trajectory_id = ?",
            (trajectory_id,)).fetchone()
        if row is None:
            self._store(trajectory_id, Registration(), owner)
            return Registration()
        holder, channel, policy_version, metadata = row
        if holder is None:
            with self._db:
                self._db.execute("UPDATE registrations SET owner = ? WHERE trajectory_id = ?",
                                 (owner, trajectory_id))
        elif holder != owner:
            raise NotOwner(trajectory_id)
        return Registration(channel, policy_version, None if metadata is None else json.loads(metadata))

    def register(self, trajectory_id: str, registration: Registration, owner: str) -> None:
        """Store (or replace: the newest registration wins) for its owner; ``NotOwner`` for another key."""
        self.claim(trajectory_id, owner)
        self._store(trajectory_id, registration, owner)

    def _store(self, trajectory_id: str, registration: Registration, owner: str) -> None:
        metadata = None if registration.metadata is None else json.dumps(registration.metadata)
        with self._db:
            self._db.execute("DELETE FROM registrations WHERE trajectory_id = ?", (trajectory_id,))
            cursor = self._db.execute(
                "INSERT INTO registrations (trajectory_id, channel, policy_version, metadata_json, owner) "
                "VALUES (?, ?, ?, ?, ?)",
                (trajectory_id, registration.channel, registration.policy_version, metadata, owner))
            self._db.execute("DELETE FROM registrations WHERE seq <= ?",
                             ((cursor.lastrowid or 0) - self._max_entries,))

    def close(self) -> None:
        self._db.close()
