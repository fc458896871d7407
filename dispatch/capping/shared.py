"""A shared slice: one memory budget for several users of a machine, kept by a root daemon.

Why a daemon: on systemd + cgroup v2 a normal user may only create cgroups in their own delegated
subtree (``user@UID.service``), so each user's slice is a budget of its own and two users together
can overfill the machine. One slice for everyone must live in the system manager, where only root
may start scopes; a polkit rule letting a group do so would hand that group root (systemd 252 checks
``StartTransientUnit`` with the plain ``manage-units`` action, without the unit's contents, and a
unit may name any command or process). So root runs ``hostrun-shared`` (``dispatch.local.sharedd``),
reached through ``/run/hostrun/shared.sock`` (mode 0660, the administrator's group), which does
exactly two things for a caller, identified by the kernel (``SO_PEERCRED``):

- **book**: admit the caller's job against the one slice limit, first come first served across
  users; the booking lives as long as the caller's connection (a dead caller unbooks itself, and
  nobody else can unbook it);
- **scope**: put two of the caller's own child processes (the job and its keeper) in a scope of the
  shared slice, limited to a small allowance until the booking is admitted and to the booked cap
  after. When the connection closes the daemon kills what is left in it: nothing runs unbooked.

This module is the client side: the wire (one JSON object per line each way), the connection, and
``SharedBackend``, the systemd backend whose jobs' scopes the daemon starts. Standard library only.
"""

from __future__ import annotations

import os
import stat
import time

from dispatch.capping.base import Probe
from dispatch.capping.cgroupfs import SOCKET_DIR as SOCKET_DIR  # kept in cgroupfs: the backend choice
from dispatch.capping.cgroupfs import SOCKET_ENV as SOCKET_ENV  # looks for the socket before it
from dispatch.capping.cgroupfs import SOCKET_PATH as SOCKET_PATH  # imports this client
from dispatch.capping.cgroupfs import socket_path
from dispatch.capping.systemd import SystemdBackend, SystemdJob, _spawn_keeper, slice_cgroup_path
from dispatch.core.errors import BackendError, SharedError

MYPY = False
if MYPY:
    import socket
    from collections.abc import Callable
    from typing import Any

PROTOCOL = 1
MAX_LINE = 1 << 20
JOB_AFFIXES = ("hostrun-shared-", ".scope")


def encode(message: dict[str, Any]) -> bytes:
    import json

    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    import json

    try:
        value = json.loads(line)
    except RecursionError:  # nested deeper than the parser's stack: not a message either
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def root_only(path: str) -> str | None:
    """Why ``path`` is not root's alone (None: it is): it and every directory above it owned by root
    and not writable by others (a sticky directory excepted above the leaf), no link on the way."""
    current = os.path.abspath(path)
    leaf = True
    while True:
        try:
            st = os.lstat(current)
        except OSError as exc:
            return f"{current}: {exc.strerror}"
        writable = st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
                                              and not leaf)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or (writable and not stat.S_ISSOCK(st.st_mode)):
            return (f"{current} is not root's alone (owner uid {st.st_uid}, mode "
                    f"{st.st_mode & 0o7777:o}{', a link' if stat.S_ISLNK(st.st_mode) else ''})")
        if current == "/":
            return None
        current, leaf = os.path.dirname(current), False


def trusted_socket(path: str) -> str | None:
    """Why ``path`` is not a daemon root runs (None: it is): the socket and every directory above it
    must be root's and not writable by others, or anyone could stand in for the daemon and hand out
    room that is not there. (The socket itself is group-writable: that is how the group connects.)"""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    return root_only(path)


