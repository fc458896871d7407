"""The ledger: running bookings, the FIFO queue and the peak table, in SQLite (WAL) in state_dir.

Shared by every hostrun process on the host. Each admission decision is one ``BEGIN IMMEDIATE``
transaction, so two processes can never both take the same room, and a SIGKILL at any point leaves the
store consistent (SQLite rolls back the unfinished transaction). Bookings whose holder is gone (pid and
start time no longer match) are reclaimed inside the same transaction by whoever admits next.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable

from dispatch.procinfo import is_alive
from dispatch.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any, Optional

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL,
    label TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('waiting', 'running')),
    pid INTEGER NOT NULL,
    pid_start INTEGER NOT NULL,
    size INTEGER NOT NULL,
    cap INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('cap', 'peak', 'gamble')),
    cgroup TEXT,
    command TEXT NOT NULL,
    session TEXT,
    queued REAL NOT NULL,
    since REAL,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS bookings_host_state ON bookings (host, state, id);
CREATE TABLE IF NOT EXISTS peaks (
    label TEXT NOT NULL,
    host TEXT NOT NULL,
    max_peak INTEGER NOT NULL,
    runs INTEGER NOT NULL,
    last_peak INTEGER NOT NULL,
    hit_ceiling INTEGER NOT NULL,
    last_duration REAL,
    max_duration REAL,
    updated REAL NOT NULL,
    PRIMARY KEY (label, host)
);
"""
BOOKING_COLUMNS = (
    "id, host, label, state, pid, pid_start, size, cap, kind, cgroup, command, session, queued, "
    "since, reason"
)


class Booking(NamedTuple):
    id: int
    host: str
    label: str
    state: str
    pid: int
    pid_start: int
    size: int
    cap: int
    kind: str
    cgroup: Optional[str]
    command: str
    session: Optional[str]
    queued: float
    since: Optional[float]
    reason: Optional[str]


class PeakRecord(NamedTuple):
    label: str
    host: str
    max_peak: int
    runs: int
    last_peak: int
    hit_ceiling: bool
    last_duration: Optional[float]
    max_duration: Optional[float]
    updated: float


class Admission(NamedTuple):
    """One admission attempt: whether it got in, and the figures a status line needs."""

    admitted: bool
    need: int
    free: int
    ahead: int  # bytes asked for by earlier waiters
    position: int  # how many earlier waiters there are
    holders: list[Booking]
    reclaimed: list[Booking]


def _peak(row: Any) -> PeakRecord:
    fields = list(row)
    fields[5] = bool(fields[5])
    return PeakRecord(*fields)


def _ensure_private_dir(path: str) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)


