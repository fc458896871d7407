"""The admission engine of a state dir: one resident process that queues and admits its runs.

Why: when hundreds of runs wait at once, each taking SQLite's write lock to try its turn loses to
the others' retries (``database is locked`` after the busy timeout: 480 of 1,000 submissions lost,
bench/bench_swarm.py). Here one process does every enqueue, try and release of its clients, one
at a time, so nobody waits on a lock, and it tells each waiter when it is admitted (one message:
no wake FIFO, no retry loop). A waiting run blocks in a read on its connection.

- **The store stays the ledger** (``Ledger``, SQLite): the engine is its writer for its clients, so
  ``hostrun status``, ``top`` and the other readers see what they saw, the rules are the same code
  (``admitpolicy``: FIFO with backfill, groups, when-idle, lending, marks, the machine's available
  memory, a ``--gpu-memory`` run's GPUs: nvidia-smi read here at most once a second while such a
  run waits). Every run of the state dir books here; the shared slice's engine is this one, run by
  root for several users (``dispatch.local.shared.sharedd``: its hooks ``stored_label``, ``owns``,
  ``released``).
- **A booking belongs to its connection**: a client that dies releases at once (its connection
  closes), with no ``/proc`` scan for staleness on the hand-off's path.
- **Its own death forgets nothing**: the bookings are in the ledger, so a new engine counts every
  running job as before; a waiting client re-attaches to it (``attach``) and keeps its place (its
  booking id). Nothing runs unbooked and nothing is admitted twice.
- **Zero set-up**: the first run that needs it starts it (``dispatch.local.engine.admitclient``: two at
  once start one, under an flock); it leaves after ``IDLE_AFTER`` seconds with no connection. Its
  socket is ``state_dir/admitd-<digest>.sock`` (the state dir is private to its owner: the trust
  rules of every state file), one engine per configuration (the digest of the settings it was given
  on stdin, so two configurations sharing a state dir each have theirs, both writing one ledger).
- **Bounds**: the line server's (``dispatch.local.engine.lineserver``); only its owner (or root) may connect.

Requests (JSON lines): ``hello`` (a run sends it with its first request, without waiting for its
answer); ``plan`` (a run's fields, ``RUN_FIELDS``, its gamble size and GPU want among them: its cap
checked, its booking planned and queued, answered ``queued`` with its id and plan, then ``wait``
lines with the status figures, at once and every ``status_interval``, and ``admitted``; ``soon``
once, when a waiting run's turn is near: a parked run resumes, a whole one loads what it needs once
admitted, off the hand-off's path);
``cgroup`` (the admitted run's job cgroup: the run reads the answer with its next one); ``park``
(declined for a waiter near its turn by then); ``attach`` (a booking this connection held, or held
on the engine before: its state); ``release`` (with the finished run's peak and history row, when
it ran: recorded, then released, one answer). Standard library only: it is shipped to peers with
the rest of the runtime.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable

from dispatch.core.errors import HostrunError, LedgerError
from dispatch.core.procinfo import is_alive, is_stopped
from dispatch.local.admission.booking import plan_of
from dispatch.local.admission.ledger import Ledger
from dispatch.local.engine.admitclient import PROTOCOL, lock_path, log_path, socket_path, unix_address
from dispatch.local.engine.lineserver import Connection, LineServer, raise_descriptor_limit
from dispatch.local.store.ledgerfile import put_back_line

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.settings import Settings
    from dispatch.local.admission.policy import Admission, GpuRoom, RoomFunction
    from dispatch.local.gpus.gpu import GpuSnapshot
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
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: no process id is larger
TEXT_MAX = 8192  # characters of a run's text fields (its command line is cut at 4,096 by the run)
MIN_DESCRIPTORS = 32  # its own (listener, selector, signal pipe, ledger and log) and a few runs
# What ``plan`` takes: a run before anything of it is made; the engine checks its cap against the
# slice, plans its booking from the ledger (``booking.plan_for``) and queues it (``admitclient``).
RUN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "host": str, "label": str, "pid": int, "pid_start": int, "cap": (int, type(None)), "no_cap": bool,
    "program": str, "command": str, "session": (str, type(None)), "group": (str, type(None)),
    "when_idle": bool, "booking_id": (int, type(None)), "requeue": bool, "gamble": int,
    "gpu": (list, type(None)),
}
GPU_DEVICES_MAX = 64  # device indices a --gpu-memory run may name (its CUDA_VISIBLE_DEVICES)


def admission_dict(adm: Admission) -> dict[str, Any]:
    """An ``Admission`` as JSON (its bookings as lists of their fields)."""
    data = adm._asdict()
    data["holders"] = [list(b) for b in adm.holders]
    data["reclaimed"] = [list(b) for b in adm.reclaimed]
    return data


class Holder(Connection):
    """A client: the bookings it holds (ids), and when each waiter was last told its status.
    Answers go out as ``marshal`` after their length (``admitclient.Link.receive``)."""

    @staticmethod
    def encode(message: dict[str, Any]) -> bytes:
        import marshal

        data = marshal.dumps(message)
        return len(data).to_bytes(4, "big") + data

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.bookings: dict[int, str] = {}  # id -> "waiting" | "running"
        self.interval: dict[int, float] = {}  # id -> its status_interval
        self.told: dict[int, float] = {}  # id -> when its last status line went out
        self.parked: set[int] = set()  # its waiters parked (``dispatch.local.engine.park``)
        self.told_soon: set[int] = set()  # its waiters told their turn is near


class Engine(LineServer):
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
        # (``_end_orphan``), looked at at once and each tick (a killed holder's socket closes before
        # it is a zombie).
        self.orphans: dict[int, tuple[Booking, float]] = {}
        self.pids: dict[int, int] = {}  # each held booking's holder (its pid)
        # A --gpu-memory booking's devices (its CUDA_VISIBLE_DEVICES; None: any), and the GPUs'
        # figures, read by nvidia-smi at most once a second while such a booking waits.
        self.gpu_wants: dict[int, frozenset[int] | None] = {}
        self.gpus: GpuSnapshot | None = None
        self.gpu_error: str | None = None
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

    def refusal(self, exc: Exception) -> dict[str, Any]:
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

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, client: Holder, message: dict[str, Any]) -> dict[str, Any] | None:
        self.asking = client
        failed = False
        try:
            return self._handle(client, message)
        except LedgerError:  # a full or read-only state dir: closed at once when no booking is held
            failed = True  # (its WAL deleted, the space it held freed for the run's own try)
            raise
        finally:
            self.asking = None
            self.settle(now=failed)

    def _handle(self, client: Holder, message: dict[str, Any]) -> dict[str, Any] | None:
        op = message.get("op")
        if op == "hello":
            return {"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "host": self.host}
        if op == "plan":
            return self.plan(client, message)
        if op == "cgroup":
            return self.cgroup(client, message)
        if op == "park":
            booking_id = _int(message.get("id"), "id")
            if client.bookings.get(booking_id) != "waiting":
                raise ValueError(f"booking {booking_id} is not a waiting booking of this connection")
            if sum(1 for b in self.waiting if b < booking_id) < self.near:  # its turn came near
                return {"op": "parked", "id": booking_id, "parked": False}
            client.parked.add(booking_id)
            client.told_soon.discard(booking_id)  # to be told again when its turn comes near
            return {"op": "parked", "id": booking_id, "parked": True}
        if op == "attach":
            return self.attach(client, message)
        if op == "release":
            return self.release(client, message)
        raise ValueError(f"unknown request {op[:40]!r}" if isinstance(op, str) else
                         "unknown request (op: hello, plan, cgroup, park, attach or release)")

    def _fields(self, client: Holder, message: dict[str, Any], key: str,
                spec: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
        fields = message.get(key)
        if not isinstance(fields, dict) or set(fields) != set(spec):
            raise ValueError(f"{key}: an object with {', '.join(sorted(spec))}")
        for name, kind in spec.items():
            value = fields[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{key}: {name} of the wrong type")
        for name, value in fields.items():
            if isinstance(value, bool) and spec[name] is not bool:
                raise ValueError(f"{key}: {name} of the wrong type")
            if isinstance(value, int) and not isinstance(value, bool) and not (
                    (0 if name == "pid_start" else 1) <= value < (PID_MAX if name == "pid" else 1 << 62)):
                raise ValueError(f"{key}: {name} out of range")
            if isinstance(value, str) and len(value) > TEXT_MAX:
                raise ValueError(f"{key}: {name} longer than {TEXT_MAX} characters")
        if fields["host"] != self.host:
            raise ValueError(f"{key}: this engine admits for host {self.host!r}")
        if fields["pid"] != client.pid and client.uid != 0:
            raise ValueError(f"{key}: pid must be the caller's own")
        return fields

    def _orphan(self, client: Holder, message: dict[str, Any], fields: dict[str, Any]) -> Booking | None:
        """The booking an engine that died before it answered made for this run (by its pid), now
        held by this connection: the same booking, its place kept."""
        label = self.stored_label(client, fields["label"])
        orphan = next((b for b in self.ledger.bookings(self.host) if b.id not in self.holders
                       and (b.pid, b.pid_start, b.label) == (fields["pid"], fields["pid_start"], label)),
                      None)
        if orphan is not None:
            self._hold(client, orphan.id, orphan.state, self._interval(message), orphan.pid)
            self.changed = True
        return orphan

    def plan(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        """A run asks to be booked before it has made anything: its cap checked against this host's
        slice (78, 243 as the run would say them), its booking planned from the ledger as the run
        would (``booking.plan_for``), queued. A host whose slice is a shared one books through that
        slice's engine (``dispatch.local.shared.sharedd``), not this one."""
        from dispatch.local.admission.booking import gamble_line, plan_for

        fields = self._fields(client, message, "run", RUN_FIELDS)
        interval = self._interval(message)  # checked before anything is queued
        gpu = _gpu_want(fields["gpu"])
        if gpu is not None and self.shared:
            raise ValueError("gpu: the shared slice's engine books memory only")
        here = self.here
        if here.backend.name == "shared" and not self.shared:
            raise ValueError("this host's slice is a shared slice: a run books through its engine")
        cap = here.checked_cap(fields["cap"], fields["no_cap"])
        limit = here.limit_for(cap)
        orphan = self._orphan(client, message, fields)
        if orphan is not None:
            if gpu is not None:
                self.gpu_wants[orphan.id] = gpu[1]
            return {"op": "queued", "id": orphan.id, "plan": list(plan_of(orphan))}
        label, host = self.stored_label(client, fields["label"]), self.host
        plan = plan_for(self.ledger, host, label, fields["program"], cap, limit,
                        fields["gamble"], fields["requeue"])
        booking_id = self.ledger.enqueue(
            host=host, label=label, pid=fields["pid"], pid_start=fields["pid_start"], size=plan.size,
            cap=plan.limit, kind=plan.kind, command=fields["command"], session=fields["session"],
            cgroup=None, group=fields["group"], when_idle=fields["when_idle"],
            booking_id=fields["booking_id"], requeue=fields["requeue"],
            gpu_bytes=gpu[0] if gpu is not None else None)
        if gpu is not None:
            self.gpu_wants[booking_id] = gpu[1]
        if plan.why is not None:
            self.ledger.log([gamble_line(label, booking_id, plan)])
        self._hold(client, booking_id, "waiting", interval, fields["pid"])
        self.changed = True
        return {"op": "queued", "id": booking_id, "plan": list(plan)}

    def release(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        """A run gives its booking back (one answer). A run that ran sends its peak and history
        row with it (``admitclient.Link.release``), checked whole, then written before the release,
        for the label and host of the booking, with this engine's own ``clear_mark_after`` and
        history limits: the run opens no ledger of its own and never waits on its lock. A record
        the ledger refuses (a full disk) is one warning said to the run; the release goes on."""
        from dispatch.local.store.ledgerdb import unrecorded_line

        booking_id = _int(message.get("id"), "id")
        state = client.bookings.get(booking_id)
        if state is None:
            raise ValueError(f"booking {booking_id} is not this connection's")
        fields = message.get("record")
        if fields is not None:
            try:
                write = self._record(client, booking_id, state, fields)
                if write is not None:
                    write()
            except LedgerError as exc:
                client.send({"op": "say", "line": unrecorded_line(exc)})
        del client.bookings[booking_id]
        self._forget(client, booking_id)
        self.released(client, booking_id)
        self.ledger.release(booking_id)
        self.changed = True
        return {"op": "released", "id": booking_id}

    def _record(self, client: Holder, booking_id: int, state: str, fields: object
                ) -> Callable[[], None] | None:
        """A finished run's record (``Link.record_peak``/``record_run``), checked: what writes it,
        or None (said to the run) when its booking's row is gone."""
        from dispatch.local.store.ledgerdb import (
            CLEAN,
            FAILED,
            NO_EVENT,
            OOM_KILLED,
            SLICE_FULL,
            RunRecord,
            unrecorded_line,
        )

        if state != "running":
            raise ValueError(f"record: booking {booking_id} is not a running booking of this connection")
        if not isinstance(fields, dict):
            raise ValueError("record: an object")
        run_fields = fields.get("run")
        run = None if run_fields is None else RunRecord(*_checked_list(run_fields, RUN_RECORD_TYPES, "run"))
        keep = self.settings.history_keep
        call = fields.get("call")
        peak_args: tuple[int, bool, float, int | None, str, int | None, list[int] | None] | None = None
        if call == "run":
            if run is None:
                raise ValueError("run: a history row")
        elif call == "peak":
            peak, duration, cap, vram = (fields.get(k) for k in ("peak", "duration", "cap", "vram"))
            event, ramp, hit = fields.get("event"), fields.get("ramp"), fields.get("hit_ceiling")
            if not isinstance(peak, int) or not _size(peak) or not (cap is None or _size(cap)) \
                    or not (vram is None or _size(vram)):
                raise ValueError("peak, cap, vram: bytes")
            if isinstance(duration, bool) or not isinstance(duration, (int, float)) \
                    or not 0 <= duration < 1e9:
                raise ValueError("duration: seconds")
            if event not in (CLEAN, FAILED, NO_EVENT, OOM_KILLED, SLICE_FULL) or not isinstance(hit, bool):
                raise ValueError("event, hit_ceiling: of the wrong kind")
            if ramp is not None and not (isinstance(ramp, list) and len(ramp) <= 64
                                         and all(_size(v) for v in ramp)):
                raise ValueError("ramp: up to 64 sizes")
            peak_args = (peak, hit, float(duration), cap, str(event), vram, ramp)
        else:
            raise ValueError("call: run or peak")
        row = self.ledger.booking(booking_id)
        if row is None:
            client.send({"op": "say", "line": unrecorded_line(f"booking {booking_id} is gone")})
            return None
        if run is not None and (self.stored_label(client, run.label), run.host) != (row.label, row.host):
            raise ValueError("run: not the label and host of this connection's booking")
        if run is not None:
            run = run._replace(label=row.label)
        if peak_args is None:
            assert run is not None
            return lambda: self.ledger.record_run(run, keep)
        peak, hit, duration, cap, event, vram, ramp = peak_args
        return lambda: self.ledger.record_peak(
            row.label, row.host, peak, hit, duration, cap=cap, event=event,
            clear_after=self.settings.clear_mark_after, run=run, keep=keep, vram=vram, ramp=ramp)

    def cgroup(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        """An admitted run made its job's cgroup: the booking names it (its usage counts from now,
        and a recovery re-books it by it)."""
        booking_id = _int(message.get("id"), "id")
        path = message.get("path")
        if client.bookings.get(booking_id) != "running":
            raise ValueError(f"booking {booking_id} is not a running booking of this connection")
        if not isinstance(path, str) or not 0 < len(path) <= 4096:
            raise ValueError("path: the job's cgroup directory")
        self.ledger.set_cgroup(booking_id, path)
        return {"op": "cgroup", "id": booking_id}

    def attach(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        """A client of an engine that died takes its booking back; a waiting one keeps its place."""
        booking_id = _int(message.get("id"), "id")
        row = self.ledger.booking(booking_id)
        if row is None:
            return {"op": "attached", "id": booking_id, "state": "gone"}
        if not self.owns(client, row):
            raise ValueError(f"booking {booking_id} is not the caller's")
        other = self.holders.get(booking_id)
        if other is not None and other is not client:
            raise ValueError(f"booking {booking_id} is held by another connection")
        gpu = _gpu_want(message.get("gpu"))
        self._hold(client, booking_id, row.state, self._interval(message), row.pid)
        if row.gpu_bytes:  # the devices it may have: as the run names them again (all, if it does not)
            self.gpu_wants[booking_id] = gpu[1] if gpu is not None else None
        client.parked.discard(booking_id)  # a parked run, whole again on the same connection
        self.changed = True
        return {"op": "attached", "id": booking_id, "state": row.state, "plan": list(plan_of(row)),
                "gpu_index": row.gpu_index}

    def released(self, client: Holder, booking_id: int) -> None:
        """A booking its holder gave back (what a subclass does then: a shared slice's scope)."""

    def stored_label(self, client: Holder, label: str) -> str:
        """A run's label as this engine's ledger keeps it (a shared slice's: after its user's name)."""
        return label

    def owns(self, client: Holder, row: Booking) -> bool:
        """Whether the caller may take ``row`` back (``attach``): its own process's, or root."""
        return row.pid == client.pid or client.uid == 0

    def _interval(self, message: dict[str, Any]) -> float:
        interval = message.get("status_interval", self.settings.status_interval)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not 0.05 <= interval <= 86400:
            raise ValueError("status_interval: seconds, 0.05 to 86400")
        return float(interval)

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
        self.gpu_wants.pop(booking_id, None)
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
                self._remove_if_empty(row)
        if self.orphans:
            self._check_orphans()
        if client.bookings:  # a run that released before it closed changes nothing here
            self.changed = True
        client.bookings.clear()
        self.settle()

    def _end_orphan(self, row: Booking) -> None:
        """A running booking whose holder died: its job is ended and its cgroup removed, as its
        guardian would; the guardian may have died with it (a session's whole cgroup killed takes
        the holders and guardians of the jobs the session started: they run in it), and a job left
        running would run on unbooked."""
        from dispatch.local.admission.rooms import booking_job

        try:
            job = booking_job(self.here.backend, row)
            if job is not None:
                job.kill_all()
                job.remove()
        except (OSError, HostrunError):
            pass  # gone already (its guardian was quicker), or not this slice's
        self._remove_if_empty(row)

    def _remove_if_empty(self, row: Booking) -> None:
        """The job cgroup of ``row``'s holder, removed when empty: the one the row names, or, when
        the run died before it could say (its ``cgroup`` is sent without waiting), the one its
        holder makes by name (``create_job("<pid>-<start>")``); only ever that holder's own
        (``admission.booking_job``: a row naming another's cgroup gets nothing removed)."""
        from dispatch.local.admission.rooms import booking_job

        backend = self.here.backend
        rows = [row]
        if not row.cgroup and backend.slice_dir:  # a job's name in the slice, a session's in its own
            holder = f"{row.pid}-{row.pid_start}"
            rows = [row._replace(cgroup=os.path.join(backend.slice_dir, backend.job_name(holder)))]
            if backend.sessions_dir:
                rows.append(row._replace(cgroup=os.path.join(backend.sessions_dir,
                                                              backend.session_name(holder))))
        for named in rows:
            try:
                job = booking_job(backend, named)
                if job is not None and not job.pids():
                    job.remove()
            except (OSError, HostrunError):
                pass  # not empty after all, or already gone

    # -- admission --------------------------------------------------------------------------------

    def busy(self) -> bool:
        """Waiters to try, a ledger to close once its grace is over (``settle``), or holders that
        dropped their connection to look at again (``orphans``)."""
        return bool(self.waiting) or (self._ledger is not None and not self.holders) or bool(self.orphans)

    def _check_orphans(self) -> None:
        now = time.monotonic()
        for booking_id, (row, until) in list(self.orphans.items()):
            if not is_alive(row.pid, row.pid_start):
                del self.orphans[booking_id]
                self._end_orphan(row)
            elif now > until:  # alive after all: it closed its connection and lives on
                del self.orphans[booking_id]

    def evaluate(self) -> None:
        """The waiters this engine holds, in queue order, each tried as ``Ledger.try_admit`` would
        for it; after the first that cannot go and lets nobody pass, the rest are only told where
        they stand when their status is due: all of those on one read of the ledger, without its
        write lock (``Ledger.peek_all``), their reasons stored in one transaction (``hostrun ledger``
        shows them). Runs after a change, or every ``TICK``."""
        if self.orphans:
            self._check_orphans()
        now = time.monotonic()
        if not (self.changed or now - self.last_evaluation >= TICK):
            return
        self.changed = False
        self.last_evaluation = now
        if not self.waiting:
            self.settle()
            return
        from dispatch.local.admission.rooms import stop_reclaimed, wait_reason

        waiting = sorted(self.waiting)  # queue order: a booking's id (a requeued one keeps its own)
        if any(b in self.gpu_wants for b in waiting):
            self._read_gpus()
        groups = self.settings.groups
        backfill = self.settings.queue_policy == "backfill"
        sessions = self.sessions_limit
        trying = True
        due: list[int] = []
        for position, booking_id in enumerate(waiting):
            client = self.holders[booking_id]
            if not trying:  # behind a waiter that lets nobody pass: told where it stands when due
                if position < self.near:
                    self._soon(client, booking_id)
                if now - client.told.get(booking_id, 0.0) >= client.interval[booking_id] and not client.out:
                    due.append(booking_id)
                continue
            if is_stopped(self.pids[booking_id]):  # Ctrl-Z'd while it waits: passed over, holds nobody up
                continue
            try:
                adm = self.ledger.try_admit(booking_id, self.host, self.room, self._gpu_room(booking_id),
                                            groups, self._reason(booking_id), backfill, sessions)
            except LookupError:  # its row is not in the ledger (put back at the next operation)
                continue
            if adm.reclaimed:
                stop_reclaimed(self.here.backend, adm.reclaimed)
            if adm.admitted:
                client.bookings[booking_id] = "running"
                self.waiting.discard(booking_id)
                client.told.pop(booking_id, None)
                client.told_soon.discard(booking_id)
                row = self.ledger.booking(booking_id)
                client.send({"op": "admitted", "id": booking_id, "kind": row.kind if row else None,
                             "size": row.size if row else adm.need, "adm": admission_dict(adm),
                             "gpu_index": row.gpu_index if row else None})
                continue
            if position < self.near:
                self._soon(client, booking_id)
            trying = adm.policy is not None or adm.memory_ok or adm.pass_on
            if now - client.told.get(booking_id, 0.0) >= client.interval[booking_id] and not client.out:
                self._tell(booking_id, adm, position < self.near, now)
        if due:
            near = {booking_id: position < self.near for position, booking_id in enumerate(waiting)}
            found = self.ledger.peek_all(self.host, due, self.room, groups, backfill, sessions)
            for booking_id, adm in found.items():
                self._tell(booking_id, adm, near[booking_id], now)
            self.ledger.store_reasons({i: wait_reason(adm) for i, adm in found.items()})

    @staticmethod
    def _soon(client: Holder, booking_id: int) -> None:
        """Its turn is near, said once (not to a run admitted at once): a parked run resumes, a whole
        one loads what it needs once admitted."""
        if booking_id not in client.told_soon:
            client.told_soon.add(booking_id)
            client.parked.discard(booking_id)
            client.send({"op": "soon", "id": booking_id})

    def _tell(self, booking_id: int, adm: Admission, near: bool, now: float) -> None:
        """A waiter's status line (and whether its turn is near: else it may park)."""
        from dispatch.core.text import printable
        from dispatch.local.admission.rooms import status_line

        client = self.holders[booking_id]
        client.told[booking_id] = now
        gpu_error = self.gpu_error if booking_id in self.gpu_wants else None
        client.send({"op": "wait", "id": booking_id, "adm": admission_dict(adm),
                     "line": printable(status_line(adm, gpu_error=gpu_error)), "near": near})

    # -- GPUs -------------------------------------------------------------------------------------

    def _read_gpus(self) -> None:
        """The GPUs' figures, re-read at most once a second (``GpuSnapshot``), and per process when a
        running GPU booking could use them; a failed read is each GPU waiter's status."""
        from dispatch.core.errors import GpuError
        from dispatch.local.gpus.gpu import GpuSnapshot, read_gpus

        if self.gpus is None:
            try:
                self.gpus = GpuSnapshot(0, read_gpus())
            except GpuError as exc:
                self.gpu_error = str(exc)
                return
        self.gpus.refresh(lambda: any(self.holders[b].bookings.get(b) == "running"
                                      for b in self.gpu_wants if b in self.holders))
        self.gpu_error = self.gpus.error

    def _gpu_room(self, booking_id: int) -> GpuRoom | None:
        """A --gpu-memory booking's VRAM room per device, on the devices it may have."""
        if booking_id not in self.gpu_wants:
            return None
        allowed = self.gpu_wants[booking_id]
        snapshot = self.gpus
        if snapshot is None:
            return lambda running: {}
        from dispatch.local.admission.rooms import gpu_room_function

        rooms = gpu_room_function(self.here.backend, snapshot)
        return lambda running: {i: r for i, r in rooms(running).items()
                                if allowed is None or i in allowed}

    def _reason(self, booking_id: int) -> Callable[[Admission], str]:
        from dispatch.local.admission.rooms import wait_reason

        gpu_error = self.gpu_error if booking_id in self.gpu_wants else None
        return lambda adm: wait_reason(adm, gpu_error)

    # -- leaving when idle ------------------------------------------------------------------------

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
                 live_jobs: Callable[[], list[Booking]], engine: Engine) -> None:
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


_NUMBER = (int, float)
_TEXT = (str, type(None))
# RunRecord's fields as a run sends them, in order (ledgerdb.RunRecord, its id left out).
RUN_RECORD_TYPES: list[type | tuple[type, ...]] = [
    _NUMBER, _NUMBER, (int, float, type(None)), (int, float, type(None)), str, str, _TEXT, str,
    (int, type(None)), _TEXT, (int, type(None)), (int, type(None)), int, str, bool,
]


def _checked_list(value: object, types: list[type | tuple[type, ...]], what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != len(types):
        raise ValueError(f"{what}: a list of {len(types)} fields")
    for item, kind in zip(value, types):
        if not isinstance(item, kind) or (isinstance(item, bool) and kind is not bool):
            raise ValueError(f"{what}: a field of the wrong type")
    return value


def _gpu_want(value: object) -> tuple[int, frozenset[int] | None] | None:
    """A run's ``gpu`` field (``[need, [device index, ...]]``, None: no GPU) checked: the VRAM it
    books and the devices it may have."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
            and 0 < value[0] < 1 << 62 and isinstance(value[1], list)
            and 0 < len(value[1]) <= GPU_DEVICES_MAX
            and all(type(i) is int and 0 <= i < 1 << 16 for i in value[1])):
        raise ValueError(f"gpu: [VRAM in bytes, [up to {GPU_DEVICES_MAX} device indices]]")
    return value[0], frozenset(value[1])


def _size(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def _int(value: object, what: str) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{what}: a positive whole number")
    return value


def main(argv: list[str] | None = None) -> int:
    """``python3 -m dispatch.local.engine.admitd STATE_DIR DIGEST``, with the settings (marshal of
    ``Settings.to_normalized()``) on stdin: how ``admitclient`` starts it, detached."""
    import marshal

    from dispatch.core.settings import Settings
    from dispatch.guards import trust

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python3 -m dispatch.local.engine.admitd STATE_DIR DIGEST < settings", file=sys.stderr)
        return 2
    state_dir, digest = args
    settings = Settings.from_normalized(marshal.loads(sys.stdin.buffer.read()))
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    trust.check_existing_dir(state_dir, "state directory")
    path = socket_path(state_dir, digest)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        unix_address(path, listener, "bind")
    finally:
        os.umask(old)
    listener.listen(1024)
    limit = raise_descriptor_limit(MAX_CLIENTS + 64)
    if limit < MIN_DESCRIPTORS:  # it could not accept a run and open the ledger: say so, not idle
        os.unlink(path)
        print(f"its limit on open files is {limit} (the hard limit of the run that started it: "
              f"ulimit -n), fewer than the {MIN_DESCRIPTORS} it needs to admit runs", file=sys.stderr)
        return 1
    engine = Engine(listener, settings, path, lock_path(state_dir))
    print(f"ready {os.getpid()}", flush=True)  # the starter reads this line, then the engine is alone
    sys.stdout.close()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the starter's pipe closed (sys.stdout.close leaves the descriptor)
    os.dup2(null, 2)  # no descriptor of the state dir's log held open (it keeps a remount busy)
    os.close(null)
    try:
        engine.serve()
        engine.settle(now=True)
    except BaseException as exc:
        import traceback

        said = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        engine.log("ended: " + said.strip().replace("\n", " | "))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
