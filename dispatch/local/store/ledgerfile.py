"""The ledger's file: its SQLite connection, kept usable (docs/design.md, "The ledger's durability").

``LedgerFile`` opens ``state_dir/ledger.sqlite3`` (created private, WAL mode, schema brought up to
date) and runs every ledger operation through ``_do``: Ctrl-Z held back while it runs, damage
recovered and the operation retried once, any other failure one ``LedgerError`` line. The operations
themselves are ``dispatch.local.admission.ledger.Ledger``'s.

Damage (a file that is not, or no longer, a sound SQLite database) is noticed when an operation fails,
never looked for on the hot path: then ``dispatch.local.store.recovery`` confirms it (``PRAGMA quick_check``),
moves the file aside, builds a fresh ledger (peaks from the journal, ``dispatch.local.store.peakjournal``;
running jobs from their cgroups) and the operation is retried once. Every booking made through this object is
put back with its own id, so its holder keeps its place. Other failures (read-only state dir, disk
full, a lock held too long) raise ``LedgerError``: one line, exit 78.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable

from dispatch.core.errors import LedgerError
from dispatch.local.store import peakjournal
from dispatch.local.store.ledgerdb import (
    SCHEMA_VERSION,
    Booking,
    booking_rows,
    migrate,
    peak_rows,
    peak_run_rows,
)
from dispatch.local.store.sqlitec import sqlite3

MYPY = False
if MYPY:
    from typing import ParamSpec, TypeVar

    LiveJobs = Callable[[], list[Booking]]  # running jobs found outside the ledger (their cgroups)
    P = ParamSpec("P")
    R = TypeVar("R")


def _stderr(line: str) -> None:
    print(f"hostrun: {line}", file=sys.stderr, flush=True)


def file_id(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path``, None if it is missing: tells when the ledger file was replaced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def rollback(db: sqlite3.Connection) -> None:
    """ROLLBACK that never hides the error being handled (a damaged file may refuse it too)."""
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _probe(directory: str) -> OSError | None:
    """Write one page to a scratch file in ``directory``: the OSError (EROFS, ENOSPC, ...) or None."""
    path = os.path.join(directory, f".hostrun-probe-{os.getpid()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc
    try:
        os.write(fd, bytes(4096))
        os.fsync(fd)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        os.unlink(path)
    return None


_STOP_SIGNALS = {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}  # the stops a process may hold back


class LedgerDamaged(sqlite3.DatabaseError):
    """Found on open: the file lost its tables (e.g. truncated to 0 bytes) though a journal exists."""


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Run a ledger operation through ``LedgerFile._do``: damage recovered and retried once, any
    other failure one ``LedgerError`` line."""
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, LedgerFile)
        return self._do(lambda: method(*args, **kwargs))

    return wrapper


def _ensure_private_dir(path: str) -> None:
    """The state directory: created 0700 and checked; another user's, or one others can write, is
    refused (UntrustedPathError), never reused."""
    from dispatch.guards.trust import private_dir

    private_dir(path, fix="set state_dir to a directory of your own")


def put_back_line(path: str, booking_ids: list[int]) -> str:
    return (f"ledger {path} was replaced (recovered by another hostrun); "
            f"put back booking {', '.join(str(i) for i in booking_ids)}")


