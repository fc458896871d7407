"""``hostrun-shared``: the admission engine of a shared slice, run by root for a group of users.

It is the engine of a state dir (``dispatch.local.engine.admitd``: the same queue, ledger, rules and
protocol), with its own state dir (``/var/lib/hostrun-shared``, root's alone) and these
differences, each against a caller who wants more than its share (why a root process at all:
``dispatch.capping.shared``):

- **Any member may connect** (the socket is the group's, mode 0660); a caller is who the kernel says
  (``SO_PEERCRED``), never what it writes. ``MAX_PER_UID`` connections per user, so one member
  cannot take every slot from the others.
- **One queue for every user**: FIFO with backfill, when-idle and the machine's available memory
  apply across users, as on a user's own slice. A label is kept as ``user:label`` (a user name
  holds no ``:``), so each user's recorded peaks, marks and history are their own and nobody's
  label can stand for another's. Groups do not apply: their sizes are each user's configuration,
  and the engine's has none.
- **Scopes** (``scope``): once its booking is admitted, a run asks the engine to start its job's
  scope with two processes, which must be the caller's own children running as the caller only
  (checked through pidfds, so a pid reused meanwhile is never moved); the scope is named after the
  booking's holder, capped at the booking's cap, in the slice, with swap 0 and ``OOMPolicy=stop``.
  Before admission there is no scope: a process in the shared slice never runs unbooked. When the
  connection closes, the engine kills what is left in its scopes.
- **Its own death forgets nothing**: the bookings are in the ledger. A new engine (systemd restarts
  it) ends only the scopes no running booking names (``sweep``); a running job keeps its booking
  until its run ends and releases it through the new engine, or its holder dies (the ledger's
  reclaim, which then stops the scope). Waiting runs re-attach and keep their place.
- Nothing a caller sends is shown to another without escaping (labels are stored as sent and
  escaped by whoever prints them); the line server's bounds (``dispatch.local.engine.lineserver``) hold.

Standard library only.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from dispatch.capping.shared import JOB_AFFIXES, SOCKET_PATH
from dispatch.capping.systemd import SYSTEM_MANAGER, Manager, SystemdBackend, scope_properties
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode
from dispatch.local.engine.admitd import Engine
from dispatch.local.engine.holdings import Holder
from dispatch.local.engine.reach import PROTOCOL
from dispatch.local.engine.requests import PID_MAX, positive_int
from dispatch.local.hostslice import LocalSlice

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.engineshape import Reply, Request, SharedBooking
    from dispatch.core.settings import Settings
    from dispatch.local.store.ledgerdb import Booking

STATE_DIR = "/var/lib/hostrun-shared"  # the unit's StateDirectory=
MAX_CLIENTS = 1024  # connections in all (the unit's LimitNOFILE is well above it)
MAX_PER_UID = 128  # connections of one user: one member cannot take every slot from the others
GRACE = 10.0  # seconds a scope's processes get between SIGTERM and SIGKILL


class SliceKeeper(SystemdBackend):
    """The shared slice as root's system manager keeps it; its jobs are the scopes this engine
    starts (``hostrun-shared-<holder pid>-<its start time>.scope``)."""

    name = "shared"
    job_affixes = JOB_AFFIXES


class SharedSlice(LocalSlice):
    """``LocalSlice`` for the engine: the administrator's fixed limit, not a host's settings."""

    def __init__(self, settings: Settings, backend: SliceKeeper, limit: int) -> None:
        from dispatch.core.hostfacts import read_meminfo

        self.host = settings.local
        self.source = "hostrun shared install"
        self.mem = read_meminfo()
        self.backend = backend
        backend.fixed_limit = limit
        self._limit = limit


class Member(Holder):
    """A member's connection: its bookings (``Holder``) and the scopes started for them."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.user = ""
        self.units: dict[int, str] = {}  # booking id -> its scope unit


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_facts(pid: int) -> tuple[int, set[int]]:
    """(parent pid, the set of its real/effective/saved/fs uids) from /proc/PID/status."""
    ppid, uids = -1, set()
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith("Uid:"):
                uids = {int(x) for x in line.split()[1:]}
    return ppid, uids


