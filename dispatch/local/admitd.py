"""The admission engine of a state dir: one resident process that queues and admits its runs.

Why: when hundreds of runs wait at once, each taking SQLite's write lock to try its turn loses to
the others' retries (``database is locked`` after the busy timeout: 480 of 1,000 submissions lost,
bench/bench_swarm.py). Here one process does every enqueue, try and release of its clients, one
at a time, so nobody waits on a lock, and it tells each waiter when it is admitted (one message:
no wake FIFO, no retry loop). A waiting run blocks in a read on its connection.

- **The store stays the ledger** (``Ledger``, SQLite): the engine is its writer for its clients, so
  ``hostrun status``, ``top`` and the other readers see what they saw, the rules are the same code
  (``admitpolicy``: FIFO with backfill, groups, when-idle, lending, marks, the machine's available
  memory), and a run admitted without the engine (a ``--gpu-memory`` run, the shared backend) is
  still counted and ordered with the others.
- **A booking belongs to its connection**: a client that dies releases at once (its connection
  closes), with no ``/proc`` scan for staleness on the hand-off's path.
- **Its own death forgets nothing**: the bookings are in the ledger, so a new engine counts every
  running job as before; a waiting client re-attaches to it (``attach``) and keeps its place (its
  booking id). Nothing runs unbooked and nothing is admitted twice.
- **Zero set-up**: the first run that needs it starts it (``dispatch.local.admitclient``: two at
  once start one, under an flock); it leaves after ``IDLE_AFTER`` seconds with no connection. Its
  socket is ``state_dir/admitd-<digest>.sock`` (the state dir is private to its owner: the trust
  rules of every state file), one engine per configuration (the digest of the settings it was given
  on stdin, so two configurations sharing a state dir each have theirs, both writing one ledger).
- **Bounds**: the line server's (``dispatch.local.lineserver``); only its owner (or root) may connect.

Requests (JSON lines): ``hello``; ``book`` (a booking's fields: answered ``queued`` with its id, then
``wait`` lines with the status figures, at once and every ``status_interval``, and ``admitted``);
``attach`` (a booking this connection held on the engine before: its state); ``release``. Standard
library only: it is shipped to peers with the rest of the runtime.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable

from dispatch.core.errors import HostrunError, LedgerError
from dispatch.core.procinfo import is_stopped
from dispatch.local.admitclient import lock_path, log_path, socket_path, unix_address
from dispatch.local.ledger import Ledger
from dispatch.local.ledgerfile import put_back_line
from dispatch.local.lineserver import Connection, LineServer, raise_descriptor_limit

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.settings import Settings
    from dispatch.local.admitpolicy import Admission
    from dispatch.local.ledgerdb import Booking

PROTOCOL = 1
IDLE_AFTER = 30.0  # seconds with no connection before the engine leaves (HOSTRUN_ENGINE_IDLE)
IDLE_ENV = "HOSTRUN_ENGINE_IDLE"
TICK = 1.0  # seconds between re-evaluations while bookings wait (usage and MemAvailable move)
MAX_CLIENTS = 8192  # a swarm's waiters, each one connection
# What ``book`` takes, with its type: Ledger.enqueue's keywords.
BOOKING_FIELDS: dict[str, type | tuple[type, ...]] = {
    "host": str, "label": str, "pid": int, "pid_start": int, "size": int, "cap": int, "kind": str,
    "command": str, "session": (str, type(None)), "cgroup": (str, type(None)),
    "group": (str, type(None)), "when_idle": bool, "booking_id": (int, type(None)), "requeue": bool,
}


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


class Engine(LineServer):
    name = "admission engine"
    max_clients = MAX_CLIENTS
    max_per_uid = MAX_CLIENTS
    tick = TICK
    request_errors = (HostrunError, OSError, ValueError, TypeError)
    frame = staticmethod(Holder.encode)

    def __init__(self, listener: socket.socket, settings: Settings, path: str, lock: str) -> None:
        super().__init__(listener)
        from dispatch.local.admission import room_function
        from dispatch.local.hostslice import LocalSlice

        self.settings = settings
        self.path = path
        self.lock = lock
        self.here = LocalSlice(settings)
        self.host = self.here.host.name
        self.room = room_function(self.here.backend, self.here.limit)
        self._ledger: EngineLedger | None = None  # open only while it holds bookings (``settle``)
        self.log_path = log_path(settings.state_dir)
        self.waiting: set[int] = set()  # the held bookings that wait
        self.owner = os.geteuid()
        self.clients: dict[int, Holder] = {}
        self.holders: dict[int, Holder] = {}  # booking id -> its client
        self.changed = True
        self.last_evaluation = 0.0
        self.idle_after = float(os.environ.get(IDLE_ENV) or IDLE_AFTER)
        self.listener_ino = os.stat(path).st_ino

    @property
    def ledger(self) -> EngineLedger:
        """The ledger, opened when a request needs it (its damage found and recovered then, as any
        run's open would) and closed by ``settle`` once no booking is held: a file held open would
        hide damage from the next run (a live WAL), and keep a read-only remount busy."""
        if self._ledger is None:
            self._ledger = EngineLedger(self.settings.state_dir, self._ledger_said, self.here.live_jobs,
                                        self)
        return self._ledger

    def settle(self) -> None:
        if self._ledger is not None and not self.holders:
            self._ledger.close()
            self._ledger = None

    def _ledger_said(self, line: str) -> None:
        """What the ledger says (a recovery) goes to the log and to every run holding a booking."""
        self.log(line)
        for client in {id(c): c for c in self.holders.values()}.values():
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
        try:
            return self._handle(client, message)
        finally:
            self.settle()

    def _handle(self, client: Holder, message: dict[str, Any]) -> dict[str, Any] | None:
        op = message.get("op")
        if op == "hello":
            return {"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "host": self.host}
        if op == "book":
            return self.book(client, message)
        if op == "attach":
            return self.attach(client, message)
        if op == "release":
            booking_id = _int(message.get("id"), "id")
            if client.bookings.pop(booking_id, None) is None:
                raise ValueError(f"booking {booking_id} is not this connection's")
            self._forget(client, booking_id)
            self.ledger.release(booking_id)
            self.changed = True
            return {"op": "released", "id": booking_id}
        raise ValueError(f"unknown request {op[:40]!r}" if isinstance(op, str) else
                         "unknown request (op: hello, book, attach or release)")

    def book(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        fields = message.get("booking")
        if not isinstance(fields, dict) or set(fields) != set(BOOKING_FIELDS):
            raise ValueError(f"booking: an object with {', '.join(sorted(BOOKING_FIELDS))}")
        for key, kind in BOOKING_FIELDS.items():
            value = fields[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"booking: {key} of the wrong type")
        if fields["host"] != self.host:
            raise ValueError(f"booking: this engine admits for host {self.host!r}")
        if fields["pid"] != client.pid and client.uid != 0:
            raise ValueError("booking: pid must be the caller's own")
        orphan = next((b for b in self.ledger.bookings(self.host) if b.id not in self.holders
                       and (b.pid, b.pid_start, b.label) == (fields["pid"], fields["pid_start"],
                                                             fields["label"])), None)
        if orphan is not None:  # booked by an engine that died before it answered: the same booking
            self._hold(client, orphan.id, orphan.state, self._interval(message))
            self.changed = True
            return {"op": "queued", "id": orphan.id}
        booking_id = self.ledger.enqueue(**fields)
        self._hold(client, booking_id, "waiting", self._interval(message))
        self.changed = True
        return {"op": "queued", "id": booking_id}

    def attach(self, client: Holder, message: dict[str, Any]) -> dict[str, Any]:
        """A client of an engine that died takes its booking back; a waiting one keeps its place."""
        booking_id = _int(message.get("id"), "id")
        row = self.ledger.booking(booking_id)
        if row is None:
            return {"op": "attached", "id": booking_id, "state": "gone"}
        if row.pid != client.pid and client.uid != 0:
            raise ValueError(f"booking {booking_id} is not the caller's")
        other = self.holders.get(booking_id)
        if other is not None and other is not client:
            raise ValueError(f"booking {booking_id} is held by another connection")
        self._hold(client, booking_id, row.state, self._interval(message))
        self.changed = True
        return {"op": "attached", "id": booking_id, "state": row.state}

    def _interval(self, message: dict[str, Any]) -> float:
        interval = message.get("status_interval", self.settings.status_interval)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not 0.05 <= interval <= 86400:
            raise ValueError("status_interval: seconds, 0.05 to 86400")
        return float(interval)

    def _hold(self, client: Holder, booking_id: int, state: str, interval: float) -> None:
        client.bookings[booking_id] = state
        if state == "waiting":
            self.waiting.add(booking_id)
        client.interval[booking_id] = interval
        self.holders[booking_id] = client
        self.ledger.track(booking_id)

    def _forget(self, client: Holder, booking_id: int) -> None:
        self.waiting.discard(booking_id)
        client.interval.pop(booking_id, None)
        client.told.pop(booking_id, None)
        if self.holders.get(booking_id) is client:
            del self.holders[booking_id]

    def dropped(self, client: Holder) -> None:
        """Its client is gone (ended, killed, its machine gone): what it held is released, and a
        waiting run's job cgroup removed (empty: its process is made once admitted, and its
        guardian then; a running one's guardian ends the job and removes it)."""
        for booking_id, state in list(client.bookings.items()):
            self._forget(client, booking_id)
            try:
                row = self.ledger.booking(booking_id) if state == "waiting" else None
                self.ledger.release(booking_id)
            except HostrunError as exc:
                self.log(f"cannot release booking {booking_id}: {exc}")
                continue
            if row is not None and row.cgroup and row.cgroup.startswith("/sys/fs/cgroup/"):
                try:
                    os.rmdir(row.cgroup)  # only ever an empty directory; the caller's own (same uid)
                except OSError:
                    pass
        client.bookings.clear()
        self.changed = True
        self.settle()

    # -- admission --------------------------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self.waiting)

    def evaluate(self) -> None:
        """The waiters this engine holds, in queue order, each tried as ``Ledger.try_admit`` would
        for it; after the first that cannot go and lets nobody pass, the rest are only told where
        they stand when their status is due. Runs after a change, or every ``TICK``."""
        now = time.monotonic()
        if not (self.changed or now - self.last_evaluation >= TICK):
            return
        self.changed = False
        self.last_evaluation = now
        if not self.waiting:
            self.settle()
            return
        from dispatch.local.admission import stop_reclaimed, wait_reason

        rows = self.ledger.bookings(self.host)
        waiting = [b for b in rows if b.state == "waiting" and b.id in self.holders]
        groups = self.settings.groups
        backfill = self.settings.queue_policy == "backfill"
        trying = True
        for b in waiting:
            client = self.holders[b.id]
            due = now - client.told.get(b.id, 0.0) >= client.interval[b.id]
            if trying and is_stopped(b.pid):  # Ctrl-Z'd while it waits: passed over, holds nobody up
                continue
            if not (trying or due):  # behind a waiter that lets nobody pass: tried when its status is
                continue  # due (its reason stored, as ``hostrun ledger`` shows), as a waiter polled
            adm = self.ledger.try_admit(b.id, self.host, self.room, None, groups, wait_reason, backfill)
            if adm.reclaimed:
                stop_reclaimed(self.here.backend, adm.reclaimed)
            if adm.admitted:
                client.bookings[b.id] = "running"
                self.waiting.discard(b.id)
                client.told.pop(b.id, None)
                row = self.ledger.booking(b.id)
                client.send({"op": "admitted", "id": b.id, "kind": row.kind if row else b.kind,
                             "size": row.size if row else b.size, "adm": admission_dict(adm)})
                continue
            if trying:
                trying = adm.policy is not None or adm.memory_ok or adm.pass_on
            if due and not client.out:
                client.told[b.id] = now
                client.send({"op": "wait", "id": b.id, "adm": admission_dict(adm)})

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
    replaced a damaged file (each run told its own), and no wake FIFO rings for those: the engine
    tells them itself."""

    def __init__(self, state_dir: str, say: Callable[[str], None],
                 live_jobs: Callable[[], list[Booking]], engine: Engine) -> None:
        self.engine = engine
        super().__init__(state_dir, say, live_jobs)

    def track(self, booking_id: int) -> None:
        """A booking this engine holds though another made it (an attach, an orphan's)."""
        self._do(lambda: self._track(booking_id))

    def put_back_said(self, booking_ids: list[int]) -> None:
        self.engine.put_back(booking_ids, self.path)

    def release(self, booking_id: int) -> None:
        self._mine.pop(booking_id, None)  # a booking ending is not put back if the file was replaced
        super().release(booking_id)

    def wake_next(self, host: str, after: int = 0) -> None:
        rows = self.db.execute("SELECT id FROM bookings WHERE host = ? AND state = 'waiting' AND id > ?",
                               (host, after)).fetchall()
        held = self.engine.holders  # a run admitted without the engine waits too: rung as before
        if any(r[0] not in held for r in rows):
            super().wake_next(host, after)


def _int(value: object, what: str) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{what}: a positive whole number")
    return value


def main(argv: list[str] | None = None) -> int:
    """``python3 -m dispatch.local.admitd STATE_DIR DIGEST``, with the settings (marshal of
    ``Settings.to_normalized()``) on stdin: how ``admitclient`` starts it, detached."""
    import marshal

    from dispatch.core.settings import Settings
    from dispatch.guards import trust

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python3 -m dispatch.local.admitd STATE_DIR DIGEST < settings", file=sys.stderr)
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
    raise_descriptor_limit(MAX_CLIENTS + 64)
    engine = Engine(listener, settings, path, lock_path(state_dir))
    print(f"ready {os.getpid()}", flush=True)  # the starter reads this line, then the engine is alone
    sys.stdout.close()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the starter's pipe closed (sys.stdout.close leaves the descriptor)
    os.dup2(null, 2)  # no descriptor of the state dir's log held open (it keeps a remount busy)
    os.close(null)
    try:
        engine.serve()
    except BaseException as exc:
        import traceback

        said = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        engine.log("ended: " + said.strip().replace("\n", " | "))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
