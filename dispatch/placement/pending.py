"""Pending bookings: the dispatcher's own note of "sent a job of N bytes (and V bytes of VRAM) to host
H at time T".

Every run sent to a host (``--auto``, ``--peer``) records one. For ``pending_window`` seconds after
sending, before the job's booking shows up in that host's ledger, the dispatcher subtracts it itself,
so two dispatches a second apart cannot both squeeze into the same free space. A note goes earlier
when that host's report shows the job's booking (it is counted there then), when the run that
recorded it ends, or when the hostrun that recorded it is gone (SIGKILLed: its pid and start time
are kept with the note). Kept in its own small SQLite file next to the ledger (private, like all
state).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable

from dispatch.hosts.judgement import HostPending

MYPY = False
if MYPY:
    from dispatch.core.reportshape import Report

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL,
    label TEXT NOT NULL,
    size INTEGER NOT NULL,
    sent REAL NOT NULL,
    gpu_bytes INTEGER,
    gpu_index INTEGER,
    pid INTEGER,
    pid_start INTEGER
);
"""
# Columns added since the first version (a file from then gets them on open).
ADDED_COLUMNS = (("gpu_bytes", "INTEGER"), ("gpu_index", "INTEGER"), ("pid", "INTEGER"),
                 ("pid_start", "INTEGER"))

SEEN_SLACK = 2.0  # seconds: a booking this much older than the note may still be the job's (clocks)


class Pending:
    def __init__(self, state_dir: str) -> None:
        from dispatch.guards.trust import private_dir

        private_dir(state_dir, fix="set state_dir to a directory of your own")
        path = os.path.join(state_dir, "pending.sqlite3")
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self.db.executescript(SCHEMA)
        have = {row[1] for row in self.db.execute("PRAGMA table_info(pending)")}
        for name, kind in ADDED_COLUMNS:
            if name not in have:
                try:
                    self.db.execute(f"ALTER TABLE pending ADD COLUMN {name} {kind}")
                except sqlite3.OperationalError:  # another process added it meanwhile
                    pass

    def add(self, host: str, label: str, size: int, gpu_bytes: int | None = None,
            gpu_index: int | None = None) -> int:
        from dispatch.core.procinfo import start_time

        me = os.getpid()
        cur = self.db.execute(
            "INSERT INTO pending (host, label, size, sent, gpu_bytes, gpu_index, pid, pid_start)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (host, label, size, time.time(), gpu_bytes, gpu_index, me, start_time(me) or 0))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def remove(self, note: int) -> None:
        self.db.execute("DELETE FROM pending WHERE id = ?", (note,))

    def settle(self, reports: Iterable[tuple[str, Report | None]]) -> None:
        """Drop the notes whose booking a host's report now shows (running or queued, same label,
        booked no earlier than the note was sent): from then on that report counts it itself."""
        now = time.time()
        for host, report in reports:
            if report is None:
                continue
            ages: dict[str, list[float]] = {}
            for job in report.get("running") or []:
                ages.setdefault(str(job.get("label")), []).append(float(job.get("age_s") or 0))
            for queued in report.get("queue") or []:
                ages.setdefault(str(queued.get("label")), []).append(float(queued.get("waited_s") or 0))
            rows = self.db.execute("SELECT id, label, sent FROM pending WHERE host = ?",
                                   (host,)).fetchall()
            for note, label, sent in rows:
                if any(age <= now - sent + SEEN_SLACK for age in ages.get(label, [])):
                    self.remove(note)

    def active(self, window: float) -> dict[str, HostPending]:
        """What was sent per host within the last ``window`` seconds (older notes are dropped)."""
        from dispatch.core.procinfo import is_alive

        cutoff = time.time() - window
        self.db.execute("DELETE FROM pending WHERE sent < ?", (cutoff,))
        holders = self.db.execute("SELECT id, pid, pid_start FROM pending WHERE pid IS NOT NULL"
                                  ).fetchall()
        gone = [(note,) for note, pid, pid_start in holders if not is_alive(pid, pid_start)]
        if gone:  # their hostrun was killed before it could take its note back
            self.db.executemany("DELETE FROM pending WHERE id = ?", gone)
        found: dict[str, HostPending] = {}
        rows = self.db.execute("SELECT host, size, gpu_bytes, gpu_index FROM pending WHERE sent >= ?",
                               (cutoff,)).fetchall()
        for host, size, gpu_bytes, gpu_index in rows:
            was = found.get(host) or HostPending(0, {}, ())
            vram, unplaced = dict(was.vram), was.vram_unplaced
            if gpu_bytes and gpu_index is not None:
                vram[gpu_index] = vram.get(gpu_index, 0) + gpu_bytes
            elif gpu_bytes:
                unplaced = (*unplaced, gpu_bytes)
            found[host] = HostPending(was.memory + size, vram, unplaced)
        return found

    def close(self) -> None:
        self.db.close()