class LedgerFile:
    """``say`` gets the one line a recovery prints (default: stderr). ``live_jobs`` lists the jobs
    running in the slice, to re-book them after a recovery; without it a damaged ledger is not
    recovered here (``LedgerError``), as running jobs' bookings would be lost."""

    def __init__(self, state_dir: str, say: Callable[[str], None] | None = None,
                 live_jobs: LiveJobs | None = None) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "ledger.sqlite3")
        self.log_path = os.path.join(state_dir, "queue.log")
        self.journal_path = os.path.join(state_dir, "peaks.journal")
        self.say = say or _stderr
        self.live_jobs = live_jobs
        self._mine: dict[int, Booking] = {}  # bookings made here: put back after a recovery
        self._ident: tuple[int, int] | None = None
        self.db: sqlite3.Connection
        self._connected = False
        try:
            _ensure_private_dir(state_dir)
        except OSError as exc:
            raise self._error(exc) from None
        self._do(lambda: None, connect=True)

    def _connect(self) -> None:
        if not os.path.exists(self.path):
            # Create it private; SQLite gives the -wal and -shm files the same mode.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._ident = file_id(self.path)
        self.db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)  # busy timeout 60 s
        self._connected = True
        self.db.execute("PRAGMA synchronous=NORMAL")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 and os.path.exists(self.journal_path):
            # Before any write: on a file emptied under a live WAL, switching it to WAL would wait
            # out the busy timeout on the other connections' locks.
            raise LedgerDamaged("it is empty (no tables) though its peak journal exists")
        if version != SCHEMA_VERSION:
            self._create_schema()
        if not os.path.exists(self.journal_path):  # a ledger from before the journal: seed it
            self._locked(lambda: self._snapshot_if_missing())

    def _create_schema(self) -> None:
        """Create the tables, or bring an older ledger up to date; safe to race with another process.

        One transaction, the version written last: a crash leaves the old version and the next open
        migrates again. A new ledger gets its journal only once its tables are committed, so an
        empty ledger (version 0) next to a journal is one that lost its contents, never one that
        another process is still creating (a journal written inside the transaction made a second
        process take a ledger being created for a damaged one, and move it aside: lost bookings).
        The journal is seeded by ``_connect`` right after, as for a ledger from before the journal
        (also what a crash between the commit and the journal leaves).
        """
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                if version == 0 and os.path.exists(self.journal_path):
                    raise LedgerDamaged("it is empty (no tables) though its peak journal exists")
                migrate(self.db)
            self.db.execute("COMMIT")
        except BaseException:
            rollback(self.db)
            raise

    def _snapshot_if_missing(self) -> None:
        if not os.path.exists(self.journal_path):
            peakjournal.write_snapshot(self.journal_path, peak_rows(self.db), peak_run_rows(self.db))

    def _locked(self, fn: Callable[[], None]) -> None:
        try:  # BEGIN inside: a signal's exception raised right after it must still roll back
            self.db.execute("BEGIN IMMEDIATE")
            fn()
            self.db.execute("COMMIT")
        except BaseException:
            rollback(self.db)
            raise

    def close(self) -> None:
        if self._connected:
            self._connected = False
            try:
                self.db.close()
            except sqlite3.Error:
                pass

    def _rows(self, where: str, params: tuple[object, ...]) -> list[Booking]:
        return booking_rows(self.db, where, params)

    def _track(self, booking_id: int) -> None:
        """Remember booking ``booking_id`` as it is now, to put it back after a recovery."""
        rows = self._rows("id = ?", (booking_id,))
        if rows:
            self._mine[booking_id] = rows[0]

    # -- failures: damage is recovered and the operation retried once; the rest is one line --
    def _do(self, fn: Callable[[], R], connect: bool = False) -> R:
        """One ledger operation, with Ctrl-Z held back while it runs: a hostrun stopped inside
        its write transaction would hold the lock, and with it every other hostrun on the host,
        until resumed (a SIGSTOP cannot be held back: it stops a waiter mid-transaction in the few
        ms one takes)."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            return self._do_once(fn, connect)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _do_once(self, fn: Callable[[], R], connect: bool) -> R:
        try:
            if connect:
                self._connect()
            elif file_id(self.path) != self._ident:  # replaced (recovered by another process)
                self._recover(None)
            return fn()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not str(exc).startswith("no such table"):
                raise self._error(exc) from None  # locked, read-only, disk full, I/O: not damage
            try:
                self._recover(exc)
            except (sqlite3.Error, OSError) as again:
                raise self._error(again) from None
        except OSError as exc:
            raise self._error(exc) from None
        try:
            return fn()
        except (sqlite3.Error, OSError) as exc:
            raise self._error(exc) from None

    def _recover(self, exc: sqlite3.DatabaseError | None) -> None:
        """Confirm the damage, replace the file (once, whoever comes first) and reconnect; then put
        this object's bookings back with their ids. ``exc`` None: the file was replaced already."""
        from dispatch.local.store import recovery

        with recovery.Lock(self.state_dir):
            self.close()
            if exc is not None and file_id(self.path) in (self._ident, None):
                problem = recovery.damage(self.path, self.journal_path)
                if problem is None:  # sound after all (e.g. just created by another process): retry
                    self._connect()
                    return
                if self.live_jobs is None:
                    raise LedgerError(f"ledger {self.path} is damaged ({problem}); any hostrun run or "
                                      "'hostrun ledger' moves it aside and starts fresh")
                self.say(recovery.replace(self.path, self.journal_path, problem, self.live_jobs(),
                                          list(self._mine.values())))
            self._connect()
            if self._mine:
                self._locked(self._put_back)
                if exc is None:  # another process recovered it: our terminal has not heard of it
                    self.put_back_said(list(self._mine))

    def put_back_said(self, booking_ids: list[int]) -> None:
        """Say that the file was replaced by another process and these bookings were put back (the
        admission engine tells each run its own)."""
        self.say(put_back_line(self.path, booking_ids))

    def _put_back(self) -> None:
        """Our bookings, with their own ids (FIFO order kept), over any row re-booked for our cgroup."""
        from dispatch.local.store.recovery import insert_booking

        for b in self._mine.values():
            if self._rows("id = ?", (b.id,)):
                continue
            if b.cgroup:
                self.db.execute("DELETE FROM bookings WHERE cgroup = ?", (b.cgroup,))
            insert_booking(self.db, b, with_id=True)

    def _error(self, exc: BaseException) -> LedgerError:
        """One line naming the state dir and the errno (found by a probe write when SQLite hides it)."""
        cause = exc if isinstance(exc, OSError) else _probe(self.state_dir)
        detail = str(exc) if cause is exc or cause is None else f"SQLite: {exc}"
        return LedgerError.of_state_dir(self.state_dir, cause, detail, f"ledger {self.path}")
