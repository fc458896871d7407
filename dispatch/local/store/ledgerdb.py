"""The ledger's store: its SQLite schema and the records its rows become (standard library only).

Apart from ``dispatch.local.admission.ledger`` (the operations) and ``dispatch.local.store.ledgerfile`` (the
connection), because a recovery (``dispatch.local.store.recovery``) and the peak journal
(``dispatch.local.store.peakjournal``) build and replay the same tables without needing the ledger. A
finished run's record (``RunRecord``, the mark events, ``record_outcome``) is in
``dispatch.local.store.runrecord``, re-exported here: a run writes one without loading the schema.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple
from dispatch.local.store.ramp import decode as decode_ramp
from dispatch.local.store.ramp import encode as encode_ramp
from dispatch.local.store.ramp import fold as fold_ramp
from dispatch.local.store.runrecord import CLEAN as CLEAN  # a finished run's record: there, re-exported
from dispatch.local.store.runrecord import FAILED as FAILED
from dispatch.local.store.runrecord import NO_EVENT as NO_EVENT
from dispatch.local.store.runrecord import OOM_KILLED as OOM_KILLED
from dispatch.local.store.runrecord import SLICE_FULL as SLICE_FULL
from dispatch.local.store.runrecord import UNFINISHED as UNFINISHED
from dispatch.local.store.runrecord import RunRecord as RunRecord
from dispatch.local.store.runrecord import mark_event as mark_event
from dispatch.local.store.runrecord import record_outcome as record_outcome
from dispatch.local.store.runrecord import run_row as run_row
from dispatch.local.store.runrecord import unrecorded_line as unrecorded_line

MYPY = False
if MYPY:
    import sqlite3  # annotations only: the peer driver reads these records without opening a ledger
    from collections.abc import Sequence
    from typing import Any, Optional

SCHEMA_VERSION = 8  # 2: bookings.gpu_index, gpu_bytes; 3: the peak_runs table; 4: grp, when_idle;
# 5: peaks.ceiling_at, slice_full_at, clean_runs (the marks that book a label at its cap); 6: runs;
# 7: peaks.max_vram (the worst VRAM a --gpu-memory run of the label used); 8: peaks.ramp,
# min_duration (how fast it grows: ``dispatch.local.store.ramp``), bookings.requeue (it may be lent room)
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
    reason TEXT,
    gpu_index INTEGER,
    gpu_bytes INTEGER,
    grp TEXT,
    when_idle INTEGER NOT NULL DEFAULT 0,
    requeue INTEGER NOT NULL DEFAULT 0
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
    ceiling_at REAL,
    slice_full_at REAL,
    clean_runs INTEGER NOT NULL DEFAULT 0,
    max_vram INTEGER,
    ramp TEXT,
    min_duration REAL,
    PRIMARY KEY (label, host)
);
CREATE TABLE IF NOT EXISTS peak_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    label TEXT NOT NULL,
    host TEXT NOT NULL,
    peak INTEGER NOT NULL,
    cap INTEGER,
    hit_ceiling INTEGER NOT NULL,
    duration REAL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS peak_runs_label_host ON peak_runs (label, host, id);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    duration REAL,
    waited REAL,
    host TEXT NOT NULL,
    label TEXT NOT NULL,
    session TEXT,
    command TEXT NOT NULL,
    cap INTEGER,
    kind TEXT,
    booked INTEGER,
    peak INTEGER,
    exit_code INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    hit_ceiling INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_ended ON runs (ended);
"""
# The last PEAK_HISTORY runs of each (label, host) are kept in peak_runs, one row per run; ``cap`` is
# the job's own cap, NULL when it had none (limited by the slice only). The peaks table keeps the
# all-time figures; peak_runs is what says how much the peaks vary (see dispatch/local/capacity.py).
PEAK_HISTORY = 20
# ``runs`` is the run history (``hostrun history``): one row per run that started, written when it
# ends; kept for ``history_days`` and at most ``history_rows`` rows, pruned as each row is written.
RUN_COLUMNS = ("started, ended, duration, waited, host, label, session, command, cap, kind, booked, "
               "peak, exit_code, outcome, hit_ceiling")
DAY = 86400.0
BOOKING_COLUMNS = (
    "id, host, label, state, pid, pid_start, size, cap, kind, cgroup, command, session, queued, "
    "since, reason, gpu_index, gpu_bytes, grp, when_idle, requeue"
)
# Columns added after version 1, for ledgers created by an older hostrun: (name, declaration).
ADDED_COLUMNS = (("gpu_index", "INTEGER"), ("gpu_bytes", "INTEGER"), ("grp", "TEXT"),
                 ("when_idle", "INTEGER NOT NULL DEFAULT 0"),
                 ("requeue", "INTEGER NOT NULL DEFAULT 0"))
