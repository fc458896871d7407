"""``hostrun-shared``: the root daemon that keeps a shared slice for a group of users.

Why it exists and what a caller can ask of it: ``dispatch.capping.shared``. Here: the rules it
keeps, each against a caller who wants more than its share.

- A caller is who the kernel says (``SO_PEERCRED``), never what it writes.
- **Admission** is one queue for every user, first come first served: a waiting booking is admitted
  when it fits the slice's room (limit less running bookings less usage above them, as the local
  ledger counts it) and the machine's (MemAvailable less what running bookings have yet to use), and
  no earlier booking still waits. A booking belongs to its connection: closing it (a job's end,
  hostrun killed, the caller's machine gone) is the only way to unbook, so nobody can unbook another.
- **Scopes** hold only the caller's own children (each pid's parent is the caller and all its uids
  are the caller's), are named after the caller's uid, carry fixed properties (the slice, swap 0,
  ``OOMPolicy=stop``) and a cap no larger than the slice, and are held to ``WAITING_MAX`` until their
  booking is admitted: a process in the shared slice never runs unbooked. When the connection closes
  the daemon kills what is left in the scope.
- Nothing a caller sends is shown to another without escaping (labels are stored as sent, escaped
  by whoever prints them).
- **Bounds**, so that no member can crash or stall the daemon for the others: the line server's
  (``dispatch.local.lineserver``: request size and nesting, one request's failure ends only its
  connection, sockets that never block, ``MAX_CLIENTS`` in all and ``MAX_PER_UID`` per user, a pause
  when out of descriptors); here, numbers are checked for type and range before use (pids within
  ``PID_MAX``, ``grace`` 1 to 60 s, sizes positive whole bytes).
- **Restart**: a daemon that starts knows no booking, so every job scope already in the slice runs
  unbooked: it kills them (``sweep``) before it admits anyone. Their callers' connections were the
  old daemon's and closed with it; hostrun says so when such a job ends.

One thread, one ``selectors`` loop (``LineServer``): requests are handled one at a time, so
admission needs no lock. Standard library only.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from dispatch.capping.base import read_int
from dispatch.capping.shared import JOB_AFFIXES, PROTOCOL, SOCKET_PATH
from dispatch.capping.systemd import SYSTEM_MANAGER, Manager, SystemdBackend, scope_properties
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode
from dispatch.local.admission import slice_room
from dispatch.local.lineserver import Connection, LineServer, raise_descriptor_limit

MYPY = False
if MYPY:
    from typing import Any

WAITING_MAX = 64 << 20  # a scope's limit until its booking is admitted: the forked child waits in it
TICK = 1.0  # seconds between re-evaluations while bookings wait (usage and MemAvailable move)
MAX_CLIENTS = 1024  # connections in all (the unit's LimitNOFILE is well above it)
MAX_PER_UID = 128  # connections of one user: one member cannot take every slot from the others
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: no process id is larger
GRACE = (1.0, 60.0)  # seconds a scope's processes get between SIGTERM and SIGKILL


def _log(text: str) -> None:
    """One line to the journal (the unit's stderr)."""
    try:
        print(f"hostrun-shared: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Client(Connection):
    """One connection: at most one booking and one scope."""

    def __init__(self, sock: socket.socket, uid: int, pid: int, seq: int, user: str,
                 dirty: set[Client]) -> None:
        super().__init__(sock, uid, pid, seq, dirty)
        self.user = user
        self.unit = ""
        self.cap = 0
        self.size = 0
        self.label = ""
        self.state = ""  # "", "waiting", "running"
        self.since = 0.0
        self.last_news: tuple[object, ...] = ()

    def public(self) -> dict[str, Any]:
        return {"user": self.user, "uid": self.uid, "pid": self.pid, "label": self.label,
                "size": self.size, "cap": self.cap, "state": self.state, "since": self.since,
                "unit": self.unit}


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


class Daemon(LineServer):
    name = "shared-slice daemon"
    max_clients = MAX_CLIENTS
    max_per_uid = MAX_PER_UID
    tick = TICK
    request_errors = (BackendError, OSError, ValueError, TypeError)

    def __init__(self, listener: socket.socket, slice_unit: str, limit: int, group: str,
                 backend: SystemdBackend, manager: Manager) -> None:
        super().__init__(listener)
        self.slice_unit = slice_unit
        self.limit = limit
        self.group = group
        self.backend = backend
        self.manager = manager
        self.clients: dict[int, Client] = {}
        self.names: dict[int, str] = {}

    def log(self, text: str) -> None:
        _log(text)

    def connection(self, sock: socket.socket, uid: int, pid: int, seq: int) -> Client:
        if uid not in self.names:
            self.names[uid] = _user_name(uid)
        return Client(sock, uid, pid, seq, self.names[uid], self.dirty)

    def started(self) -> None:
        self.sweep()

    def busy(self) -> bool:
        return any(c.state == "waiting" for c in self.clients.values())

    def dropped(self, client: Client) -> None:
        if client.unit:
            self._kill_unit(client.unit)
        client.state = ""

    def _kill_unit(self, unit: str) -> None:
        try:
            self.manager.connection().manager("KillUnit", "ssi", unit, "all", int(signal.SIGKILL))
        except BackendError:
            pass  # already gone (its last process ended and systemd collected it)
        except OSError as exc:
            _log(f"cannot kill {unit}: {exc}")

    def sweep(self) -> None:
        """Kill every job scope in the slice that no connection owns: at start, those of a daemon
        that died, which would otherwise run on unbooked and be admitted over."""
        prefix, suffix = JOB_AFFIXES
        try:
            names = sorted(os.listdir(self.backend.slice_dir))
        except OSError:
            return
        owned = {c.unit for c in self.clients.values()}
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix) and name not in owned:
                _log(f"{name} was in the slice with no booking (a daemon before this one died): "
                     "killing it")
                self._kill_unit(name)

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, client: Client, message: dict[str, Any]) -> dict[str, Any] | None:
        op = message.get("op")
        if op == "hello":
            return {"protocol": PROTOCOL, "slice": self.slice_unit, "cgroup": self.backend.slice_path,
                    "limit": self.limit, "group": self.group, "uid": client.uid}
        if op == "list":
            used = self.backend.slice_usage().used
            return {"limit": self.limit, "used": used, "slice": self.slice_unit, "group": self.group,
                    "bookings": [c.public() for c in sorted(self.clients.values(), key=lambda c: c.seq)
                                 if c.state]}
        if op == "scope":
            return self.scope(client, message)
        if op == "book":
            self.book(client, message)  # answered by the evaluation: "admitted" or "waiting"
            return None
        raise ValueError(f"unknown request {op[:40]!r}" if isinstance(op, str) else
                         "unknown request (op: hello, list, scope or book)")

    def scope(self, client: Client, message: dict[str, Any]) -> dict[str, Any]:
        if client.unit:
            raise ValueError("this connection has its scope already")
        pids = message.get("pids")
        if not isinstance(pids, list) or not 1 <= len(pids) <= 2 or not all(
                type(p) is int and 1 < p <= PID_MAX for p in pids):
            raise ValueError(f"pids: one or two process ids (2 to {PID_MAX})")
        prefix, suffix = JOB_AFFIXES
        unit = message.get("unit")
        mine = f"{prefix}{client.uid}-"
        middle = unit[len(mine):-len(suffix)] if isinstance(unit, str) and unit.startswith(mine) \
            and unit.endswith(suffix) else ""
        if not middle or len(middle) > 64 or not all(ch in "0123456789-" for ch in middle):
            raise ValueError(f"unit must be {mine}<digits and dashes>{suffix}")
        assert isinstance(unit, str)
        cap = _size(message.get("cap"), "cap")
        grace = _grace(message.get("grace", 10.0))
        client.cap = min(cap, self.limit)
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
            limit = client.cap if client.state == "running" else min(client.cap, WAITING_MAX)
            props = [*scope_properties(f"hostrun shared job of {client.user}", self.slice_unit, limit,
                                       grace), ("PIDs", ("au", list(pids)))]
            self.manager.start(unit, props)
            client.unit = unit
            for fd in pidfds:
                # Gone and its pid reused between the check and the move would put someone
                # else's process in this scope: lift the scope's limit to the slice's and refuse.
                try:
                    signal.pidfd_send_signal(fd, 0)
                except ProcessLookupError:
                    self.manager.set_properties(unit, [("MemoryMax", ("t", self.limit))])
                    raise ValueError("a process ended while its scope was started") from None
        except ProcessLookupError:
            raise ValueError("a process named for the scope does not exist") from None
        finally:
            for fd in pidfds:
                os.close(fd)
        return {"unit": unit, "cgroup": f"{self.backend.slice_path}/{unit}"}

    def book(self, client: Client, message: dict[str, Any]) -> None:
        if client.state:
            raise ValueError("this connection has its booking already")
        size = _size(message.get("size"), "size")
        cap = _size(message.get("cap"), "cap")
        if size > self.limit or cap > self.limit:
            raise ValueError(f"larger than the whole shared slice ({self.limit} bytes)")
        label = message.get("label")
        client.label = label[:200] if isinstance(label, str) else ""
        client.size, client.cap, client.state, client.since = size, cap, "waiting", time.time()
        self.evaluate()

    # -- admission --------------------------------------------------------------------------------

    def room(self, running: list[Client]) -> tuple[int, str]:
        booked = sum(c.size for c in running)
        free = slice_room(self.limit, booked, self.backend.slice_usage().used)
        try:
            from dispatch.core.hostfacts import read_meminfo

            available = read_meminfo().available
        except OSError:
            return free, ""
        yet = sum(max(0, c.size - self._current(c)) for c in running)
        if available - yet < free:
            return available - yet, "memory used outside the slice holds it (the machine's MemAvailable)"
        return free, ""

    def _current(self, client: Client) -> int:
        if not client.unit:
            return 0
        try:
            return read_int(os.path.join(self.backend.slice_dir, client.unit, "memory.current"))
        except (OSError, ValueError):
            return 0

    def evaluate(self) -> None:
        running = [c for c in self.clients.values() if c.state == "running"]
        waiting = sorted((c for c in self.clients.values() if c.state == "waiting"), key=lambda c: c.seq)
        if not waiting:
            return
        try:
            free, note = self.room(running)
        except (OSError, ValueError, BackendError) as exc:  # nothing admitted: the next tick tries again
            _log(f"cannot read the slice's room: {exc}")
            return
        blocked = False
        for ahead, client in enumerate(waiting):
            if not blocked and client.size <= free:
                if client.unit:
                    try:
                        self.manager.set_properties(client.unit, [("MemoryMax", ("t", client.cap))])
                    except (BackendError, OSError) as exc:
                        client.send({"error": f"cannot raise the scope's limit: {exc}"})
                        continue
                client.state, client.since = "running", time.time()
                client.send({"state": "admitted"})
                free -= client.size
                running.append(client)
                continue
            blocked = True
            holders = sorted(running, key=lambda c: -c.size)[:4]
            news = {"state": "waiting", "ahead": ahead, "need": client.size, "free": free,
                    "note": note, "holders": [{"user": h.user, "label": h.label, "size": h.size}
                                              for h in holders]}
            key = (ahead, free >> 20, note, tuple(h.seq for h in holders))
            if key != client.last_news and not client.out:  # news waits while answers are unread
                client.last_news = key
                client.send(news)