class Connection:
    """One conversation with the daemon: requests and their answers, in order, plus the pushed
    ``waiting``/``admitted`` lines of a booking."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        import socket

        self.path = path
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._buf = b""
        try:
            self._sock.connect(path)
        except OSError as exc:
            self.close()
            raise SharedError(f"cannot reach the shared-slice daemon at {path}: {exc.strerror or exc}"
                              ) from None

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise SharedError("the connection to the shared-slice daemon is closed")
        return self._sock

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._socket().sendall(encode(message))
        except OSError as exc:
            raise SharedError(f"the shared-slice daemon went away: {exc.strerror or exc}") from None

    def receive(self, timeout: float | None = 10.0) -> dict[str, Any] | None:
        """The next line, or None when ``timeout`` passed first."""
        sock = self._socket()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return None
            except OSError as exc:
                raise SharedError(f"the shared-slice daemon went away: {exc.strerror or exc}") from None
            if not data:
                raise SharedError("the shared-slice daemon closed the connection")
            self._buf += data
            if len(self._buf) > MAX_LINE:
                raise SharedError("the shared-slice daemon sent a line too long to be an answer")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return decode(line)
        except ValueError as exc:
            raise SharedError(f"the shared-slice daemon sent a bad line: {exc}") from None

    def ask(self, message: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        """Send a request, return its answer (an ``error`` answer raised as SharedError)."""
        self.send(message)
        while True:
            answer = self.receive(timeout)
            if answer is None:
                raise SharedError(f"no answer from the shared-slice daemon to {message.get('op')!r} "
                                  f"in {timeout:.0f}s")
            if answer.get("state") in ("waiting", "admitted"):  # a booking's news, not the answer
                continue
            if "error" in answer:
                raise SharedError(str(answer["error"]))
            return answer

    def closed_by_daemon(self) -> bool:
        """Whether the daemon has closed this connection (read without consuming or waiting)."""
        import socket

        if self._sock is None:
            return False
        # Non-blocking for the peek: a timeout left from the last ``receive`` makes Python wait it
        # out and raise TimeoutError, which read as "closed" (a false warning at a job's end).
        self._sock.settimeout(0.0)
        try:
            return not self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def hello(path: str | None = None) -> dict[str, Any]:
    """The daemon's facts (slice unit, its cgroup, limit, group), on a connection of its own."""
    conn = Connection(path or socket_path())
    try:
        return conn.ask({"op": "hello", "protocol": PROTOCOL})
    finally:
        conn.close()


def listing(path: str | None = None) -> dict[str, Any]:
    """Every booking on the shared slice, every user's (``hostrun shared``)."""
    conn = Connection(path or socket_path())
    try:
        return conn.ask({"op": "list"})
    finally:
        conn.close()


class SharedJob(SystemdJob):
    """A job whose scope the daemon starts (``adopt``) and whose booking it holds; the connection
    is this job's, closed by ``remove`` (the daemon then kills whatever is left in the scope)."""

    def __init__(self, directory: str, cap: int, slice_dir: str, conn: Connection | None = None,
                 keeper_program: str | None = None) -> None:
        super().__init__(directory, cap, slice_dir, None, None, keeper_program)
        self.conn = conn

    def adopt(self, pid: int) -> None:
        if self.conn is None:
            return
        self.keeper, self._keeper_fd = _spawn_keeper(self._keeper_program or "cat")
        try:
            answer = self.conn.ask({"op": "scope", "pids": [self.keeper, pid], "cap": self.cap,
                                    "unit": self.unit})
            if answer.get("unit") != self.unit:
                raise SharedError(f"the daemon started {answer.get('unit')!r}, not {self.unit}")
        except BackendError:
            self._stop_keeper()
            raise

    def wait_admitted(self, size: int, cap: int, label: str, status_interval: float,
                      say: Callable[[str], None], on_wait: Callable[[dict[str, Any]], None] | None = None
                      ) -> float:
        """Book ``size`` on the shared slice and block until the daemon admits it; the seconds
        waited. Status lines (``say``) as the local wait prints them, naming who holds the room."""
        conn = self._require_conn()
        started = time.monotonic()
        conn.send({"op": "book", "size": size, "cap": cap, "label": label})
        last: dict[str, Any] | None = None
        said = 0.0
        while True:
            news = conn.receive(timeout=min(1.0, status_interval))
            if news is not None:
                if "error" in news:
                    raise SharedError(str(news["error"]))
                if news.get("state") == "admitted":
                    return time.monotonic() - started
                if news.get("state") == "waiting":
                    last = news
            now = time.monotonic()
            if last is not None and (said == 0.0 or now - said >= status_interval):
                say(waiting_line(last, now - started))
                said = now
                if on_wait is not None:
                    on_wait(last)

    def daemon_gone(self) -> bool:
        """Whether the daemon dropped this job's connection, and so its booking, while it ran."""
        return self.conn is not None and self.conn.closed_by_daemon()

    def _require_conn(self) -> Connection:
        if self.conn is None:
            raise SharedError("no connection to the shared-slice daemon")
        return self.conn

    def remove(self) -> None:
        self.close()  # the keeper and the sampled memory.stat (SystemdJob's)
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def waiting_line(news: dict[str, Any], waited: float) -> str:
    """One status line of a wait on the shared slice. Other users' labels arrive escaped."""
    from dispatch.core.text import printable
    from dispatch.core.units import format_size

    holders = ", ".join(
        f"{printable(str(h.get('user', '?')))}: {printable(str(h.get('label', '?')))} "
        f"{format_size(int(h.get('size', 0)))}" for h in news.get("holders", [])[:4])
    ahead = int(news.get("ahead", 0))
    text = (f"waiting {waited:.0f}s for room on the shared slice: need "
            f"{format_size(int(news.get('need', 0)))}, free {format_size(max(0, int(news.get('free', 0))))}"
            f"{f', {ahead} ahead' if ahead else ''}")
    if news.get("note"):
        text += f"; {printable(str(news['note']))}"
    return text + (f" (held by {holders})" if holders else "")


