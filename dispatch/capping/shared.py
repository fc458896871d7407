"""A shared slice: one memory budget for several users of a machine, kept by a root process.

Why root: on systemd + cgroup v2 a normal user may only create cgroups in their own delegated
subtree (``user@UID.service``), so each user's slice is a budget of its own and two users together
can overfill the machine. One slice for everyone must live in the system manager, where only root
may start scopes; a polkit rule letting a group do so would hand that group root (systemd 252 checks
``StartTransientUnit`` with the plain ``manage-units`` action, without the unit's contents, and a
unit may name any command or process). So root runs the slice's admission engine
(``hostrun-shared``, ``dispatch.local.shared.sharedd``: the engine of a state dir, for every member),
reached through ``/run/hostrun/shared.sock`` (mode 0660, the administrator's group). A member's run
books there as a run books with its own engine (``dispatch.local.shared.sharedlink``), first come first
served across users; the booking is its connection's (a dead caller unbooks itself, and nobody
else can unbook it); once admitted, the engine puts two of the caller's own child processes (the
job and its keeper) in a scope of the slice capped at the booking's cap (``scope``). When the
connection closes the engine kills what is left in it: nothing runs unbooked.

This module is the client's side: one-shot requests (``hello``, ``list``), ``SharedJob`` (whose
scope the engine starts) and ``SharedBackend``. Standard library only."""

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
from dispatch.core.errors import BackendError, HostrunError, SharedError

MYPY = False
if MYPY:

    from collections.abc import Mapping

    from dispatch.capping.base import BookingLink
    from dispatch.core.engineshape import Reply, Request

PROTOCOL = 2  # the admission engine's (``reach.PROTOCOL``, checked equal by a test); 1 was a daemon's
MAX_LINE = 1 << 20
JOB_AFFIXES = ("hostrun-shared-", ".scope")


def encode(message: Mapping[str, object]) -> bytes:
    import json

    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Request:
    import json

    try:
        value: Request = json.loads(line)
    except RecursionError:  # nested deeper than the parser's stack: not a message either
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value  # its fields unchecked: each is, where the engine reads it (engine/requests.py)


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


def ask_once(path: str, message: Request, timeout: float = 10.0) -> Reply:
    """One request on a connection of its own, its answer (the engine's frame: the length in 4
    bytes, then ``marshal``; it is root's, checked by ``trusted_socket``); an ``error`` answer, or
    no engine there, raised as SharedError."""
    import marshal
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
            sock.sendall(encode(message))
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise SharedError("the shared slice's engine closed the connection")
                data += chunk
                if len(data) > MAX_LINE:
                    raise SharedError("the shared slice's engine sent an answer too long")
        except TimeoutError:
            raise SharedError(f"no answer from the shared slice's engine at {path} in {timeout:.0f}s"
                              ) from None
        except OSError as exc:
            raise SharedError(f"cannot reach the shared slice's engine at {path}: "
                              f"{exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        answer: Reply | None = marshal.loads(data[4:4 + int.from_bytes(data[:4], "big")])
    except (EOFError, ValueError, TypeError):
        answer = None
    if not isinstance(answer, dict):
        raise SharedError("the shared slice's engine sent something that is not an answer")
    if "error" in answer:
        raise SharedError(str(answer["error"]))
    return answer


def hello(path: str | None = None) -> Reply:
    """The engine's facts (slice unit, its cgroup, limit, group), on a connection of its own."""
    return ask_once(path or socket_path(), {"op": "hello", "protocol": PROTOCOL})


def listing(path: str | None = None) -> Reply:
    """Every booking on the shared slice, every user's (``hostrun shared``)."""
    return ask_once(path or socket_path(), {"op": "list"})


class SharedJob(SystemdJob):
    """A job whose scope the shared slice's engine starts (``adopt``), asked on the connection of
    the booking that holds it (``held_by``)."""

    def __init__(self, directory: str, cap: int, slice_dir: str, keeper_program: str | None = None
                 ) -> None:
        super().__init__(directory, cap, slice_dir, None, None, keeper_program)
        self.link: BookingLink | None = None

    def held_by(self, booking: BookingLink) -> None:
        self.link = booking

    def adopt(self, pid: int) -> None:
        if self.link is None or self.link.booking_id is None:
            raise SharedError("a job on the shared slice runs only once its engine admitted it")
        self.keeper, self._keeper_fd = _spawn_keeper(self._keeper_program or "cat")
        try:
            try:
                answer = self.link.ask({"op": "scope", "id": self.link.booking_id,
                                        "pids": [self.keeper, pid], "unit": self.unit})
            except (HostrunError, OSError) as exc:
                raise SharedError(f"the shared slice's engine did not start the job's scope: {exc}"
                                  ) from None
            if answer.get("unit") != self.unit:
                raise SharedError(f"the engine started {answer.get('unit')!r}, not {self.unit}")
        except BackendError:
            self._stop_keeper()
            raise


class SharedBackend(SystemdBackend):
    """The administrator's shared slice (``hostrun shared install``): its limit is the daemon's,
    a user's ``slice``/``reserve``/``cgroup`` keys do not apply, and admission is the daemon's."""

    name = "shared"
    job_affixes = JOB_AFFIXES

    def __init__(self, mount: str, facts: Reply, path: str, keeper_program: str) -> None:
        unit = str(facts["slice"])
        super().__init__(mount, unit, None, keeper_program)
        self.shared_limit = self.fixed_limit = int(facts["limit"])
        self.group = str(facts.get("group", ""))
        self.socket_path = self.engine_socket = path

    @classmethod
    def probe(  # type: ignore[override]  # CapBackend.probe's signature; not systemd's test hooks
        cls, configured_slice: str | None = None, files: tuple[str, str] | None = None, *,
        proc_root: str = "/proc",
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

    def create_job(self, job_id: str, cap: int) -> SharedJob:
        return SharedJob(os.path.join(self.slice_dir, self.job_name(job_id)), cap, self.slice_dir,
                         self.keeper_program)

    def job_at(self, path: str) -> SharedJob | None:

        directory = self.job_dir(path)
        return None if directory is None else SharedJob(directory, 0, self.slice_dir)


def slice_dir_of(mount: str, unit: str) -> str:
    return mount.rstrip("/") + slice_cgroup_path(unit)


def listing_lines(data: Reply, now: float | None = None) -> list[str]:
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
