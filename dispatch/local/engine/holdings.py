"""What an admission engine holds for its connections, beneath its requests and admission rounds
(``dispatch.local.engine.admitd``): each client's bookings (``Holder``), the ledger while any is
held (opened on demand, closed a grace after the last: ``settle``), this host's slice and room, and
what a client that drops leaves (its bookings released; a running one's holder watched until it
is gone, then its job ended: ``leftovers``). The engine leaves when idle, unless a client is on its
way (``idle``, under the start lock).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from dispatch.core.errors import HostrunError, LedgerError
from dispatch.core.procinfo import is_alive
from dispatch.local.admission.ledger import Ledger
from dispatch.local.engine.gpuwaits import GpuWaits
from dispatch.local.engine.leftovers import end_job, remove_if_empty
from dispatch.local.engine.lineserver import Connection, LineServer
from dispatch.local.engine.reach import log_path
from dispatch.local.store.ledgerfile import put_back_line

MYPY = False
if MYPY:
    from collections.abc import Mapping
    from typing import Any

    from dispatch.core.engineshape import Reply
    from dispatch.core.settings import Settings
    from dispatch.local.admission.policy import RoomFunction
    from dispatch.local.hostslice import LocalSlice
    from dispatch.local.store.ledgerdb import Booking

IDLE_AFTER = 30.0  # seconds with no connection before the engine leaves (HOSTRUN_ENGINE_IDLE)
IDLE_ENV = "HOSTRUN_ENGINE_IDLE"
TICK = 1.0  # seconds between re-evaluations while bookings wait (usage and MemAvailable move)
GRACE = 2.0  # seconds the ledger stays open after the last booking is released (``settle``)
ORPHAN_WATCH = 10.0  # seconds a dropped running booking's holder is looked at again (``orphans``)
NEAR = 16  # waiters this close to the head of the queue stay (or are made) whole: see ``park``
NEAR_ENV = "HOSTRUN_ENGINE_NEAR"  # another NEAR (tests: park with a few waiters)
MAX_CLIENTS = 8192  # a swarm's waiters, each one connection


class Holder(Connection):
    """A client: the bookings it holds (ids), and when each waiter was last told its status.
    Answers go out as ``marshal`` after their length (``admitclient.Link.receive``)."""

    @staticmethod
    def encode(message: Mapping[str, object]) -> bytes:
        import marshal

        data = marshal.dumps(dict(message))
        return len(data).to_bytes(4, "big") + data

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.bookings: dict[int, str] = {}  # id -> "waiting" | "running"
        self.interval: dict[int, float] = {}  # id -> its status_interval
        self.told: dict[int, float] = {}  # id -> when its last status line went out
        self.parked: set[int] = set()  # its waiters parked (``dispatch.local.engine.park``)
        self.told_soon: set[int] = set()  # its waiters told their turn is near


class Holdings(LineServer):
    """The connections of an engine and the bookings each holds (its requests: ``admitd.Engine``)."""

    name = "admission engine"
    max_clients = MAX_CLIENTS
    max_per_uid = MAX_CLIENTS
    tick = TICK
    request_errors = (HostrunError, OSError, ValueError, TypeError)
    frame = staticmethod(Holder.encode)
    shared = False  # the engine of a shared slice (``dispatch.local.shared.sharedd``)

    def __init__(self, listener: socket.socket, settings: Settings, path: str, lock: str) -> None:
        super().__init__(listener)
        self.settings = settings
        self.path = path
        self.lock = lock
        self.host = settings.local.name
        self._here: LocalSlice | None = None
        self._room: RoomFunction | None = None
        self._ledger: EngineLedger | None = None  # open only while it holds bookings (``settle``)
        self._unheld_since: float | None = None  # when the open ledger's last booking went
        self.log_path = log_path(settings.state_dir)
        self.waiting: set[int] = set()  # the held bookings that wait
        # Running bookings whose connection dropped: their job ended once the holder is gone
        # (``leftovers.end_job``), looked at at once and each tick (a killed holder's socket closes before
        # it is a zombie).
        self.orphans: dict[int, tuple[Booking, float]] = {}
        self.pids: dict[int, int] = {}  # each held booking's holder (its pid)
        self.gpu = GpuWaits()  # its --gpu-memory bookings' devices, and the GPUs' figures
        self.owner = os.geteuid()
        self.clients: dict[int, Holder] = {}
        self.asking: Holder | None = None  # the client whose request is being handled
        self.holders: dict[int, Holder] = {}  # booking id -> its client
        self.changed = True
        self.last_evaluation = 0.0
        self.idle_after = float(os.environ.get(IDLE_ENV) or IDLE_AFTER)
        self.near = int(os.environ.get(NEAR_ENV) or NEAR)
        self.listener_ino = os.stat(path).st_ino

    @property
    def here(self) -> LocalSlice:
        """This host's slice and cap backend, found at the first request that needs them: a
        backend that does not work here, or a reserve that leaves no slice, is that run's refusal
        in its own words (78), not an engine that cannot start."""
        if self._here is None:
            from dispatch.local.hostslice import LocalSlice

            self._here = LocalSlice(self.settings)
        return self._here

    @property
    def sessions_limit(self) -> int | None:
        """The sessions slice's limit, which holds agent sessions back (``policy_block``); None
        where the backend runs no sessions."""
        here = self.here
        if here.backend.session_form is None:
            return None
        return self.settings.sessions.limit(here.limit)

    @property
    def room(self) -> RoomFunction:
        if self._room is None:
            from dispatch.local.admission.rooms import room_function

            self._room = room_function(self.here.backend, self.here.limit)
        return self._room

    @property
    def ledger(self) -> EngineLedger:
        """The ledger, opened when a request needs it (its damage found and recovered then, as any
        run's open would) and closed by ``settle`` once no booking has been held for ``GRACE``
        seconds: a file held open would hide damage from the next run (a live WAL), and keep a
        read-only remount busy. The grace spares a run right after another the open, the trust
        checks and the WAL set-up (and the close its checkpoint)."""
        if self._ledger is None:
            self._ledger = EngineLedger(self.settings.state_dir, self._ledger_said,
                                        lambda: self.here.live_jobs(), self)
        return self._ledger

    def settle(self, now: bool = False) -> None:
        """Close the ledger once no booking has been held for ``GRACE`` seconds (at once with
        ``now``: the engine leaves); ``busy`` wakes the loop until then."""
        if self._ledger is None or self.holders:
            self._unheld_since = None
            return
        since = self._unheld_since
        if since is None:
            since = self._unheld_since = time.monotonic()
        if now or time.monotonic() - since >= GRACE:
            self._ledger.close()
            self._ledger = None
            self._unheld_since = None

    def _ledger_said(self, line: str) -> None:
        """What the ledger says (a recovery) goes to the log, to every run holding a booking, and
        to the run whose request opened it (a run booked here opens no ledger of its own)."""
        self.log(line)
        told = [*self.holders.values(), *([self.asking] if self.asking is not None else [])]
        for client in {id(c): c for c in told}.values():
            client.send({"op": "say", "line": line})

    def put_back(self, booking_ids: list[int], path: str) -> None:
        """Each run whose booking was put back after another process replaced the file is told so."""
        self.log(put_back_line(path, booking_ids))
        mine: dict[int, list[int]] = {}
        for booking_id in booking_ids:
            client = self.holders.get(booking_id)
            if client is not None:
                mine.setdefault(id(client), []).append(booking_id)
        for ids in mine.values():
            self.holders[ids[0]].send({"op": "say", "line": put_back_line(path, ids)})

    def refusal(self, exc: Exception) -> Reply:
        answer = super().refusal(exc)
        if isinstance(exc, LedgerError):  # the state dir's own words: the run says them as its own
            answer["kind"] = "ledger"
        elif isinstance(exc, HostrunError):  # a refusal of the run (243, 78): raised as it is there
            answer["class"] = type(exc).__name__
        return answer

    def log(self, text: str) -> None:
        """One line appended to the engine's log (opened per line: no descriptor held in the state dir)."""
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError:
            return
        try:
            line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {self.name}: {text}\n"
            os.write(fd, line.encode(errors="replace"))
        except OSError:
            pass
        finally:
            os.close(fd)

    def connection(self, sock: socket.socket, uid: int, pid: int, seq: int) -> Holder:
        if uid not in (self.owner, 0):
            raise ValueError(f"uid {uid} may not use the admission engine of uid {self.owner}")
        return Holder(sock, uid, pid, seq, self.dirty)

    def released(self, client: Holder, booking_id: int) -> None:
        """A booking its holder gave back (what a subclass does then: a shared slice's scope)."""

    def stored_label(self, client: Holder, label: str) -> str:
        """A run's label as this engine's ledger keeps it (a shared slice's: after its user's name)."""
        return label

    def owns(self, client: Holder, row: Booking) -> bool:
        """Whether the caller may take ``row`` back (``attach``): its own process's, or root."""
        return row.pid == client.pid or client.uid == 0

    def _hold(self, client: Holder, booking_id: int, state: str, interval: float, pid: int) -> None:
        client.bookings[booking_id] = state
        self.pids[booking_id] = pid
        if state == "waiting":
            self.waiting.add(booking_id)
        client.interval[booking_id] = interval
        self.holders[booking_id] = client
        self.ledger.track(booking_id)

    def _forget(self, client: Holder, booking_id: int) -> None:
        self.waiting.discard(booking_id)
        self.gpu.wants.pop(booking_id, None)
        self.pids.pop(booking_id, None)
        client.parked.discard(booking_id)
        client.told_soon.discard(booking_id)
        client.interval.pop(booking_id, None)
        client.told.pop(booking_id, None)
        if self.holders.get(booking_id) is client:
            del self.holders[booking_id]

    def dropped(self, client: Holder) -> None:
        """Its client is gone (ended, killed, its machine gone): what it held is released, and an
        admitted run's job cgroup removed if it is still empty (the run was killed, by SIGKILL,
        between its admission and its job's start: there is no guardian yet; once the job runs, its
        guardian ends it and removes the cgroup)."""
        if self.stopping:  # the engine ends (a restart): its bookings stay for the next one
            client.bookings.clear()
            return
        for booking_id, state in list(client.bookings.items()):
            self._forget(client, booking_id)
            try:
                row = self.ledger.booking(booking_id) if state == "running" else None
                self.ledger.release(booking_id)
            except HostrunError as exc:
                self.log(f"cannot release booking {booking_id}: {exc}")
                continue
            if row is not None:
                if not self.shared:  # its holder may be dying: its job ends with it (``orphans``)
                    self.orphans[booking_id] = (row, time.monotonic() + ORPHAN_WATCH)
                remove_if_empty(self.here.backend, row)
        if self.orphans:
            self._check_orphans()
        if client.bookings:  # a run that released before it closed changes nothing here
            self.changed = True
        client.bookings.clear()
        self.settle()

    def busy(self) -> bool:
        """Waiters to try, a ledger to close once its grace is over (``settle``), or holders that
        dropped their connection to look at again (``orphans``)."""
        return bool(self.waiting) or (self._ledger is not None and not self.holders) or bool(self.orphans)

    def _check_orphans(self) -> None:
        now = time.monotonic()
        for booking_id, (row, until) in list(self.orphans.items()):
            if not is_alive(row.pid, row.pid_start):
                del self.orphans[booking_id]
                end_job(self.here.backend, row)
            elif now > until:  # alive after all: it closed its connection and lives on
                del self.orphans[booking_id]

    def idle(self) -> bool:
        """Leave, unless a client is on its way: under the start lock (a starting client holds it)
        the socket is unlinked only when nothing waits in its backlog."""
        import fcntl

        try:
            fd = os.open(self.lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return True
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self._accept()
            if self.clients:
                return False
            try:
                if os.stat(self.path).st_ino == self.listener_ino:
                    os.unlink(self.path)
            except OSError:
                pass
            return True
        finally:
            os.close(fd)


class EngineLedger(Ledger):
    """The ledger as the engine writes it: every booking it holds is put back after another process
    replaced a damaged file (each run told its own), and its holders are alive without a look at
    ``/proc`` (their connections are open)."""

    def __init__(self, state_dir: str, say: Callable[[str], None],
                 live_jobs: Callable[[], list[Booking]], engine: Holdings) -> None:
        self.engine = engine
        super().__init__(state_dir, say, live_jobs)

    def known_alive(self) -> set[int] | dict[int, Any]:
        """The bookings this engine holds: each one's connection is open, so its holder lives (its
        death closes the connection, and the engine releases it then): no ``/proc`` read for them."""
        return self.engine.holders

    def track(self, booking_id: int) -> None:
        """A booking this engine holds though another made it (an attach, an orphan's)."""
        self._do(lambda: self._track(booking_id))

    def put_back_said(self, booking_ids: list[int]) -> None:
        self.engine.put_back(booking_ids, self.path)

    def release(self, booking_id: int) -> None:
        self._mine.pop(booking_id, None)  # a booking ending is not put back if the file was replaced
        super().release(booking_id)
