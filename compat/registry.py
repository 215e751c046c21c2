"""Per-trajectory registrations (channel, policy version, metadata), kept across restarts.

The seed keeps them in process memory, so a gateway restart silently turns a ``val`` trajectory into
``train`` steps of policy version 0. Here they live in a small SQLite file under the data directory:
an API restart in the middle of an episode keeps applying them. The file is bounded: only the newest
``max_entries`` registrations are kept (an episode older than that many newer ones is long over).
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
    metadata_json TEXT
)
"""


class Registry:
    """One connection, used from the event loop's thread only; each call is one indexed statement."""

    def __init__(self, path: Path, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._max_entries = max_entries

    def register(self, trajectory_id: str, registration: Registration) -> None:
        """Store (or replace: the newest registration wins) and drop what falls beyond the bound."""
        metadata = None if registration.metadata is None else json.dumps(registration.metadata)
        with self._db:
            self._db.execute("DELETE FROM registrations WHERE trajectory_id = ?", (trajectory_id,))
            cursor = self._db.execute(
                "INSERT INTO registrations (trajectory_id, channel, policy_version, metadata_json) "
                "VALUES (?, ?, ?, ?)",
                (trajectory_id, registration.channel, registration.policy_version, metadata))
            self._db.execute("DELETE FROM registrations WHERE seq <= ?",
                             ((cursor.lastrowid or 0) - self._max_entries,))

    def get(self, trajectory_id: str) -> Registration:
        """The trajectory's registration; an unregistered one gets the seed's defaults."""
        row = self._db.execute(
            "SELECT channel, policy_version, metadata_json FROM registrations WHERE trajectory_id = ?",
            (trajectory_id,)).fetchone()
        if row is None:
            return Registration()
        channel, policy_version, metadata = row
        return Registration(channel, policy_version, None if metadata is None else json.loads(metadata))

    def forget(self, trajectory_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM registrations WHERE trajectory_id = ?", (trajectory_id,))

    def close(self) -> None:
        self._db.close()