ADDED_PEAK_COLUMNS = (("ceiling_at", "REAL"), ("slice_full_at", "REAL"),
                      ("clean_runs", "INTEGER NOT NULL DEFAULT 0"), ("max_vram", "INTEGER"),
                      ("ramp", "TEXT"), ("min_duration", "REAL"))
PEAK_COLUMNS = ("label, host, max_peak, runs, last_peak, hit_ceiling, last_duration, max_duration,"
                " updated, ceiling_at, slice_full_at, clean_runs, max_vram, ramp, min_duration")
CLEAR_MARK_AFTER = 3  # the default of ``clear_mark_after``


class NewBooking(NamedTuple):
    """A booking as a run asks for it, before the ledger gives it an id and a place in the queue
    (``Ledger.enqueue``): who holds it, what it books, and how admission treats it."""

    host: str
    label: str
    pid: int
    pid_start: int
    size: int  # what the ledger books
    cap: int  # the job cgroup's limit
    kind: str  # the plan's kind (peak, cap, gamble, ...)
    command: str
    session: Optional[str] = None
    cgroup: Optional[str] = None
    gpu_bytes: Optional[int] = None
    group: Optional[str] = None
    when_idle: bool = False
    requeue: bool = False  # it may be requeued, so admission may lend it room (``lending``)


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
    gpu_index: Optional[int] = None  # the GPU it was admitted on
    gpu_bytes: Optional[int] = None  # VRAM asked for with --gpu-memory
    grp: Optional[str] = None  # --group
    when_idle: bool = False  # --when-idle
    requeue: bool = False  # it may be requeued (--requeue): admission may lend it room


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
    ceiling_at: Optional[float] = None  # when it last hit its own cap (None: never, or before v5)
    slice_full_at: Optional[float] = None  # marked: killed when the slice filled (254) then
    clean_runs: int = 0  # clean runs at its cap since that mark; the mark clears at clear_mark_after
    max_vram: Optional[int] = None  # bytes: the most VRAM a --gpu-memory run used (None: unmeasured)
    ramp: Optional[tuple[int, ...]] = None  # its ramp profile (``dispatch.local.store.ramp``), clean runs
    min_duration: Optional[float] = None  # its fastest run that recorded a profile


class PeakRun(NamedTuple):
    """One run in the peak history (the last ``PEAK_HISTORY`` runs of a label on a host)."""

    label: str
    host: str
    peak: int
    cap: Optional[int]  # the job's own cap; None: it had none (limited by the slice only)
    hit_ceiling: bool
    duration: Optional[float]
    at: float


def run_record(row: Any) -> RunRecord:
    """A ``SELECT id, RUN_COLUMNS`` row."""
    return RunRecord._make([*row[1:15], bool(row[15]), row[0]])


def record_run(db: sqlite3.Connection, run: RunRecord, keep_days: float, keep_rows: int,
               now: float) -> None:
    """Insert one history row and prune, in the caller's write transaction. Both deletes are one
    index seek when nothing is due (the id for the row count, ``runs_ended`` for the age), so the
    history stays within its bounds exactly at a constant cost per run."""
    cur = db.execute(f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * 15)})",
                     (*run[:14], int(run.hit_ceiling)))
    assert cur.lastrowid is not None
    db.execute("DELETE FROM runs WHERE id <= ?", (cur.lastrowid - keep_rows,))
    db.execute("DELETE FROM runs WHERE ended < ?", (now - keep_days * DAY,))


def peak_record(row: Any) -> PeakRecord:
    fields = list(row)
    fields[5] = bool(fields[5])
    if len(fields) > 13:
        fields[13] = decode_ramp(fields[13])
    return PeakRecord(*fields)


