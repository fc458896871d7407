"""Pending bookings: the dispatcher's own note of "sent a job of N bytes to host H at time T".

For ``pending_window`` seconds after sending, before the job's booking shows up in that host's ledger,
the dispatcher subtracts it itself, so two dispatches a second apart cannot both squeeze into the same
free space. Kept in its own small SQLite file next to the ledger (private, like all state).
"""

from __future__ import annotations

import os
import sqlite3
import time

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL,
    label TEXT NOT NULL,
    size INTEGER NOT NULL,
    sent REAL NOT NULL
);
"""


class Pending:
    def __init__(self, state_dir: str) -> None:
        from dispatch.trust import private_dir

        private_dir(state_dir, fix="set state_dir to a directory of your own")
        path = os.path.join(state_dir, "pending.sqlite3")
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self.db.executescript(SCHEMA)

    def add(self, host: str, label: str, size: int) -> int:
        cur = self.db.execute("INSERT INTO pending (host, label, size, sent) VALUES (?, ?, ?, ?)",
                              (host, label, size, time.time()))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def active(self, window: float) -> dict[str, int]:
        """Bytes sent per host within the last ``window`` seconds (older notes are dropped)."""
        cutoff = time.time() - window
        self.db.execute("DELETE FROM pending WHERE sent < ?", (cutoff,))
        rows = self.db.execute("SELECT host, SUM(size) FROM pending WHERE sent >= ? GROUP BY host",
                               (cutoff,)).fetchall()
        return {host: int(total) for host, total in rows}

    def close(self) -> None:
        self.db.close()
