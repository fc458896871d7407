"""Recovering a damaged ledger: confirm the damage, move the file aside, start a fresh one.

Imported only when a ledger operation failed (``dispatch.local.store.ledgerfile``), by ``hostrun doctor``,
and to find the running jobs to re-book. The fresh ledger is built under a temporary name and
renamed into place, so no process ever opens a half-built one:

- the peak table and history are replayed from the journal (``dispatch.local.store.peakjournal``);
- each job still running in the slice is re-booked from its cgroup ``job-<hostrun pid>-<start>``:
  state running, label ``recovered``, booked at its cgroup limit (the most it may use; the original
  booking, perhaps a smaller peak or gamble one, is not known), kind ``cap``. Its own hostrun puts its
  real booking back (same id, replacing that row) at its next ledger operation. A job still waiting
  (its forked process has not exec'd) is not re-booked: its hostrun puts its booking back itself;
- new booking ids start above every earlier one (the milliseconds since the epoch), so the waiters
  that put their bookings back keep their FIFO places ahead of new ones.

Standard library only: a peer's agent recovers its own ledger the same way.
"""

from __future__ import annotations

import os
import sqlite3
import time

from dispatch.core.flocking import flock_wait
from dispatch.core.procinfo import cmdline, is_alive
from dispatch.local.store import peakjournal
from dispatch.local.store.ledgerdb import PEAK_COLUMNS, SCHEMA_VERSION, Booking, create_tables, record_fold

MYPY = False
if MYPY:

    from dispatch.capping.base import CapBackend

RECOVERED = "recovered"  # the label of a booking re-made from a job's cgroup
EXPECTED_TABLES = ("bookings", "peak_runs", "peaks", "runs")


