"""The ledger: running bookings, the FIFO queue and the peak table, in SQLite (WAL) in state_dir.

Shared by every hostrun process on the host. Each admission decision is one ``BEGIN IMMEDIATE``
transaction, so two processes can never both take the same room, and a SIGKILL at any point leaves the
store consistent (SQLite rolls back the unfinished transaction). Bookings whose holder is gone (pid and
start time no longer match) are reclaimed inside the same transaction by whoever admits next.

This module stores; what an admission decides (FIFO, queue policies, backfill, the GPU) is
``dispatch.local.admission.policy``'s, asked inside that transaction. The connection, its schema and its
recovery from damage are ``dispatch.local.store.ledgerfile``'s (``LedgerFile``, the base class).

A job given ``--gpu-memory`` is booked on one GPU as well, in the same row and the same transaction:
``gpu_bytes`` is what it asked for, ``gpu_index`` the device it was admitted on (NULL while waiting).
The ledger never reads a GPU itself: the caller passes the room per device, read beforehand.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from dispatch.core.procinfo import is_alive, is_stopped
from dispatch.core.text import storable
from dispatch.local.admission import policy as admitpolicy
from dispatch.local.admission.lending import Ramp
from dispatch.local.admission.policy import Admission
from dispatch.local.store import peakjournal
from dispatch.local.store.ledgerdb import (
    CLEAR_MARK_AFTER,
    NO_EVENT,
    PEAK_COLUMNS,
    RUN_COLUMNS,
    Booking,
    NewBooking,
    PeakRecord,
    PeakRun,
    RunRecord,
    peak_record,
    peak_rows,
    peak_run_rows,
    record_fold,
    record_run,
    run_record,
)
from dispatch.local.store.ledgerfile import LedgerFile, guarded, rollback
from dispatch.local.store.ramp import decode as decode_ramp
from dispatch.local.store.sqlitec import sqlite3

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.local.admission.policy import GpuRoom, RoomFunction

GUESS_RUNS = 20  # a program's recent peaks a first run's guess goes on ...
GUESS_SCAN = 500  # ... found among this many latest history rows


def _stopped(b: Booking) -> bool:
    return is_stopped(b.pid)


class Ledger(LedgerFile):
    """The store's operations on bookings, peaks and runs; ``LedgerFile`` keeps it usable."""

    # -- bookings --
    @guarded
    def enqueue(self, new: NewBooking, booking_id: int | None = None) -> int:
        """A waiting booking, at the back of the queue; ``booking_id``: at the place of that
        released booking instead (a requeued job: AUTOINCREMENT never gives its id to another)."""
        (host, label, pid, pid_start, size, cap, kind, command, session, cgroup, gpu_bytes, group,
         when_idle, requeue) = new
        cur = self.db.execute(
            "INSERT INTO bookings (id, host, label, state, pid, pid_start, size, cap, kind, command,"
            " session, queued, cgroup, gpu_bytes, grp, when_idle, requeue)"
            " VALUES (?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (booking_id, host, storable(label), pid, pid_start, size, cap, kind, storable(command),
             None if session is None else storable(session), time.time(), cgroup, gpu_bytes,
             None if group is None else storable(group), int(when_idle), int(requeue)),
        )
        assert cur.lastrowid is not None
        self._track(cur.lastrowid)
        return cur.lastrowid

    def _reclaim_locked(self, host: str, booking_id: int) -> tuple[list[Booking], list[Booking]]:
        """Delete the bookings of ``host`` whose holder is gone (in the caller's transaction), among
        those the verdict on ``booking_id`` rests on: the running ones and the waiters up to it.
        (Those deleted, the host's rows left, in id order: what the same transaction reads next.)

        A stale waiter behind it holds no room and none of its place: the try of any waiter behind
        it, or a newcomer's first, reclaims it. Checking only these keeps the head's try, the one on
        the hand-off's path, from reading every waiter's ``/proc/PID/stat`` on a long queue; and only
        these rows are read (the waiters behind it, when needed: ``_later``)."""
        rows = self._rows("host = ? AND (state = 'running' OR id <= ?)", (host, booking_id))
        alive = self.known_alive()
        stale = [b for b in rows if (b.state == "running" or b.id <= booking_id)
                 and b.id not in alive and not is_alive(b.pid, b.pid_start)]
        if stale:
            self.db.executemany("DELETE FROM bookings WHERE id = ?", [(b.id,) for b in stale])
            gone = {b.id for b in stale}
            rows = [b for b in rows if b.id not in gone]
        return stale, rows

    def known_alive(self) -> set[int] | dict[int, Any]:
        """Bookings whose holder is known to live without a look at ``/proc`` (the admission
        engine's: their connections are open); none here."""
        return set()

    @guarded
    def peek_all(self, host: str, booking_ids: Sequence[int], room: RoomFunction,
                 groups: Mapping[str, int] | None = None, backfill: bool = False,
                 sessions: int | None = None) -> dict[int, Admission]:
        """What ``peek`` says of each of ``booking_ids`` (those still there), on one read of the
        rows, the room, the recorded durations and ramps, and each waiter's stopped state: the
        status of a long queue's waiters in one pass instead of one read (and write lock) each."""
        rows = self._rows("host = ?", (host,))
        got = room([b for b in rows if b.state == "running"])
        stopped: dict[int, bool] = {}
        cached: dict[str, Any] = {}

        def is_stopped_once(b: Booking) -> bool:
            if b.id not in stopped:
                stopped[b.id] = _stopped(b)
            return stopped[b.id]

        def once(key: str, read: Callable[[], Any]) -> Callable[[], Any]:
            def get() -> Any:
                if key not in cached:
                    cached[key] = read()
                return cached[key]
            return get

        durations = once("durations", lambda: self._durations(host)) if backfill else None
        ramps = once("ramps", lambda: self._ramps(host))
        now = time.time()
        found = {}
        for booking_id in booking_ids:
            try:
                found[booking_id] = admitpolicy.evaluate(
                    booking_id, rows, lambda _running: got, None, groups, stopped=is_stopped_once,
                    durations=durations, now=now, ramps=ramps, sessions=sessions)
            except LookupError:  # released meanwhile
                continue
        return found

    @guarded
    def store_reasons(self, reasons: Mapping[int, str]) -> None:
        """The waiting reasons of several waiters (``hostrun ledger`` shows them), one transaction."""
        if not reasons:
            return
        try:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("UPDATE bookings SET reason = ? WHERE id = ? AND state = 'waiting'"
                                " AND reason IS NOT ?", [(t, i, t) for i, t in reasons.items()])
            self.db.execute("COMMIT")
        except BaseException:
            rollback(self.db)
            raise

    def _evaluate(self, booking_id: int, host: str, room: RoomFunction,
                  gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None,
                  backfill: bool = False, rows: list[Booking] | None = None,
                  later: Callable[[], list[Booking]] | None = None,
                  sessions: int | None = None) -> Admission:
        """``admitpolicy.evaluate`` on this host's rows, read in the caller's transaction (with
        ``backfill``, the labels' recorded durations too, read only when FIFO holds the booking).
        ``rows``: those rows, already read in that transaction; ``later``: the waiters behind it
        when ``rows`` stops at it."""
        return admitpolicy.evaluate(
            booking_id, self._rows("host = ?", (host,)) if rows is None else rows, room, gpu_room,
            groups, stopped=_stopped, durations=(lambda: self._durations(host)) if backfill else None,
            now=time.time(), ramps=lambda: self._ramps(host), later_rows=later, sessions=sessions)

    def _later(self, host: str, booking_id: int) -> Callable[[], list[Booking]]:
        """The waiters of ``host`` behind ``booking_id``, read at the first call, then kept."""
        kept: list[list[Booking]] = []

        def read() -> list[Booking]:
            if not kept:
                kept.append(self._rows("host = ? AND state = 'waiting' AND id > ?", (host, booking_id)))
            return kept[0]

        return read

    def _ramps(self, host: str) -> dict[str, Ramp]:
        """The ramp profiles of the labels booked on ``host`` that have one (``lending``)."""
        out = {}
        for label, text, fastest, longest in self.db.execute(
                "SELECT label, ramp, min_duration, max_duration FROM peaks WHERE host = ? AND ramp"
                " IS NOT NULL AND min_duration > 0 AND max_duration IS NOT NULL"
                " AND label IN (SELECT label FROM bookings WHERE host = ?)", (host, host)):
            points = decode_ramp(text)
            if points is not None:
                out[label] = Ramp(points, fastest, longest)
        return out

    def _durations(self, host: str) -> dict[str, float]:
        """The longest recorded run of each label booked on ``host``."""
        return {label: d for label, d in self.db.execute(
            "SELECT label, max_duration FROM peaks WHERE host = ? AND max_duration IS NOT NULL"
            " AND label IN (SELECT label FROM bookings WHERE host = ?)", (host, host))}

    @guarded
    @guarded
    def try_admit(self, booking_id: int, host: str, room: RoomFunction,
                  gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None,
                  reason: Callable[[Admission], str] | None = None, backfill: bool = False,
                  sessions: int | None = None) -> Admission:
        """Admit ``booking_id`` if ``admitpolicy.evaluate`` says it may start, in one write
        transaction: stale bookings reclaimed first, then the verdict on the rows as they are then,
        then the row marked running (with ``gpu_index``, the GPU chosen).

        ``room``: running bookings -> the room for a new one (``Room``: the slice's, or the machine's
        when less; ``admission.room_function``); ``gpu_room``: running bookings -> VRAM room per
        device; ``groups``: the group caps; ``backfill``: queue_policy "backfill" (the queue log gets
        a ``BACKFILL`` line when a job jumps the head, ``SKIP`` lines for each waiter passed over);
        ``sessions``: the sessions slice's limit (``admitpolicy.policy_block``).

        ``reason``: when not admitted, the waiting reason to store (``hostrun ledger`` shows it),
        written in the same transaction: one write lock per try, which matters when many arrive.
        """
        try:  # BEGIN inside: a signal's exception raised right after it must still roll back
            self.db.execute("BEGIN IMMEDIATE")
            reclaimed, rows = self._reclaim_locked(host, booking_id)  # the rows up to it, once per try
            later = self._later(host, booking_id)
            adm = self._evaluate(booking_id, host, room, gpu_room, groups, backfill, rows, later, sessions)
            skipped = admitpolicy.passed_over(booking_id, [
                b for b in rows if b.state == "waiting" and b.id < booking_id], adm, groups, sessions
            ) if adm.admitted else []
            if adm.admitted and adm.backfill:
                skipped.append(adm.backfill)
            if adm.admitted and adm.lend:
                skipped.append(adm.lend)
            if adm.admitted:
                self.db.execute(
                    "UPDATE bookings SET state = 'running', since = ?, reason = NULL,"
                    " gpu_index = coalesce(gpu_index, ?), kind = CASE WHEN ? THEN 'gamble' ELSE kind"
                    " END WHERE id = ? AND state = 'waiting'",
                    (time.time(), adm.gpu_device if adm.gpu_need else None, adm.lend is not None,
                     booking_id),
                )
                if booking_id in self._mine:
                    self._track(booking_id)
            elif reason is not None:
                text = reason(adm)
                self.db.execute("UPDATE bookings SET reason = ? WHERE id = ? AND reason IS NOT ?",
                                (text, booking_id, text))
            self.db.execute("COMMIT")
        except BaseException:
            rollback(self.db)
            raise
        if skipped:
            self.log(skipped)
        return adm._replace(reclaimed=reclaimed)

    def log(self, lines: list[str]) -> None:
        """Append to the queue log in the state dir (private; one line per event)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        data = "".join(f"{stamp} {line}\n" for line in lines).encode()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @guarded
    def release(self, booking_id: int) -> None:
        """Delete the booking (running or waiting); the admission engine tries its waiters then.

        A transaction left open (an exception between BEGIN and its handler) is rolled back first:
        else the delete would go into it and be lost with it, leaving the row to be reclaimed.
        """
        if self.db.in_transaction:
            rollback(self.db)
        self.db.execute("DELETE FROM bookings WHERE id = ?", (booking_id,))
        self._mine.pop(booking_id, None)

    @guarded
    def set_cgroup(self, booking_id: int, path: str) -> None:
        """The job cgroup of an admitted booking, made once it was admitted (a run the admission
        engine booked before it made anything)."""
        self.db.execute("UPDATE bookings SET cgroup = ? WHERE id = ?", (path, booking_id))
        if booking_id in self._mine:
            self._track(booking_id)  # put back with it after a recovery

    @guarded
    def booking(self, booking_id: int) -> Booking | None:
        rows = self._rows("id = ?", (booking_id,))
        return rows[0] if rows else None

    @guarded
    def bookings(self, host: str | None = None) -> list[Booking]:
        return self._rows("host = ?", (host,)) if host else self._rows("1 = 1", ())

    # -- peak table --
    @guarded
    def peak(self, label: str, host: str) -> PeakRecord | None:
        row = self.db.execute(
            f"SELECT {PEAK_COLUMNS} FROM peaks WHERE label = ? AND host = ?", (label, host),
        ).fetchone()
        return peak_record(row) if row else None

    @guarded
    def peaks(self) -> list[PeakRecord]:
        return peak_rows(self.db)

    @guarded
    def guess_evidence(self, label: str, host: str, program: str
                       ) -> tuple[list[tuple[str, int]], list[int]]:
        """What ``booking.guess`` goes on for a label with no peak on ``host``: its peaks on other
        hosts (never an OOM-killed one: that says nothing of what it needs), and the peaks of the
        last ``GUESS_RUNS`` runs of ``program`` (the command's first word's name) on ``host``, from
        the last ``GUESS_SCAN`` rows of the run history (an index range: constant cost)."""
        elsewhere = [(h, p) for h, p in self.db.execute(
            "SELECT host, max_peak FROM peaks WHERE label = ? AND host != ? AND hit_ceiling = 0"
            " AND slice_full_at IS NULL AND max_peak > 0", (label, host))]
        rows = self.db.execute(
            "SELECT command, peak FROM runs WHERE id > (SELECT coalesce(max(id), 0) FROM runs) - ?"
            " AND host = ? AND peak IS NOT NULL AND outcome = 'exit' ORDER BY id DESC",
            (GUESS_SCAN, host)).fetchall()
        peaks = [peak for command, peak in rows
                 if os.path.basename(command.split(" ", 1)[0]) == program][:GUESS_RUNS]
        return elsewhere, peaks

    @guarded
    def peak_runs(self, host: str | None = None) -> list[PeakRun]:
        """The peak history (oldest first per label), of one host or all."""
        return peak_run_rows(self.db, host)

    def record_peak(
        self, label: str, host: str, peak: int, hit_ceiling: bool, duration: float, *,
        cap: int | None, event: str = NO_EVENT, clear_after: int = CLEAR_MARK_AFTER,
        run: RunRecord | None = None, keep: tuple[float, int] = (90.0, 100_000),
        vram: int | None = None, ramp: Sequence[int] | None = None,
    ) -> None:
        """Fold one run into the peak table and append it to the history (``cap``: the job's own
        cap, None when it had none), in one transaction; only the last PEAK_HISTORY runs are kept.
        ``event`` and ``clear_after`` set or clear the label's mark (``ledgerdb.record_fold``).
        ``run``: its row in the run history, written in the same transaction (``keep``: days, rows).
        ``vram``: the most VRAM the run used, when it was measured (a ``--gpu-memory`` run).
        ``ramp``: the run's ramp profile, when it recorded one (``ledgerdb.record_fold``).

        The run goes to the journal too, inside the write lock. When the ledger fails, it still goes
        there (then a recovery replays it, so the retry after one only writes the history row).
        """
        now = time.time()
        line = peakjournal.run_line(label, host, peak, cap, hit_ceiling, duration, now,
                                    event=event, clear_after=clear_after, vram=vram, ramp=ramp)
        journaled: list[bool] = []

        def record() -> None:
            if journaled:  # the peak was replayed from the journal by the recovery
                if run is not None:
                    self._locked(lambda: record_run(self.db, run, keep[0], keep[1], now))
                return
            try:
                self.db.execute("BEGIN IMMEDIATE")
                record_fold(self.db, label, host, peak, hit_ceiling, duration, cap, now, event,
                            clear_after, vram, ramp)
                if run is not None:
                    record_run(self.db, run, keep[0], keep[1], now)
                size = peakjournal.append(self.journal_path, line)
                journaled.append(True)
                self._compact_if_due(size)
                self.db.execute("COMMIT")
            except BaseException as exc:
                rollback(self.db)
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
            peakjournal.write_snapshot(self.journal_path, peak_rows(self.db), peak_run_rows(self.db))

    # -- run history --
    @guarded
    def record_run(self, run: RunRecord, keep: tuple[float, int]) -> None:
        """One row of the run history, for a run without a measured peak (or run elsewhere)."""
        self._locked(lambda: record_run(self.db, run, keep[0], keep[1], time.time()))

    @guarded
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
