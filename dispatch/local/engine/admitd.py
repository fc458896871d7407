"""The admission engine of a state dir: one resident process that queues and admits its runs.

Why: when hundreds of runs wait at once, each taking SQLite's write lock to try its turn loses to
the others' retries (``database is locked`` after the busy timeout: 480 of 1,000 submissions lost,
bench/bench_swarm.py). Here one process does every enqueue, try and release of its clients, one
at a time, so nobody waits on a lock, and it tells each waiter when it is admitted (one message:
no wake FIFO, no retry loop). A waiting run blocks in a read on its connection.

- **The store stays the ledger** (``Ledger``, SQLite): the engine is its writer for its clients, so
  ``hostrun status``, ``top`` and the other readers see what they saw, the rules are the same code
  (``admission.policy``: FIFO with backfill, groups, when-idle, lending, marks, the machine's available
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

from dispatch.core.errors import LedgerError
from dispatch.core.procinfo import is_stopped
from dispatch.local.admission.booking import plan_of
from dispatch.local.engine.holdings import MAX_CLIENTS, TICK, Holder, Holdings
from dispatch.local.engine.lineserver import raise_descriptor_limit
from dispatch.local.engine.reach import PROTOCOL, lock_path, socket_path, unix_address
from dispatch.local.engine.requests import (
    admission_dict,
    checked_interval,
    checked_record,
    checked_run,
    gpu_want,
    positive_int,
)

MYPY = False
if MYPY:
    from dispatch.core.engineshape import Reply, Request, RunFields
    from dispatch.local.admission.policy import Admission
    from dispatch.local.store.ledgerdb import Booking

MIN_DESCRIPTORS = 32  # its own (listener, selector, signal pipe, ledger and log) and a few runs


class Engine(Holdings):
    """The admission engine: its requests (``plan``, ``cgroup``, ``park``, ``attach``, ``release``)
    and its admission rounds (``evaluate``)."""

    def handle(self, client: Holder, message: Request) -> Reply | None:
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

    def _handle(self, client: Holder, message: Request) -> Reply | None:
        op = message.get("op")
        if op == "hello":
            return {"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "host": self.host}
        if op == "plan":
            return self.plan(client, message)
        if op == "cgroup":
            return self.cgroup(client, message)
        if op == "park":
            booking_id = positive_int(message.get("id"), "id")
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

    def _fields(self, client: Holder, message: Request) -> RunFields:
        """A ``plan``'s run fields (``requests.RUN_FIELDS``), for this engine's host and, but from
        root, the caller's own process."""
        fields = checked_run(message.get("run"))
        if fields["host"] != self.host:
            raise ValueError(f"run: this engine admits for host {self.host!r}")
        if fields["pid"] != client.pid and client.uid != 0:
            raise ValueError("run: pid must be the caller's own")
        return fields

    def _orphan(self, client: Holder, message: Request, fields: RunFields) -> Booking | None:
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

    def plan(self, client: Holder, message: Request) -> Reply:
        """A run asks to be booked before it has made anything: its cap checked against this host's
        slice (78, 243 as the run would say them), its booking planned from the ledger as the run
        would (``booking.plan_for``), queued. A host whose slice is a shared one books through that
        slice's engine (``dispatch.local.shared.sharedd``), not this one."""
        from dispatch.local.admission.booking import gamble_line, plan_for
        from dispatch.local.store.ledgerdb import NewBooking

        fields = self._fields(client, message)
        interval = self._interval(message)  # checked before anything is queued
        gpu = gpu_want(fields["gpu"])
        if gpu is not None and self.shared:
            raise ValueError("gpu: the shared slice's engine books memory only")
        here = self.here
        if here.backend.engine_socket is not None and not self.shared:  # root's engine books it
            raise ValueError("this host's slice is a shared slice: a run books through its engine")
        cap = here.checked_cap(fields["cap"], fields["no_cap"])
        limit = here.limit_for(cap)
        orphan = self._orphan(client, message, fields)
        if orphan is not None:
            if gpu is not None:
                self.gpu.wants[orphan.id] = gpu.devices
            return {"op": "queued", "id": orphan.id, "plan": list(plan_of(orphan))}
        label, host = self.stored_label(client, fields["label"]), self.host
        plan = plan_for(self.ledger, host, label, fields["program"], cap, limit,
                        fields["gamble"], fields["requeue"])
        booking_id = self.ledger.enqueue(NewBooking(
            host=host, label=label, pid=fields["pid"], pid_start=fields["pid_start"], size=plan.size,
            cap=plan.limit, kind=plan.kind, command=fields["command"], session=fields["session"],
            gpu_bytes=gpu.need if gpu is not None else None, group=fields["group"],
            when_idle=fields["when_idle"], requeue=fields["requeue"]), fields["booking_id"])
        if gpu is not None:
            self.gpu.wants[booking_id] = gpu.devices
        if plan.why is not None:
            self.ledger.log([gamble_line(label, booking_id, plan)])
        self._hold(client, booking_id, "waiting", interval, fields["pid"])
        self.changed = True
        return {"op": "queued", "id": booking_id, "plan": list(plan)}

    def release(self, client: Holder, message: Request) -> Reply:
        """A run gives its booking back (one answer). A run that ran sends its peak and history
        row with it (``admitclient.Link.release``), checked whole, then written before the release,
        for the label and host of the booking, with this engine's own ``clear_mark_after`` and
        history limits: the run opens no ledger of its own and never waits on its lock. A record
        the ledger refuses (a full disk) is one warning said to the run; the release goes on."""
        from dispatch.local.store.ledgerdb import unrecorded_line

        booking_id = positive_int(message.get("id"), "id")
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
        """A finished run's record (``requests.checked_record``) for its booking's label and host:
        what writes it, or None (said to the run) when the booking's row is gone."""
        from dispatch.local.store.ledgerdb import unrecorded_line

        if state != "running":
            raise ValueError(f"record: booking {booking_id} is not a running booking of this connection")
        run, peak = checked_record(fields)
        keep = self.settings.history_keep
        row = self.ledger.booking(booking_id)
        if row is None:
            client.send({"op": "say", "line": unrecorded_line(f"booking {booking_id} is gone")})
            return None
        if run is not None and (self.stored_label(client, run.label), run.host) != (row.label, row.host):
            raise ValueError("run: not the label and host of this connection's booking")
        if run is not None:
            run = run._replace(label=row.label)
        if peak is None:
            assert run is not None
            return lambda: self.ledger.record_run(run, keep)
        return lambda: self.ledger.record_peak(
            row.label, row.host, peak.peak, peak.hit_ceiling, peak.duration, cap=peak.cap,
            event=peak.event, clear_after=self.settings.clear_mark_after, run=run, keep=keep,
            vram=peak.vram, ramp=peak.ramp)

    def cgroup(self, client: Holder, message: Request) -> Reply:
        """An admitted run made its job's cgroup: the booking names it (its usage counts from now,
        and a recovery re-books it by it)."""
        booking_id = positive_int(message.get("id"), "id")
        path = message.get("path")
        if client.bookings.get(booking_id) != "running":
            raise ValueError(f"booking {booking_id} is not a running booking of this connection")
        if not isinstance(path, str) or not 0 < len(path) <= 4096:
            raise ValueError("path: the job's cgroup directory")
        self.ledger.set_cgroup(booking_id, path)
        return {"op": "cgroup", "id": booking_id}

    def attach(self, client: Holder, message: Request) -> Reply:
        """A client of an engine that died takes its booking back; a waiting one keeps its place."""
        booking_id = positive_int(message.get("id"), "id")
        row = self.ledger.booking(booking_id)
        if row is None:
            return {"op": "attached", "id": booking_id, "state": "gone"}
        if not self.owns(client, row):
            raise ValueError(f"booking {booking_id} is not the caller's")
        other = self.holders.get(booking_id)
        if other is not None and other is not client:
            raise ValueError(f"booking {booking_id} is held by another connection")
        gpu = gpu_want(message.get("gpu"))
        self._hold(client, booking_id, row.state, self._interval(message), row.pid)
        if row.gpu_bytes:  # the devices it may have: as the run names them again (all, if it does not)
            self.gpu.wants[booking_id] = gpu.devices if gpu is not None else None
        client.parked.discard(booking_id)  # a parked run, whole again on the same connection
        self.changed = True
        return {"op": "attached", "id": booking_id, "state": row.state, "plan": list(plan_of(row)),
                "gpu_index": row.gpu_index}

    def _interval(self, message: Request) -> float:
        return checked_interval(message, self.settings.status_interval)

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
        if any(b in self.gpu.wants for b in waiting):
            self.gpu.read(lambda: any(self.holders[b].bookings.get(b) == "running"
                                      for b in self.gpu.wants if b in self.holders))
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
                gpu_room = self.gpu.room(booking_id, self.here.backend)
                adm = self.ledger.try_admit(booking_id, self.host, self.room, gpu_room, groups,
                                            self._reason(booking_id), backfill, sessions)
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
        gpu_error = self.gpu.error_for(booking_id)
        client.send({"op": "wait", "id": booking_id, "adm": admission_dict(adm),
                     "line": printable(status_line(adm, gpu_error=gpu_error)), "near": near})

    def _reason(self, booking_id: int) -> Callable[[Admission], str]:
        from dispatch.local.admission.rooms import wait_reason

        gpu_error = self.gpu.error_for(booking_id)
        return lambda adm: wait_reason(adm, gpu_error)


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
