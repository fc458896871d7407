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
- **Bounds**, so that no member can crash or stall the daemon for the others: a request line is at
  most ``MAX_REQUEST`` bytes and JSON nested too deep is refused (either ends that connection);
  numbers are checked for type and range before use (pids within ``PID_MAX``, ``grace`` 1 to 60 s,
  sizes positive whole bytes); any other failure of a request ends only its connection. Sockets
  never block: answers a caller does not read queue up to ``MAX_OUTPUT`` bytes, past which its
  connection is dropped. Connections: ``MAX_CLIENTS`` in all, ``MAX_PER_UID`` per user; a daemon out
  of descriptors stops accepting for ``ACCEPT_PAUSE`` seconds instead of dying.
- **Restart**: a daemon that starts knows no booking, so every job scope already in the slice runs
  unbooked: it kills them (``sweep``) before it admits anyone. Their callers' connections were the
  old daemon's and closed with it; hostrun says so when such a job ends.

One thread, one ``selectors`` loop: requests are handled one at a time (at most ``BATCH`` of one
caller's in a row), so admission needs no lock. Standard library only.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import struct
import sys
import time

from dispatch.capping.base import read_int
from dispatch.capping.shared import JOB_AFFIXES, PROTOCOL, SOCKET_PATH, decode, encode
from dispatch.capping.systemd import SYSTEM_MANAGER, Manager, SystemdBackend, scope_properties
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode
from dispatch.local.admission import slice_room

MYPY = False
if MYPY:
    from typing import Any

WAITING_MAX = 64 << 20  # a scope's limit until its booking is admitted: the forked child waits in it
TICK = 1.0  # seconds between re-evaluations while bookings wait (usage and MemAvailable move)
MAX_CLIENTS = 1024  # connections in all (the unit's LimitNOFILE is well above it)
MAX_PER_UID = 128  # connections of one user: one member cannot take every slot from the others
MAX_REQUEST = 64 << 10  # bytes in one request line (hostrun's are under 1 KiB)
MAX_OUTPUT = 256 << 10  # bytes of answers queued for a caller that does not read them
BATCH = 64  # one caller's requests handled in a row before the others get their turn
ACCEPT_PAUSE = 0.5  # seconds without accepting once out of descriptors (accept would fail at once)
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: no process id is larger
GRACE = (1.0, 60.0)  # seconds a scope's processes get between SIGTERM and SIGKILL
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _log(text: str) -> None:
    """One line to the journal (the unit's stderr)."""
    try:
        print(f"hostrun-shared: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Client:
    """One connection: at most one booking and one scope, and the answers it has yet to read.

    ``send`` never blocks: what the socket does not take at once waits in ``out`` for the loop to
    write when the caller reads; a caller whose ``out`` would pass ``MAX_OUTPUT`` is ``end``ed.
    Either way the loop learns of it through ``dirty``."""

    def __init__(self, sock: socket.socket, uid: int, pid: int, seq: int, user: str,
                 dirty: set[Client]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.uid = uid
        self.pid = pid
        self.seq = seq
        self.buf = b""
        self.out = bytearray()
        self.gone = ""  # why the loop is to drop this connection ("" while it is not)
        self.events = selectors.EVENT_READ
        self._dirty = dirty
        self.user = user
        self.unit = ""
        self.cap = 0
        self.size = 0
        self.label = ""
        self.state = ""  # "", "waiting", "running"
        self.since = 0.0
        self.last_news: tuple[object, ...] = ()

    def send(self, message: dict[str, Any]) -> None:
        if self.gone:
            return
        data = encode(message)
        if self.out:
            if len(self.out) + len(data) > MAX_OUTPUT:
                self.end(f"does not read its answers ({len(self.out)} bytes unread)")
                return
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.end("")  # gone: nothing to say to it
            return
        if sent < len(data):
            self.out += data[sent:]
            self._dirty.add(self)  # the loop waits until it can write the rest

    def flush(self) -> None:
        """Write what the socket takes of ``out`` (the loop saw it writable)."""
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self.end("")
            return
        del self.out[:sent]
        if not self.out:
            self._dirty.add(self)

    def end(self, why: str) -> None:
        self.gone = why or "closed"
        self._dirty.add(self)

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


class Daemon:
    def __init__(self, listener: socket.socket, slice_unit: str, limit: int, group: str,
                 backend: SystemdBackend, manager: Manager) -> None:
        self.listener = listener
        self.slice_unit = slice_unit
        self.limit = limit
        self.group = group
        self.backend = backend
        self.manager = manager
        self.clients: dict[int, Client] = {}
        self.per_uid: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.dirty: set[Client] = set()
        self.pending: set[Client] = set()  # callers with whole request lines not yet handled
        self.seq = 0
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.accepting = True
        self._accept_again = 0.0

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self, handle_signals: bool = True) -> None:
        """Until SIGTERM/SIGINT (``handle_signals``, the main thread's), or ``stop``."""
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        if handle_signals:
            signal.signal(signal.SIGTERM, self._stop)
            signal.signal(signal.SIGINT, self._stop)
        self.sweep()
        while not self.stopping:
            self._turn()
        for client in list(self.clients.values()):
            self._drop(client, evaluate=False)
        self.selector.close()
        self.listener.close()

    def _turn(self) -> None:
        """One wake-up: what the sockets have, the requests pending, the waiting bookings."""
        waiting = any(c.state == "waiting" for c in self.clients.values())
        timeout = 0.0 if self.pending else TICK if waiting else None
        if not self.accepting:
            left = max(0.0, self._accept_again - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        for key, events in self.selector.select(timeout):
            client = key.data
            try:
                if client is None:
                    self._accept()
                elif not client.gone:
                    if events & selectors.EVENT_WRITE:
                        client.flush()
                    if events & selectors.EVENT_READ and client not in self.pending:
                        self._read(client)
            except Exception as exc:  # a fault of this daemon's: it ends one connection, not all
                _log(f"{type(exc).__name__} on a connection: {exc}")
                if client is not None:
                    client.end("")
            self._settle()
        for client in list(self.pending):
            self._work(client)
            self._settle()
        if not self.accepting and time.monotonic() >= self._accept_again:
            self.selector.register(self.listener, selectors.EVENT_READ, None)
            self.accepting = True
        if waiting:
            self.evaluate()
            self._settle()

    def _settle(self) -> None:
        """Drop the connections that ended; wait for writability where answers are queued."""
        while self.dirty:
            client = self.dirty.pop()
            if client.fd not in self.clients:
                continue
            if client.gone:
                self._drop(client)
                continue
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0)
            if events != client.events:
                self.selector.modify(client.sock, events, client)
                client.events = events

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True

    def stop(self) -> None:
        """From another thread: the loop ends at its next wake-up (a connection wakes it)."""
        self.stopping = True

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:  # the connection waits in the backlog meanwhile
                _log(f"cannot accept ({exc.strerror}): not accepting for {ACCEPT_PAUSE:g}s")
                self.selector.unregister(self.listener)
                self.accepting = False
                self._accept_again = time.monotonic() + ACCEPT_PAUSE
            return  # else: that caller gave up before it was accepted
        try:
            sock.setblocking(False)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            sock.close()
            return
        pid, uid, _gid = struct.unpack("3i", creds)
        refusal = ""
        if len(self.clients) >= MAX_CLIENTS:
            refusal = f"the shared-slice daemon holds {len(self.clients)} connections, its most"
        elif self.per_uid.get(uid, 0) >= MAX_PER_UID:
            refusal = (f"uid {uid} has {self.per_uid[uid]} connections to the shared-slice daemon, "
                       "the most one user may hold")
        if refusal:
            try:
                sock.send(encode({"error": refusal}))
            except OSError:
                pass
            sock.close()
            return
        if uid not in self.names:
            self.names[uid] = _user_name(uid)
        self.seq += 1
        client = Client(sock, uid, pid, self.seq, self.names[uid], self.dirty)
        self.clients[client.fd] = client
        self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
        self.selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client: Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            client.end("")
            return
        client.buf += data
        self._work(client)
        if b"\n" not in client.buf and len(client.buf) > MAX_REQUEST:
            client.send({"error": "request too long"})
            client.end("request too long")

    def _work(self, client: Client) -> None:
        """Handle up to ``BATCH`` of the caller's whole lines; the rest wait for the next turn."""
        self.pending.discard(client)
        for _ in range(BATCH):
            if client.gone or b"\n" not in client.buf:
                return
            line, _, client.buf = client.buf.partition(b"\n")
            self._request(client, line)
        if not client.gone and b"\n" in client.buf:
            self.pending.add(client)

    def _request(self, client: Client, line: bytes) -> None:
        if len(line) > MAX_REQUEST:
            client.send({"error": "request too long"})
            client.end("request too long")
            return
        try:
            message = decode(line)
        except (ValueError, RecursionError):
            client.send({"error": "not a JSON object"})
            client.end("not a JSON object")
            return
        try:
            answer = self.handle(client, message)
        except (BackendError, OSError, ValueError, TypeError) as exc:
            answer = {"error": str(exc)[:500]}
        except Exception as exc:  # anything else: this request's connection ends, the daemon goes on
            _log(f"{type(exc).__name__} handling a request of uid {client.uid}: {str(exc)[:200]}")
            client.send({"error": f"the shared-slice daemon could not handle this request "
                                  f"({type(exc).__name__})"})
            client.end(type(exc).__name__)
            return
        if answer is not None:
            client.send(answer)

    def _drop(self, client: Client, evaluate: bool = True) -> None:
        if self.clients.get(client.fd) is not client:
            return
        del self.clients[client.fd]
        self.per_uid[client.uid] -= 1
        if not self.per_uid[client.uid]:
            del self.per_uid[client.uid]
        self.pending.discard(client)
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        client.gone = client.gone or "closed"
        if client.unit:
            self._kill_unit(client.unit)
        client.state = ""
        if evaluate:
            self.evaluate()

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


def _raise_descriptor_limit() -> None:
    """Room for every connection and the descriptors a request needs (the unit sets LimitNOFILE
    too; this covers a daemon started by hand)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_CLIENTS + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


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
    _raise_descriptor_limit()
    manager = Manager(SYSTEM_MANAGER, "", False)
    backend = SystemdBackend(mount, unit, manager)
    backend.ensure_slice(limit)
    listener = listening_socket(opts.get("--listen") or (None if os.environ.get("LISTEN_FDS") else
                                                          SOCKET_PATH))
    Daemon(listener, unit, limit, opts.get("--group", ""), backend, manager).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