def _size(value: object, what: str) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{what}: a positive number of bytes")
    return value


def _grace(value: object) -> float:
    """Seconds within ``GRACE``, compared before any conversion (a huge int overflows a float)."""
    low, high = GRACE
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
        return float(value)
    raise ValueError(f"grace: seconds, {low:g} to {high:g}")


def listening_socket(path: str | None) -> socket.socket:
    """systemd's socket (``LISTEN_FDS``), else one bound at ``path`` (a test's own daemon)."""
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


def main(argv: list[str] | None = None) -> int:
    """``python3 -m dispatch.local.sharedd --slice UNIT --size BYTES --group NAME [--listen PATH]``,
    as the socket unit ``hostrun shared install`` writes starts it."""
    args = sys.argv[1:] if argv is None else argv
    opts = dict(zip(args[::2], args[1::2]))
    if os.geteuid() != 0:
        print("hostrun-shared: must run as root", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    from dispatch.capping.cgroupfs import parse_mountinfo, read_self_files
    from dispatch.core.units import parse_size

    unit = opts.get("--slice", "hostrun.slice")
    limit = parse_size(opts.get("--size", ""))
    mount = parse_mountinfo(read_self_files()[1]).get("cgroup2")
    if not mount:
        print("hostrun-shared: no unified cgroup2 hierarchy", file=sys.stderr)
        return int(ExitCode.NOT_RUN)
    raise_descriptor_limit(MAX_CLIENTS + 1024)
    manager = Manager(SYSTEM_MANAGER, "", False)
    backend = SystemdBackend(mount, unit, manager)
    backend.ensure_slice(limit)
    listener = listening_socket(opts.get("--listen") or (None if os.environ.get("LISTEN_FDS") else
                                                          SOCKET_PATH))
    Daemon(listener, unit, limit, opts.get("--group", ""), backend, manager).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
