"""The ledger: running bookings, the FIFO queue and the peak table, in SQLite (WAL) in state_dir.

Shared by every hostrun process on the host. Each admission decision is one ``BEGIN IMMEDIATE``
transaction, so two processes can never both take the same room, and a SIGKILL at any point leaves the
store consistent (SQLite rolls back the unfinished transaction). Bookings whose holder is gone (pid and
start time no longer match) are reclaimed inside the same transaction by whoever admits next.

A job given ``--gpu-memory`` is booked on one GPU as well, in the same row and the same transaction:
``gpu_bytes`` is what it asked for, ``gpu_index`` the device it was admitted on (NULL while waiting).
The ledger never reads a GPU itself: the caller passes the room per device, read beforehand.

Damage (a file that is not, or no longer, a sound SQLite database) is noticed when an operation fails,
never looked for on the hot path: then ``dispatch.local.recovery`` confirms it (``PRAGMA quick_check``),
moves the file aside, builds a fresh ledger (peaks from the journal, ``dispatch.local.peakjournal``; running
jobs from their cgroups) and the operation is retried once. Every booking made through this object is
put back with its own id, so its holder keeps its place. Other failures (read-only state dir, disk
full, a lock held too long) raise ``LedgerError``: one line, exit 78.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from dispatch.core.errors import LedgerError
from dispatch.core.procinfo import is_alive, is_stopped
from dispatch.core.records import NamedTuple
from dispatch.core.text import storable
from dispatch.core.units import format_size
from dispatch.local import peakjournal
from dispatch.local.ledgerdb import (
    ADDED_COLUMNS,
    ADDED_PEAK_COLUMNS,
    BOOKING_COLUMNS,
    CLEAR_MARK_AFTER,
    NO_EVENT,
    PEAK_COLUMNS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    Booking,
    PeakRecord,
    PeakRun,
    RunRecord,
    create_tables,
    peak_record,
    record_fold,
    record_run,
    run_record,
)

MYPY = False
if MYPY:
    from typing import Any, Optional, ParamSpec, TypeVar

    GpuRoom = Callable[[list["Booking"]], dict[int, int]]  # running bookings -> room per GPU index
    RoomFunction = Callable[[list["Booking"]], "Room"]  # running bookings -> room for a new booking
    LiveJobs = Callable[[], list["Booking"]]  # running jobs found outside the ledger (their cgroups)
    P = ParamSpec("P")
    R = TypeVar("R")

def choose_gpu(rooms: dict[int, int], earlier: list[int], need: int
               ) -> tuple[int | None, int | None, int, bool]:
    """Pick a device for ``need`` bytes of VRAM, keeping FIFO among GPU waiters.

    ``rooms``: room per device index after running bookings; ``earlier``: the VRAM asked for by
    earlier GPU waiters, in queue order. Each earlier waiter is first set against the device with the
    most room (as it would choose), whether or not it fits there, so a later job can only take room
    an earlier one would not have taken. Then the device with the most room left that fits ``need``
    is chosen (lowest index on a tie). Returns (device, room on the best device before the earlier
    waiters, VRAM asked for by them, fits).
    """
    if not rooms:
        return None, None, sum(earlier), False
    best = max(rooms, key=lambda i: (rooms[i], -i))
    left = dict(rooms)
    for size in earlier:
        first = max(left, key=lambda i: (left[i], -i))
        left[first] -= size
    device = max(left, key=lambda i: (left[i], -i))
    fits = left[device] >= need
    return (device if fits else best), rooms[best], sum(earlier), fits


class Room(NamedTuple):
    """Room for a new booking on a host now: the slice's room, or less when the machine's available
    memory is shorter (``note`` then says so, for the status line and the queue reason)."""

    free: int
    note: Optional[str] = None


class Admission(NamedTuple):
    """One admission attempt: whether it got in, and the figures a status line needs."""

    admitted: bool
    need: int
    free: int
    ahead: int  # bytes asked for by earlier waiters
    position: int  # how many earlier waiters there are
    holders: list[Booking]
    reclaimed: list[Booking]
    # With --gpu-memory: VRAM asked for; the device chosen (admitted) or with the most room (not yet);
    # the room on that device before earlier GPU waiters; VRAM asked for by those; what blocks.
    gpu_need: int = 0
    gpu_device: Optional[int] = None
    gpu_free: Optional[int] = None
    gpu_ahead: int = 0
    memory_ok: bool = True
    gpu_ok: bool = True
    policy: Optional[str] = None  # a queue policy holding it: "group-cap build 2/2", "when-idle ..."
    # Backfill (queue_policy "backfill"): what holds it behind a memory-blocked head that it would
    # fit in front of ("waiting for head ..."); the BACKFILL line when it jumped the head; whether a
    # waiter behind it might jump now (a woken waiter then passes the ring on).
    head: Optional[str] = None
    backfill: Optional[str] = None
    pass_on: bool = False
    machine: Optional[str] = None  # the machine's available memory, when it is what holds the room


def policy_block(b: Booking, running: Sequence[Booking], groups: Mapping[str, int] | None
                 ) -> str | None:
    """Why a queue policy holds waiting booking ``b`` now, or None.

    ``--when-idle``: only when no other hostrun job runs on the host. ``--group NAME``: at most
    ``groups.NAME.max_running`` jobs of that group at once (groups not configured have no cap).
    """
    others = [r for r in running if r.id != b.id]
    if b.when_idle and others:
        return f"when-idle {b.label} — {len(others)} running"
    limit = (groups or {}).get(b.grp) if b.grp else None
    if limit is not None:
        count = sum(1 for r in others if r.grp == b.grp)
        if count >= limit:
            return f"group-cap {b.grp} {count}/{limit}"
    return None


def _stderr(line: str) -> None:
    print(f"hostrun: {line}", file=sys.stderr, flush=True)


def file_id(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path``, None if it is missing: tells when the ledger file was replaced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _rollback(db: sqlite3.Connection) -> None:
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


def _guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Run a ledger operation through ``Ledger._do``: damage recovered and retried once, any other
    failure one ``LedgerError`` line."""
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, Ledger)
        return self._do(lambda: method(*args, **kwargs))

    return wrapper