class SharedEngine(Engine):
    name = "shared-slice engine"
    max_clients = MAX_CLIENTS
    max_per_uid = MAX_PER_UID
    shared = True

    def __init__(self, listener: socket.socket, settings: Settings, path: str, slice_unit: str,
                 limit: int, group: str, backend: SliceKeeper, manager: Manager) -> None:
        super().__init__(listener, settings, path, "")
        self.idle_after = None  # socket-activated: systemd keeps it, it does not leave
        self.slice_unit = slice_unit
        self.limit = limit
        self.group = group
        self.backend = backend
        self.manager = manager
        self.names: dict[int, str] = {}
        self._here = SharedSlice(settings, backend, limit)

    def log(self, text: str) -> None:
        """One line to the journal (the unit's stderr)."""
        try:
            print(f"hostrun-shared: {text}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def connection(self, sock: socket.socket, uid: int, pid: int, seq: int) -> Member:
        if uid not in self.names:
            self.names[uid] = _user_name(uid)
        member = Member(sock, uid, pid, seq, self.dirty)
        member.user = self.names[uid]
        return member

    def stored_label(self, client: Holder, label: str) -> str:
        return f"{getattr(client, 'user', '')}:{label}"

    def owns(self, client: Holder, row: Booking) -> bool:
        return super().owns(client, row) and (
            client.uid == 0 or row.label.startswith(f"{getattr(client, 'user', '')}:"))

    def started(self) -> None:
        self.sweep()

    def idle(self) -> bool:
        return False

    # -- requests ---------------------------------------------------------------------------------

    def _handle(self, client: Holder, message: Request) -> Reply | None:
        op = message.get("op")
        if op == "hello":
            return {"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "host": self.host,
                    "slice": self.slice_unit, "cgroup": self.backend.slice_path, "limit": self.limit,
                    "group": self.group, "uid": client.uid}
        if op == "list":
            return self.listing()
        if op == "scope":
            assert isinstance(client, Member)
            return self.scope(client, message)
        if op == "cgroup":
            raise ValueError("a shared slice's job cgroup is the scope this engine starts (scope)")
        return super()._handle(client, message)

    def listing(self) -> Reply:
        """Every booking on the slice, every user's (``hostrun shared``)."""
        rows = [b for b in self.ledger.bookings(self.host) if b.state in ("running", "waiting")]
        bookings: list[SharedBooking] = []
        for b in rows:
            user, _, label = b.label.partition(":")
            bookings.append({"user": user, "pid": b.pid, "label": label, "size": b.size, "cap": b.cap,
                             "state": b.state, "since": b.since or b.queued,
                             "unit": os.path.basename(b.cgroup) if b.cgroup else ""})
        return {"op": "list", "limit": self.limit, "used": self.backend.slice_usage().used,
                "slice": self.slice_unit, "group": self.group, "bookings": bookings}

    def scope(self, client: Member, message: Request) -> Reply:
        booking_id = positive_int(message.get("id"), "id")
        if client.bookings.get(booking_id) != "running":
            raise ValueError(f"booking {booking_id} is not an admitted booking of this connection")
        if booking_id in client.units:
            raise ValueError(f"booking {booking_id} has its scope already")
        row = self.ledger.booking(booking_id)
        if row is None:
            raise ValueError(f"booking {booking_id} is gone")
        pids = message.get("pids")
        if not isinstance(pids, list) or not 1 <= len(pids) <= 2 or not all(
                type(p) is int and 1 < p <= PID_MAX for p in pids):
            raise ValueError(f"pids: one or two process ids (2 to {PID_MAX})")
        unit = self.backend.job_name(f"{row.pid}-{row.pid_start}")
        if message.get("unit") not in (None, unit):
            raise ValueError(f"unit: this booking's scope is {unit}")
        pidfds = []
        try:
            for pid in pids:
                fd = os.pidfd_open(pid)
                pidfds.append(fd)
                ppid, uids = process_facts(pid)
                if ppid != client.pid or uids != {client.uid}:
                    raise ValueError(f"process {pid} is not a child of the caller running as uid "
                                     f"{client.uid}")
                signal.pidfd_send_signal(fd, 0)  # still that process: the facts were its own
            props = [*scope_properties(f"hostrun shared job of {client.user}", self.slice_unit,
                                       min(row.cap, self.limit), GRACE), ("PIDs", ("au", list(pids)))]
            self.manager.start(unit, props)
            client.units[booking_id] = unit
            for fd in pidfds:
                # Gone and its pid reused between the check and the move would put someone else's
                # process in this scope: it is killed with the scope, and the request refused.
                try:
                    signal.pidfd_send_signal(fd, 0)
                except ProcessLookupError:
                    self._kill_unit(unit)
                    raise ValueError("a process ended while its scope was started") from None
        except ProcessLookupError:
            raise ValueError("a process named for the scope does not exist") from None
        finally:
            for fd in pidfds:
                os.close(fd)
        path = f"{self.backend.slice_dir}/{unit}"
        self.ledger.set_cgroup(booking_id, path)
        return {"op": "scope", "id": booking_id, "unit": unit, "cgroup": path}

    def attach(self, client: Holder, message: Request) -> Reply:
        answer = super().attach(client, message)
        row = self.ledger.booking(positive_int(message.get("id"), "id"))
        if isinstance(client, Member) and row is not None and row.state == "running" and row.cgroup:
            client.units[row.id] = os.path.basename(row.cgroup)  # killed if this connection drops
        return answer

    def dropped(self, client: Holder) -> None:
        """Its caller is gone: what is left in its scopes is killed, its bookings released."""
        if isinstance(client, Member) and not self.stopping:  # a restart kills no running job
            for unit in client.units.values():
                self._kill_unit(unit)
            client.units.clear()
        super().dropped(client)

    def released(self, client: Holder, booking_id: int) -> None:
        if isinstance(client, Member):
            unit = client.units.pop(booking_id, None)
            if unit is not None:
                self._kill_unit(unit)

    def _kill_unit(self, unit: str) -> None:
        try:
            self.manager.connection().manager("KillUnit", "ssi", unit, "all", int(signal.SIGKILL))
        except BackendError:
            pass  # already gone (its last process ended and systemd collected it)
        except OSError as exc:
            self.log(f"cannot kill {unit}: {exc}")

    def sweep(self) -> None:
        """Kill every job scope in the slice that no running booking names: those of runs whose
        engine died and whose bookings the ledger no longer holds (nothing runs unbooked)."""
        prefix, suffix = JOB_AFFIXES
        try:
            names = sorted(os.listdir(self.backend.slice_dir))
        except OSError:
            return
        booked = {os.path.basename(b.cgroup) for b in self.ledger.bookings(self.host)
                  if b.state == "running" and b.cgroup}
        self.settle()
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix) and name not in booked:
                self.log(f"{name} was in the slice with no booking: killing it")
                self._kill_unit(name)