class Lock:
    """An exclusive lock on ``state_dir/ledger.lock``: one recovery at a time on a host."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "ledger.lock")
        self.fd = -1

    def __enter__(self) -> Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        flock_wait(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock


def damage(path: str, journal_path: str) -> str | None:
    """What is wrong with the ledger file, or None if it is sound (or still being created).

    Raises ``sqlite3.OperationalError`` when it cannot tell (locked, unreadable, read-only).
    """
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    try:
        try:
            rows = db.execute("PRAGMA quick_check").fetchall()
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            return str(exc)
        if rows != [("ok",)]:
            return f"quick_check: {rows[0][0]}"
        if version == SCHEMA_VERSION and not set(EXPECTED_TABLES) <= tables:
            return f"tables missing: {', '.join(sorted(set(EXPECTED_TABLES) - tables))}"
        if version == 0 and not tables and os.path.exists(journal_path):
            return "it is empty (no tables) though its peak journal exists"
        return None
    finally:
        db.close()


def insert_booking(db: sqlite3.Connection, b: Booking, with_id: bool) -> None:
    names = list(Booking._fields)
    values: list[object] = list(b)
    values[names.index("when_idle")] = int(b.when_idle)
    values[names.index("requeue")] = int(b.requeue)
    if not with_id:
        names, values = names[1:], values[1:]
    db.execute(f"INSERT INTO bookings ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
               values)


def _aside_name(path: str) -> str:
    base = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    name, n = base, 1
    while os.path.lexists(name):
        n += 1
        name = f"{base}-{n}"
    return name


def replace(path: str, journal_path: str, problem: str, live: list[Booking], mine: list[Booking]) -> str:
    """Build a fresh ledger, move the damaged one aside (with its -wal and -shm) and put the fresh
    one in its place; returns the one line to say."""
    tmp = f"{path}.new-{os.getpid()}"
    for name in (tmp, f"{tmp}-wal", f"{tmp}-shm", f"{tmp}-journal"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    try:
        _, skipped, peaks, rebooked = _build(tmp, journal_path, live, mine)
        aside = _aside_name(path)
        os.link(path, aside)  # path stays a ledger until the fresh one replaces it
        for suffix in ("-wal", "-shm"):  # never let the fresh file meet the damaged one's WAL
            try:
                os.rename(path + suffix, aside + suffix)
            except FileNotFoundError:
                pass
        os.replace(tmp, path)
    except BaseException:
        for name in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
            try:
                os.unlink(name)
            except OSError:
                pass
        raise
    lost = f", {skipped} unreadable journal lines skipped" if skipped else ""
    jobs = f"{rebooked} running job{'s' if rebooked != 1 else ''} re-booked"
    return (f"ledger {path} was damaged ({problem}); moved it aside to {os.path.basename(aside)} and "
            f"started fresh ({peaks} peak records rebuilt from {os.path.basename(journal_path)}{lost}; "
            f"{jobs})")


def _build(tmp: str, journal_path: str, live: list[Booking], mine: list[Booking]
           ) -> tuple[int, int, int, int]:
    """The fresh ledger at ``tmp``: (journal lines used, skipped, peak records, bookings made)."""
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    db = sqlite3.connect(tmp, timeout=60.0, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")
        create_tables(db)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        used, skipped = peakjournal.replay(
            journal_path,
            lambda label, host, peak, hit, duration, cap, at, event, clear_after, vram, ramp: (
                record_fold(db, label, host, peak, hit, duration, cap, at, event, clear_after, vram,
                            ramp)),
            lambda row: db.execute(f"INSERT OR REPLACE INTO peaks ({PEAK_COLUMNS}) "
                                   f"VALUES ({', '.join('?' * len(row))})", row),
            lambda label, host, peak, hit, duration, cap, at: db.execute(
                "INSERT INTO peak_runs (label, host, peak, cap, hit_ceiling, duration, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)", (label, host, peak, cap, int(hit), duration, at)),
        )
        ours = {b.cgroup for b in mine if b.cgroup}
        for b in mine:
            insert_booking(db, b, with_id=True)
        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('bookings', ?)",
                   (max([int(time.time() * 1000), *(b.id for b in mine)]),))
        others = [b for b in live if b.cgroup not in ours]
        for b in others:
            insert_booking(db, b, with_id=False)
        peaks = db.execute("SELECT count(*) FROM peaks").fetchone()[0]
        db.execute("COMMIT")
    finally:
        db.close()  # the last connection: the WAL is checkpointed and removed
    return used, skipped, peaks, len(others) + sum(1 for b in mine if b.state == "running")


def _parse_job_name(name: str) -> tuple[int, int] | None:
    """(hostrun pid, its start time) from ``job-<pid>-<start>``, ``hostrun-job-<pid>-<start>.scope``,
    a shared slice's ``hostrun-shared-<pid>-<start>.scope`` or a session's ``session-<pid>-<start>``
    or ``hostrun-session-<pid>-<start>.scope``."""
    for prefix in ("hostrun-job-", "hostrun-shared-", "hostrun-session-"):
        if name.startswith(prefix) and name.endswith(".scope"):
            name = "job-" + name[len(prefix):-len(".scope")]
    if name.startswith("session-"):
        name = "job-" + name[len("session-"):]
    if not name.startswith("job-"):
        return None
    pid, _, start = name[4:].partition("-")
    if not (pid.isdigit() and start.isdigit()):
        return None
    return int(pid), int(start)


def _limit(directory: str) -> int | None:
    for name in ("memory.limit_in_bytes", "memory.max"):
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        return None if text == "max" else int(text)
    return None


def _pids(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="utf-8") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def live_jobs(backend: CapBackend, host: str, slice_limit: int) -> list[Booking]:
    """The jobs running in the backend's slice, as bookings to re-make (see the module docstring)."""
    slice_dir = getattr(backend, "slice_dir", None)
    if not slice_dir:
        return []  # the none backend: no cgroups to find them by
    places = [slice_dir, backend.sessions_dir] if backend.sessions_dir else [slice_dir]
    dirs = []
    for place in places:  # the jobs in the slice, the sessions in their own slice
        try:
            dirs += [os.path.join(place, name) for name in sorted(os.listdir(place))]
        except OSError:
            continue
    now = time.time()
    found = []
    for directory in dirs:
        holder = _parse_job_name(os.path.basename(directory))
        if holder is None or not os.path.isdir(directory) or not is_alive(*holder):
            continue
        pids = _pids(directory)
        own = cmdline(holder[0])
        if not pids or all(cmdline(p) == own for p in pids):
            continue  # empty, or only the forked process still waiting for admission
        cap = min(_limit(directory) or slice_limit, slice_limit)
        command = own.split(" -- ", 1)[1] if " -- " in own else own
        found.append(Booking(0, host, RECOVERED, "running", holder[0], holder[1], cap, cap, "cap",
                             directory, command, None, now, now,
                             "re-booked from its cgroup after a ledger recovery"))
    return found


def inspect(state_dir: str) -> tuple[bool, str]:
    """For ``hostrun doctor``: whether the ledger is sound, in one line; changes nothing."""
    path = os.path.join(state_dir, "ledger.sqlite3")
    journal = os.path.join(state_dir, "peaks.journal")
    if not os.path.exists(path):
        return True, f"{path} not created yet (the first run creates it)"
    try:
        problem = damage(path, journal)
    except sqlite3.Error as exc:
        return False, f"cannot read the ledger {path}: {exc}"
    if problem is not None:
        return False, (f"ledger {path} is damaged ({problem}); the next hostrun run or 'hostrun ledger' "
                       "moves it aside and starts fresh, rebuilding the peak table from its journal")
    if not os.path.exists(journal):
        return True, f"{path}: ok (quick_check); no peak journal yet (the next run writes it)"
    return True, f"{path}: ok (quick_check); peak journal {journal}"