def _ensure_private_dir(path: str) -> None:
    """The state directory: created 0700 and checked; another user's, or one others can write, is
    refused (UntrustedPathError), never reused."""
    from dispatch.guards.trust import private_dir

    private_dir(path, fix="set state_dir to a directory of your own")


class Ledger:
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
        self.db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self._connected = True
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=60000")
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
                create_tables(self.db)
                have = {row[1] for row in self.db.execute("PRAGMA table_info(bookings)")}
                for name, declaration in ADDED_COLUMNS:
                    if name not in have:
                        self.db.execute(f"ALTER TABLE bookings ADD COLUMN {name} {declaration}")
                have = {row[1] for row in self.db.execute("PRAGMA table_info(peaks)")}
                for name, declaration in ADDED_PEAK_COLUMNS:
                    if name not in have:
                        self.db.execute(f"ALTER TABLE peaks ADD COLUMN {name} {declaration}")
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.db.execute("COMMIT")
        except BaseException:
            _rollback(self.db)
            raise

    def _snapshot_if_missing(self) -> None:
        if not os.path.exists(self.journal_path):
            peakjournal.write_snapshot(self.journal_path, self._peaks(), self._peak_runs())

    def _locked(self, fn: Callable[[], None]) -> None:
        try:  # BEGIN inside: a signal's exception raised right after it must still roll back
            self.db.execute("BEGIN IMMEDIATE")
            fn()
            self.db.execute("COMMIT")
        except BaseException:
            _rollback(self.db)
            raise

    def close(self) -> None:
        if self._connected:
            self._connected = False
            try:
                self.db.close()
            except sqlite3.Error:
                pass

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
        from dispatch.local import recovery

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
                    self.say(f"ledger {self.path} was replaced (recovered by another hostrun); "
                             f"put back booking {', '.join(str(i) for i in self._mine)}")

    def _put_back(self) -> None:
        """Our bookings, with their own ids (FIFO order kept), over any row re-booked for our cgroup."""
        from dispatch.local.recovery import insert_booking

        for b in self._mine.values():
            if self._rows("id = ?", (b.id,)):
                continue
            if b.cgroup:
                self.db.execute("DELETE FROM bookings WHERE cgroup = ?", (b.cgroup,))
            insert_booking(self.db, b, with_id=True)

    def _error(self, exc: BaseException) -> LedgerError:
        """One line naming the state dir and the errno (found by a probe write when SQLite hides it)."""
        cause = exc if isinstance(exc, OSError) else _probe(self.state_dir)
        detail = str(exc)
        if cause is not None and cause.errno is not None:
            name = errno.errorcode.get(cause.errno, str(cause.errno))
            detail = f"{cause.strerror} ({name})" + ("" if cause is exc else f"; SQLite: {exc}")
        return LedgerError(f"state dir {self.state_dir}: {detail} (ledger {self.path})")

    # -- wake-ups: a change that may free room rings the waiter that can use it (local/wakeup.py) --
    def wake_next(self, host: str, after: int = 0) -> None:
        """Ring the first waiter of ``host`` after booking ``after`` (0: the head) that listens.

        Called after a release (from the head), an admission (from the one admitted: the room left
        may fit the next too) and a reclaim; a woken waiter that cannot get in passes it on only while
        those behind it still could (admission.wait_for_room). Never raises: the waiters' safety poll
        covers a ring that fails.
        """
        try:
            rows = self.db.execute("SELECT id FROM bookings WHERE host = ? AND state = 'waiting'"
                                   " AND id > ? ORDER BY id", (host, after)).fetchall()
        except sqlite3.Error:
            return
        if not rows:  # the usual case: nobody waits (and wakeup is not even imported)
            return
        from dispatch.local import wakeup

        deaf = False
        for (waiter,) in rows:
            answer = wakeup.ring(self.state_dir, waiter, reclaim=deaf)
            if answer == wakeup.RUNG:
                return
            deaf = deaf or answer == wakeup.DEAF

    # -- bookings --
    def _rows(self, where: str, params: tuple[object, ...]) -> list[Booking]:
        cur = self.db.execute(f"SELECT {BOOKING_COLUMNS} FROM bookings WHERE {where} ORDER BY id", params)
        return [Booking(*row) for row in cur.fetchall()]

    @_guarded
    def enqueue(
        self, *, host: str, label: str, pid: int, pid_start: int, size: int, cap: int, kind: str,
        command: str, session: str | None, cgroup: str | None = None, gpu_bytes: int | None = None,
        group: str | None = None, when_idle: bool = False,
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO bookings (host, label, state, pid, pid_start, size, cap, kind, command,"
            " session, queued, cgroup, gpu_bytes, grp, when_idle)"
            " VALUES (?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (host, storable(label), pid, pid_start, size, cap, kind, storable(command),
             None if session is None else storable(session), time.time(), cgroup, gpu_bytes,
             None if group is None else storable(group), int(when_idle)),
        )
        assert cur.lastrowid is not None
        self._track(cur.lastrowid)
        return cur.lastrowid

    def _track(self, booking_id: int) -> None:
        rows = self._rows("id = ?", (booking_id,))
        if rows:
            self._mine[booking_id] = rows[0]

    def _reclaim_locked(self, host: str) -> list[Booking]:
        stale = [b for b in self._rows("host = ?", (host,)) if not is_alive(b.pid, b.pid_start)]
        if stale:
            self.db.executemany("DELETE FROM bookings WHERE id = ?", [(b.id,) for b in stale])
        return stale

    def _evaluate(self, booking_id: int, host: str, room: RoomFunction,
                  gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None,
                  backfill: bool = False) -> Admission:
        rows = self._rows("host = ?", (host,))
        running = [b for b in rows if b.state == "running"]
        me = next((b for b in rows if b.id == booking_id), None)
        if me is None:
            raise LookupError(f"booking {booking_id} vanished from the ledger")
        earlier = [b for b in rows if b.state == "waiting" and b.id < booking_id]
        # A waiter held by a queue policy (its group's cap, --when-idle) reserves no memory: the jobs
        # of other groups behind it may start. Within a group FIFO holds, as the cap holds them all.
        held = {b.id for b in earlier if policy_block(b, running, groups) is not None}
        # A waiter that is stopped (Ctrl-Z, SIGSTOP) cannot take its turn: it holds nobody up. When
        # it is resumed it is at its place in the queue again.
        held |= {b.id for b in earlier if is_stopped(b.pid)}
        ahead = sum(b.size for b in earlier if b.id not in held)
        free, machine = room(running)
        if me.state == "running":
            return Admission(True, me.size, free, ahead, len(earlier), running, [],
                             gpu_need=me.gpu_bytes or 0, gpu_device=me.gpu_index)
        policy = policy_block(me, running, groups)
        memory_ok = free - ahead >= me.size
        extra: dict[str, Any] = {"machine": machine}
        if backfill and not memory_ok:  # FIFO would hold it: may it jump a blocked head (EASY)?
            later = [b for b in rows if b.state == "waiting" and b.id > booking_id
                     and policy_block(b, running, groups) is None]
            extra.update(self._easy(me, [b for b in earlier if b.id not in held], later, running, free,
                                    host))
            memory_ok = extra.pop("admit")
        if not me.gpu_bytes:
            return Admission(memory_ok and policy is None, me.size, free, ahead, len(earlier), running,
                             [], memory_ok=memory_ok, policy=policy, **extra)
        rooms = gpu_room(running) if gpu_room is not None else {}
        device, gpu_free, gpu_ahead, gpu_ok = choose_gpu(rooms, [b.gpu_bytes for b in earlier
                                                                 if b.gpu_bytes], me.gpu_bytes)
        return Admission(memory_ok and gpu_ok and policy is None, me.size, free, ahead, len(earlier),
                         running, [], gpu_need=me.gpu_bytes, gpu_device=device, gpu_free=gpu_free,
                         gpu_ahead=gpu_ahead, memory_ok=memory_ok, gpu_ok=gpu_ok, policy=policy, **extra)

    def _easy(self, me: Booking, earlier: list[Booking], later: list[Booking], running: list[Booking],
              free: int, host: str) -> dict[str, Any]:
        """The backfill verdict (``dispatch.local.backfill.decide``) as Admission fields, with the
        labels' recorded durations read in the same transaction."""
        from dispatch.local import backfill

        durations = {label: d for label, d in self.db.execute(
            "SELECT label, max_duration FROM peaks WHERE host = ? AND max_duration IS NOT NULL"
            " AND label IN (SELECT label FROM bookings WHERE host = ?)", (host, host))}
        now = time.time()
        verdict = backfill.decide(me, earlier, running, free, durations, now)
        pass_on = not verdict.admit and any(
            not b.gpu_bytes and b.label in durations and b.size <= free for b in later)
        out: dict[str, Any] = {"admit": verdict.admit, "pass_on": pass_on}
        head, sh = verdict.head, verdict.shadow
        if head is None or sh is None:
            return out
        start = "never by the estimates" if sh.at == backfill.INF else f"in ~{max(0.0, sh.at - now):.0f}s"
        named = f"head {head.label} (booking {head.id}, need {format_size(head.size)}, room {start})"
        duration = durations.get(me.label)
        if verdict.admit and duration is not None:
            rule = ("ends before it" if verdict.how == "ends"
                    else f"fits the {format_size(sh.extra)} left beside it")
            out["backfill"] = (f"BACKFILL {me.label} (booking {me.id}, need {format_size(me.size)}, "
                               f"est {backfill.estimate(duration):.0f}s) ahead of {named}: {rule}")
        elif me.size <= verdict.room:  # it would fit now: only the head's reservation holds it
            if me.gpu_bytes:
                why = "a GPU job does not jump"
            elif duration is None:
                why = "no recorded duration"
            else:
                why = (f"est {backfill.estimate(duration):.0f}s outlasts it and "
                       f"{format_size(sh.extra)} is left beside it")
            out["head"] = f"waiting for {named}: {why}"
        return out

    @_guarded
    def peek(self, booking_id: int, host: str, room: RoomFunction,
             gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None,
             backfill: bool = False) -> Admission:
        """Would ``try_admit`` admit now? A plain read: takes no lock and changes nothing.

        Waiters peek on every change and lock only when they could get in (or once a second, to
        reclaim stale bookings), so a release does not send every waiter into the write lock.
        """
        return self._evaluate(booking_id, host, room, gpu_room, groups, backfill)

    @_guarded
    def try_admit(self, booking_id: int, host: str, room: RoomFunction,
                  gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None,
                  reason: Callable[[Admission], str] | None = None, backfill: bool = False
                  ) -> Admission:
        """Admit ``booking_id`` if ``room(running)`` minus what earlier waiters need covers its size.

        ``room`` gets the running bookings and returns the room for a new one (``Room``: the slice's
        limit - booked - cache-free usage above the bookings, or the machine's available memory less
        what running bookings have yet to use, whichever is less). Reserving room for every earlier waiter
        keeps FIFO: a later job can only start when it cannot delay an earlier one. Stale bookings are
        reclaimed first, in the same transaction.

        A booking with ``gpu_bytes`` also needs a GPU: ``gpu_room`` gets the running bookings and
        returns the VRAM room per device index (see ``choose_gpu``); the device chosen is recorded
        in ``gpu_index`` in the same transaction.

        ``backfill`` (queue_policy "backfill"): a job FIFO holds may still start ahead of a blocked
        head when its recorded duration says it cannot delay it (``dispatch.local.backfill``); the
        queue log gets a ``BACKFILL`` line.

        ``reason``: when not admitted, the waiting reason to store (``hostrun ledger`` shows it),
        written in the same transaction: one write lock per try, which matters when many arrive.
        """
        try:  # BEGIN inside: a signal's exception raised right after it must still roll back
            self.db.execute("BEGIN IMMEDIATE")
            reclaimed = self._reclaim_locked(host)
            adm = self._evaluate(booking_id, host, room, gpu_room, groups, backfill)
            skipped = self._passed_over(booking_id, host, adm, groups) if adm.admitted else []
            if adm.admitted and adm.backfill:
                skipped.append(adm.backfill)
            if adm.admitted:
                self.db.execute(
                    "UPDATE bookings SET state = 'running', since = ?, reason = NULL,"
                    " gpu_index = coalesce(gpu_index, ?) WHERE id = ? AND state = 'waiting'",
                    (time.time(), adm.gpu_device if adm.gpu_need else None, booking_id),
                )
                if booking_id in self._mine:
                    self._track(booking_id)
            elif reason is not None:
                text = reason(adm)
                self.db.execute("UPDATE bookings SET reason = ? WHERE id = ? AND reason IS NOT ?",
                                (text, booking_id, text))
            self.db.execute("COMMIT")
        except BaseException:
            _rollback(self.db)
            raise
        if reclaimed:
            from dispatch.local import wakeup

            for b in reclaimed:
                wakeup.remove(self.state_dir, b.id)
            self.wake_next(host)
        elif adm.admitted:
            self.wake_next(host, booking_id)
        if skipped:
            self.log(skipped)
        return adm._replace(reclaimed=reclaimed)

    def _passed_over(self, booking_id: int, host: str, adm: Admission,
                     groups: Mapping[str, int] | None) -> list[str]:
        """``SKIP`` lines for the earlier waiters this admission passes over, with their reasons."""
        rows = self._rows("host = ? AND state = 'waiting' AND id < ?", (host, booking_id))
        lines = []
        for b in rows:
            why = policy_block(b, adm.holders, groups)
            if why is None:
                why = f"memory {b.label} need {format_size(b.size)} free {format_size(max(0, adm.free))}"
            lines.append(f"SKIP {why} (booking {b.id}, passed by booking {booking_id})")
        return lines

    def log(self, lines: list[str]) -> None:
        """Append to the queue log in the state dir (private; one line per event)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        data = "".join(f"{stamp} {line}\n" for line in lines).encode()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @_guarded
    def release(self, booking_id: int) -> None:
        """Delete the booking (running or waiting), then ring the head of its host's queue.

        A transaction left open (an exception between BEGIN and its handler) is rolled back first:
        else the delete would go into it and be lost with it, leaving the row to be reclaimed.
        """
        if self.db.in_transaction:
            _rollback(self.db)
        row = self.db.execute("SELECT host, state FROM bookings WHERE id = ?", (booking_id,)).fetchone()
        self.db.execute("DELETE FROM bookings WHERE id = ?", (booking_id,))
        self._mine.pop(booking_id, None)
        if row is not None:
            if row[1] == "waiting":
                from dispatch.local import wakeup

                wakeup.remove(self.state_dir, booking_id)
            self.wake_next(row[0])

    @_guarded
    def booking(self, booking_id: int) -> Booking | None:
        rows = self._rows("id = ?", (booking_id,))
        return rows[0] if rows else None

    @_guarded
    def bookings(self, host: str | None = None) -> list[Booking]:
        return self._rows("host = ?", (host,)) if host else self._rows("1 = 1", ())

    # -- peak table --
    @_guarded
    def peak(self, label: str, host: str) -> PeakRecord | None:
        row = self.db.execute(
            f"SELECT {PEAK_COLUMNS} FROM peaks WHERE label = ? AND host = ?", (label, host),
        ).fetchone()
        return peak_record(row) if row else None

    @_guarded
    def peaks(self) -> list[PeakRecord]:
        return self._peaks()

    def _peaks(self) -> list[PeakRecord]:
        rows = self.db.execute(f"SELECT {PEAK_COLUMNS} FROM peaks ORDER BY host, label").fetchall()
        return [peak_record(r) for r in rows]

    @_guarded
    def peak_runs(self, host: str | None = None) -> list[PeakRun]:
        """The peak history (oldest first per label), of one host or all."""
        return self._peak_runs(host)

    def _peak_runs(self, host: str | None = None) -> list[PeakRun]:
        where, params = ("WHERE host = ?", (host,)) if host else ("", ())
        rows = self.db.execute(
            "SELECT label, host, peak, cap, hit_ceiling, duration, at FROM peak_runs"
            f" {where} ORDER BY host, label, id", params
        ).fetchall()
        return [PeakRun(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in rows]

    def record_peak(
        self, label: str, host: str, peak: int, hit_ceiling: bool, duration: float, *,
        cap: int | None, event: str = NO_EVENT, clear_after: int = CLEAR_MARK_AFTER,
        run: RunRecord | None = None, keep: tuple[float, int] = (90.0, 100_000),
        vram: int | None = None,
    ) -> None:
        """Fold one run into the peak table and append it to the history (``cap``: the job's own
        cap, None when it had none), in one transaction; only the last PEAK_HISTORY runs are kept.
        ``event`` and ``clear_after`` set or clear the label's mark (``ledgerdb.record_fold``).
        ``run``: its row in the run history, written in the same transaction (``keep``: days, rows).
        ``vram``: the most VRAM the run used, when it was measured (a ``--gpu-memory`` run).

        The run goes to the journal too, inside the write lock. When the ledger fails, it still goes
        there (then a recovery replays it, so the retry after one only writes the history row).
        """
        now = time.time()
        line = peakjournal.run_line(label, host, peak, cap, hit_ceiling, duration, now,
                                    event=event, clear_after=clear_after, vram=vram)
        journaled: list[bool] = []

        def record() -> None:
            if journaled:  # the peak was replayed from the journal by the recovery
                if run is not None:
                    self._locked(lambda: record_run(self.db, run, keep[0], keep[1], now))
                return
            try:
                self.db.execute("BEGIN IMMEDIATE")
                record_fold(self.db, label, host, peak, hit_ceiling, duration, cap, now, event,
                            clear_after, vram)
                if run is not None:
                    record_run(self.db, run, keep[0], keep[1], now)
                size = peakjournal.append(self.journal_path, line)
                journaled.append(True)
                self._compact_if_due(size)
                self.db.execute("COMMIT")
            except BaseException as exc:
                _rollback(self.db)
                if not journaled and isinstance(exc, sqlite3.DatabaseError):
                    peakjournal.append(self.journal_path, line)
                    journaled.append(True)
                raise

        self._do(record)

    def _compact_if_due(self, size: int) -> None:
        if size <= peakjournal.COMPACT_AT:
            return
        lines = self.db.execute("SELECT (SELECT count(*) FROM peaks) + (SELECT count(*) FROM peak_runs)"
                                ).fetchone()[0]
        if peakjournal.wants_compaction(size, lines):
            peakjournal.write_snapshot(self.journal_path, self._peaks(), self._peak_runs())

    # -- run history --
    @_guarded
    def record_run(self, run: RunRecord, keep: tuple[float, int]) -> None:
        """One row of the run history, for a run without a measured peak (or run elsewhere)."""
        self._locked(lambda: record_run(self.db, run, keep[0], keep[1], time.time()))

    @_guarded
    def runs(self, *, label: str | None = None, host: str | None = None,
             session: str | None = None, since: float | None = None, limit: int = 0
             ) -> list[RunRecord]:
        """The run history, oldest first; ``limit`` > 0: only the latest that many; ``since``: runs
        that ended at or after that time."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("label", label), ("host", host), ("session", session)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("ended >= ?")
            params.append(since)
        text = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self.db.execute(f"SELECT id, {RUN_COLUMNS} FROM runs {text} ORDER BY id DESC LIMIT ?",
                               (*params, limit if limit > 0 else -1)).fetchall()
        return [run_record(r) for r in reversed(rows)]