class SharedBackend(SystemdBackend):
    """The administrator's shared slice (``hostrun shared install``): its limit is the daemon's,
    a user's ``slice``/``reserve``/``cgroup`` keys do not apply, and admission is the daemon's."""

    name = "shared"
    job_affixes = JOB_AFFIXES

    def __init__(self, mount: str, facts: dict[str, Any], path: str, keeper_program: str) -> None:
        unit = str(facts["slice"])
        super().__init__(mount, unit, None, keeper_program)
        self.shared_limit = self.fixed_limit = int(facts["limit"])
        self.group = str(facts.get("group", ""))
        self.socket_path = path

    @classmethod
    def probe(  # type: ignore[override]
        cls, files: tuple[str, str] | None = None, proc_root: str = "/proc",
    ) -> tuple[Probe, SharedBackend | None]:
        path = socket_path()
        if not os.path.exists(path):
            return Probe(False, f"no shared slice on this machine ({path} missing; an administrator "
                                "sets one up with 'hostrun shared install')"), None
        problem = trusted_socket(path)
        if problem is not None:
            return Probe(False, f"not trusted: {problem}"), None
        from dispatch.capping.cgroupfs import parse_mountinfo, read_self_files

        try:
            mount = parse_mountinfo((files or read_self_files())[1]).get("cgroup2")
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        if not mount:
            return Probe(False, "no unified cgroup2 hierarchy"), None
        try:
            facts = hello(path)
        except SharedError as exc:
            return Probe(False, str(exc)), None
        if facts.get("protocol") != PROTOCOL:
            return Probe(False, f"the daemon speaks protocol {facts.get('protocol')!r}, this hostrun "
                                f"{PROTOCOL}: install the same version"), None
        from dispatch.core.pathsearch import which

        keeper = which("cat")
        if not keeper:
            return Probe(False, "no 'cat' on PATH (each job's scope is held by one)"), None
        from dispatch.core.units import format_size

        backend = cls(mount, facts, path, keeper)
        return Probe(True, f"{backend.slice_unit} ({format_size(backend.shared_limit)}) shared by group "
                           f"{backend.group or '?'} through {path}"), backend

    def describe(self) -> str:
        return f"{self.slice_unit}, shared through {self.socket_path} ({self.slice_dir})"

    def ensure_slice(self, limit: int) -> None:
        """The administrator's daemon keeps the slice: nothing to do here."""

    def job_name(self, job_id: str) -> str:
        prefix, suffix = self.job_affixes
        return f"{prefix}{os.getuid()}-{job_id}{suffix}"

    def create_job(self, job_id: str, cap: int) -> SharedJob:
        return SharedJob(os.path.join(self.slice_dir, self.job_name(job_id)), cap, self.slice_dir,
                         Connection(self.socket_path), self.keeper_program)

    def job_at(self, path: str) -> SharedJob | None:
        from dispatch.capping.base import job_dir_at

        prefix, suffix = self.job_affixes
        # only this user's units: another user's job is the daemon's to stop, never ours
        directory = job_dir_at(self.slice_dir, path, f"{prefix}{os.getuid()}-", suffix)
        return None if directory is None else SharedJob(directory, 0, self.slice_dir)


def slice_dir_of(mount: str, unit: str) -> str:
    return mount.rstrip("/") + slice_cgroup_path(unit)


def listing_lines(data: dict[str, Any], now: float | None = None) -> list[str]:
    """``hostrun shared``: the slice, then one line per booking, every user's, escaped (a label is
    whatever its user typed)."""
    from dispatch.core.text import printable
    from dispatch.core.units import format_duration, format_size

    now = time.time() if now is None else now
    bookings = data.get("bookings", [])
    booked = sum(int(b.get("size", 0)) for b in bookings if b.get("state") == "running")
    name, group = printable(str(data.get("slice"))), printable(str(data.get("group")))
    lines = [f"shared slice {name} for group {group}: "
             f"limit {format_size(int(data.get('limit', 0)))}, booked {format_size(booked)}, in use "
             f"{format_size(int(data.get('used', 0)))}"]
    if not bookings:
        lines.append("  no bookings")
    for b in bookings:
        lines.append(f"  {b.get('state', '?')!s:<8} {printable(str(b.get('user', '?'))):<12} "
                     f"{format_size(int(b.get('size', 0))):>9} (cap {format_size(int(b.get('cap', 0)))}) "
                     f"{format_duration(max(0.0, now - float(b.get('since', now))))} "
                     f"pid {int(b.get('pid', 0))}  {printable(str(b.get('label', '')))}")
    return lines