def listening_socket(path: str | None) -> socket.socket:
    """systemd's socket (``LISTEN_FDS``), else one bound at ``path`` (a test's own engine)."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        return socket.socket(fileno=3)
    if not path:
        raise SystemExit("hostrun-shared: not started by its socket unit; pass --listen PATH")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


def shared_settings(state_dir: str) -> Settings:
    """The engine's settings: the built-in defaults (no groups, no requeue patterns) in its own
    state dir, made root's alone here (systemd's StateDirectory= makes it 0700 too)."""
    from dispatch.core.settings import Settings
    from dispatch.guards import trust

    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    trust.check_existing_dir(state_dir, "shared slice state directory")
    return Settings.default(state_dir=state_dir, source="hostrun shared install")


def main(argv: list[str] | None = None) -> int:
    """``python3 -m dispatch.local.shared.sharedd --slice UNIT --size BYTES --group NAME [--state-dir DIR]
    [--listen PATH]``, as the socket unit ``hostrun shared install`` writes starts it."""
    args = sys.argv[1:] if argv is None else argv
    opts = dict(zip(args[::2], args[1::2]))
    if os.geteuid() != 0:
        print("hostrun-shared: must run as root", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    from dispatch.capping.cgroupfs import parse_mountinfo, read_self_files
    from dispatch.core.units import parse_size
    from dispatch.local.engine.lineserver import raise_descriptor_limit

    unit = opts.get("--slice", "hostrun.slice")
    limit = parse_size(opts.get("--size", ""))
    mount = parse_mountinfo(read_self_files()[1]).get("cgroup2")
    if not mount:
        print("hostrun-shared: no unified cgroup2 hierarchy", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    raise_descriptor_limit(MAX_CLIENTS + 1024)
    manager = Manager(SYSTEM_MANAGER, "", False)
    backend = SliceKeeper(mount, unit, manager)
    backend.ensure_slice(limit)
    settings = shared_settings(opts.get("--state-dir", STATE_DIR))
    path = opts.get("--listen") or (None if os.environ.get("LISTEN_FDS") else SOCKET_PATH)
    listener = listening_socket(path)
    SharedEngine(listener, settings, path or SOCKET_PATH, unit, limit, opts.get("--group", ""), backend,
                 manager).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