class Ledger:
    def __init__(self, state_dir: str) -> None:
        _ensure_private_dir(state_dir)
        self.path = os.path.join(state_dir, "ledger.sqlite3")
        self.tick_path = os.path.join(state_dir, "ledger.tick")
        if not os.path.exists(self.path):
            # Create it private; SQLite gives the -wal and -shm files the same mode.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=60000")
        if self.db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            self._create_schema()

    def _create_schema(self) -> None:
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(
            f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
        )

    def close(self) -> None:
        self.db.close()

    # -- change notification: waiters stat this file instead of querying the store in a loop --
    def touch(self) -> None:
        """Append one byte: size and mtime change on every call, so no wake-up is ever lost."""
        fd = os.open(self.tick_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size > 1 << 16:
                os.ftruncate(fd, 0)
            os.write(fd, b".")
        finally:
            os.close(fd)

    def tick(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.tick_path)
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    # -- bookings --
    def _rows(self, where: str, params: tuple[object, ...]) -> list[Booking]:
        cur = self.db.execute(f"SELECT {BOOKING_COLUMNS} FROM bookings WHERE {where} ORDER BY id", params)
        return [Booking(*row) for row in cur.fetchall()]

    def enqueue(
        self, *, host: str, label: str, pid: int, pid_start: int, size: int, cap: int, kind: str,
        command: str, session: str | None, cgroup: str | None = None,
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO bookings (host, label, state, pid, pid_start, size, cap, kind, command,"
            " session, queued, cgroup) VALUES (?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (host, label, pid, pid_start, size, cap, kind, command, session, time.time(), cgroup),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def _reclaim_locked(self, host: str) -> list[Booking]:
        stale = [b for b in self._rows("host = ?", (host,)) if not is_alive(b.pid, b.pid_start)]
        if stale:
            self.db.executemany("DELETE FROM bookings WHERE id = ?", [(b.id,) for b in stale])
        return stale

    def reclaim(self, host: str) -> list[Booking]:
        """Delete bookings and queue entries whose holder is gone; the caller stops their cgroups."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            stale = self._reclaim_locked(host)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if stale:
            self.touch()
        return stale

    def _evaluate(self, booking_id: int, host: str, room: Callable[[int], int]) -> Admission:
        rows = self._rows("host = ?", (host,))
        running = [b for b in rows if b.state == "running"]
        me = next((b for b in rows if b.id == booking_id), None)
        if me is None:
            raise LookupError(f"booking {booking_id} vanished from the ledger")
        earlier = [b for b in rows if b.state == "waiting" and b.id < booking_id]
        ahead = sum(b.size for b in earlier)
        free = room(sum(b.size for b in running))
        admitted = me.state == "running" or free - ahead >= me.size
        return Admission(admitted, me.size, free, ahead, len(earlier), running, [])

    def peek(self, booking_id: int, host: str, room: Callable[[int], int]) -> Admission:
        """Would ``try_admit`` admit now? A plain read: takes no lock and changes nothing.

        Waiters peek on every change and lock only when they could get in (or once a second, to
        reclaim stale bookings), so a release does not send every waiter into the write lock.
        """
        return self._evaluate(booking_id, host, room)

    def try_admit(self, booking_id: int, host: str, room: Callable[[int], int]) -> Admission:
        """Admit ``booking_id`` if ``room(booked)`` minus what earlier waiters need covers its size.

        ``room`` gets the bytes booked by running jobs and returns the free room in the slice (slice
        limit - booked - cache-free usage above the bookings). Reserving room for every earlier waiter
        keeps FIFO: a later job can only start when it cannot delay an earlier one. Stale bookings are
        reclaimed first, in the same transaction.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            reclaimed = self._reclaim_locked(host)
            adm = self._evaluate(booking_id, host, room)
            if adm.admitted:
                self.db.execute(
                    "UPDATE bookings SET state = 'running', since = ?, reason = NULL"
                    " WHERE id = ? AND state = 'waiting'",
                    (time.time(), booking_id),
                )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if adm.admitted or reclaimed:
            self.touch()
        return adm._replace(reclaimed=reclaimed)

    def set_reason(self, booking_id: int, reason: str) -> None:
        self.db.execute("UPDATE bookings SET reason = ? WHERE id = ?", (reason, booking_id))

    def set_cgroup(self, booking_id: int, cgroup: str) -> None:
        self.db.execute("UPDATE bookings SET cgroup = ? WHERE id = ?", (cgroup, booking_id))

    def release(self, booking_id: int) -> None:
        self.db.execute("DELETE FROM bookings WHERE id = ?", (booking_id,))
        self.touch()

    def bookings(self, host: str | None = None) -> list[Booking]:
        return self._rows("host = ?", (host,)) if host else self._rows("1 = 1", ())

    # -- peak table --
    def peak(self, label: str, host: str) -> PeakRecord | None:
        row = self.db.execute(
            "SELECT label, host, max_peak, runs, last_peak, hit_ceiling, last_duration, max_duration,"
            " updated FROM peaks WHERE label = ? AND host = ?",
            (label, host),
        ).fetchone()
        return _peak(row) if row else None

    def peaks(self) -> list[PeakRecord]:
        rows = self.db.execute(
            "SELECT label, host, max_peak, runs, last_peak, hit_ceiling, last_duration, max_duration,"
            " updated FROM peaks ORDER BY host, label"
        ).fetchall()
        return [_peak(r) for r in rows]

    def record_peak(
        self, label: str, host: str, peak: int, hit_ceiling: bool, duration: float
    ) -> None:
        self.db.execute(
            "INSERT INTO peaks (label, host, max_peak, runs, last_peak, hit_ceiling, last_duration,"
            " max_duration, updated) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)"
            " ON CONFLICT (label, host) DO UPDATE SET max_peak = max(max_peak, excluded.max_peak),"
            " runs = runs + 1, last_peak = excluded.last_peak,"
            " hit_ceiling = max(hit_ceiling, excluded.hit_ceiling),"
            " last_duration = excluded.last_duration,"
            " max_duration = max(coalesce(max_duration, 0), excluded.max_duration),"
            " updated = excluded.updated",
            (label, host, peak, peak, int(hit_ceiling), duration, duration, time.time()),
        )