def create_tables(db: sqlite3.Connection) -> None:
    """The schema, one statement at a time (inside the caller's transaction)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def migrate(db: sqlite3.Connection) -> None:
    """Create the tables, or add the columns an older ledger lacks, then write the version last (in
    the caller's write transaction: a crash leaves the old version, and the next open migrates)."""
    create_tables(db)
    for table, added in (("bookings", ADDED_COLUMNS), ("peaks", ADDED_PEAK_COLUMNS)):
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, declaration in added:
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def booking_rows(db: sqlite3.Connection, where: str, params: tuple[object, ...]) -> list[Booking]:
    """The bookings matching ``where``, in id order (queue order)."""
    cur = db.execute(f"SELECT {BOOKING_COLUMNS} FROM bookings WHERE {where} ORDER BY id", params)
    return [Booking(*row) for row in cur.fetchall()]


def peak_rows(db: sqlite3.Connection) -> list[PeakRecord]:
    """The whole peak table, by host and label."""
    rows = db.execute(f"SELECT {PEAK_COLUMNS} FROM peaks ORDER BY host, label").fetchall()
    return [peak_record(r) for r in rows]


def peak_run_rows(db: sqlite3.Connection, host: str | None = None) -> list[PeakRun]:
    """The peak history (oldest first per label), of one host or all."""
    where, params = ("WHERE host = ?", (host,)) if host else ("", ())
    rows = db.execute(
        "SELECT label, host, peak, cap, hit_ceiling, duration, at FROM peak_runs"
        f" {where} ORDER BY host, label, id", params
    ).fetchall()
    return [PeakRun(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in rows]


def record_fold(db: sqlite3.Connection, label: str, host: str, peak: int, hit_ceiling: bool,
                duration: float | None, cap: int | None, now: float, event: str = NO_EVENT,
                clear_after: int = CLEAR_MARK_AFTER, vram: int | None = None,
                ramp: Sequence[int] | None = None) -> None:
    """One run into peak_runs (keeping the last PEAK_HISTORY) and into peaks; in a write transaction.
    Also how a recovery replays the journal, so a rebuilt table equals the one that was there.

    The mark: hitting its own cap sets ``ceiling_at`` (``hit_ceiling`` stays set for good). ``event``
    SLICE_FULL marks the label (``slice_full_at``, clean runs back to 0); OOM_KILLED sets the count
    back to 0; CLEAN counts one, and the ``clear_after``-th in a row clears the mark, so one lucky
    run does not put the label back to peak or gamble booking.

    ``ramp``: the run's ramp profile (a clean run's): folded pointwise (``ramp.fold``), and its
    duration into ``min_duration``, so a projected phase is never later than the fastest run's.

    The booking peak (``max_peak``): a run that did not succeed (``UNFINISHED``) may raise it, never
    set it: a build that fails in its first seconds peaked at a fraction of what the real build
    needs, and booked at that the next run is the undercount that ends in 254. Until a run exits 0
    (or one hits its own cap: booked at its cap for good then) it stays 0, "none": booked at its
    cap, or as a gamble. The run's own peak still goes into ``last_peak`` and the history.
    """
    sets = event not in UNFINISHED or hit_ceiling
    db.execute(
        "INSERT INTO peak_runs (label, host, peak, cap, hit_ceiling, duration, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (label, host, peak, cap, int(hit_ceiling), duration, now),
    )
    db.execute(
        "DELETE FROM peak_runs WHERE label = ? AND host = ? AND id <= (SELECT id FROM peak_runs"
        " WHERE label = ? AND host = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (label, host, label, host, PEAK_HISTORY),
    )
    db.execute(
        "INSERT INTO peaks (label, host, max_peak, runs, last_peak, hit_ceiling, last_duration,"
        " max_duration, updated) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)"
        " ON CONFLICT (label, host) DO UPDATE SET max_peak = CASE WHEN ? OR max_peak > 0"
        " THEN max(max_peak, ?) ELSE max_peak END,"
        " runs = runs + 1, last_peak = excluded.last_peak,"
        " hit_ceiling = max(hit_ceiling, excluded.hit_ceiling),"
        " last_duration = excluded.last_duration,"
        " max_duration = max(coalesce(max_duration, 0), excluded.max_duration),"
        " updated = excluded.updated",
        (label, host, peak if sets else 0, peak, int(hit_ceiling), duration, duration, now,
         int(sets), peak),
    )
    key = (label, host)
    if vram is not None:
        db.execute("UPDATE peaks SET max_vram = max(coalesce(max_vram, 0), ?) WHERE label = ? AND"
                   " host = ?", (vram, *key))
    if ramp is not None:
        old = db.execute("SELECT ramp FROM peaks WHERE label = ? AND host = ?", key).fetchone()
        db.execute("UPDATE peaks SET ramp = ?, min_duration = min(coalesce(min_duration, ?), ?)"
                   " WHERE label = ? AND host = ?",
                   (encode_ramp(fold_ramp(decode_ramp(old[0]), ramp)), duration, duration, *key))
    if hit_ceiling:
        db.execute("UPDATE peaks SET ceiling_at = ? WHERE label = ? AND host = ?", (now, *key))
    if event == SLICE_FULL:
        db.execute("UPDATE peaks SET slice_full_at = ?, clean_runs = 0 WHERE label = ? AND host = ?",
                   (now, *key))
    elif event == OOM_KILLED:
        db.execute("UPDATE peaks SET clean_runs = 0 WHERE label = ? AND host = ?", key)
    elif event == CLEAN:
        db.execute("UPDATE peaks SET clean_runs = clean_runs + 1 WHERE label = ? AND host = ?"
                   " AND slice_full_at IS NOT NULL", key)
        db.execute("UPDATE peaks SET slice_full_at = NULL, clean_runs = 0 WHERE label = ? AND host = ?"
                   " AND clean_runs >= ?", (*key, clear_after))
