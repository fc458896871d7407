"""The memory-cap axis: one interface, interchangeable backends (systemd, cgroup2, cgroup1, none).

A backend owns one *slice* (the parent of all hostrun jobs on the host, limited to the slice size,
swap 0) and makes one child *job cgroup* per job (limited to the job's cap, swap 0). Pure parsers of
the kernel's files live here too, so they can be tested on recorded outputs.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from abc import ABC, abstractmethod

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:  # typing is not imported on a run's path
    import signal
    from collections.abc import Callable
    from typing import Protocol

    from dispatch.core.engineshape import Reply, Request

    class BookingLink(Protocol):
        """What a job's cgroup asks of the admission engine's booking that holds it
        (``dispatch.local.engine.admitclient.Link``)."""

        booking_id: int | None

        def set_cgroup(self, path: str) -> None: ...

        def ask(self, message: Request) -> Reply: ...
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal


class Probe(NamedTuple):
    """Whether a backend works here and, if not, what is missing (shown by ``hostrun doctor``)."""

    ok: bool
    detail: str


class SliceUsage(NamedTuple):
    limit: int
    usage: int  # everything charged: page cache and kernel memory included
    held: int  # anonymous + shmem: what reclaim cannot free

    @property
    def used(self) -> int:
        """What counts against room: page cache never does (a finished job's cache must not block
        the next job)."""
        return self.held


class OomEvidence(NamedTuple):
    """What the kernel counters say happened to one job."""

    killed: bool = False  # the kernel OOM-killed a process of this job
    own: bool = False  # ... because the job hit its own cap
    slice_full: bool = False  # ... because the slice ran out
    counters: dict[str, int] = {}  # noqa: RUF012 - never mutated


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``memory.stat``, ``memory.events``, ``memory.oom_control``: ``key value`` per line."""
    result: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                result[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return result


def flat_value(data: bytes, key: str) -> int:
    """``parse_flat_keyed(text).get(key, 0)`` for one key of a file's raw bytes, found rather than
    parsed line by line: the job watch reads two keys of ``memory.stat`` up to 100 times a second."""
    needle = key.encode() + b" "
    if data.startswith(needle):
        start = 0
    else:
        start = data.find(b"\n" + needle) + 1
        if start == 0:
            return 0
    end = data.find(b"\n", start)
    parts = data[start:end if end >= 0 else len(data)].split()
    if len(parts) != 2:
        return 0
    try:
        return int(parts[1])
    except ValueError:
        return 0


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def read_int(path: str) -> int:
    value = read_text(path).strip()
    return (1 << 63) - 1 if value == "max" else int(value)


def read_keyed(path: str) -> dict[str, int]:
    try:
        return parse_flat_keyed(read_text(path))
    except OSError:
        return {}


def write_text(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(value)


def read_pids(procs_file: str) -> list[int]:
    try:
        return [int(p) for p in read_text(procs_file).split()]
    except (OSError, ValueError):
        return []


def kill_pids(procs_file: str, sig: int = signal.SIGKILL, settle: float = 5.0) -> bool:
    """Signal every process listed in a cgroup.procs file; with SIGKILL, repeat until it is empty.

    Repeating matters: a process may fork between our read and our kill. Returns True when the cgroup
    is empty (always True for signals other than SIGKILL once they were sent).
    """
    deadline = time.monotonic() + settle
    while True:
        pids = read_pids(procs_file)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig != signal.SIGKILL:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def remove_dir(path: str, settle: float = 2.0) -> None:
    """rmdir a cgroup; EBUSY right after the last process died is transient, so retry briefly."""
    deadline = time.monotonic() + settle
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


JOB_PREFIX = "job-"
SESSION_CGROUP_PREFIX = "session-"  # an agent session's cgroup (``hostrun session``), in the sessions slice


def make_job_dir(slice_dir: str, job_id: str, cap: int,
                 set_limit: Callable[[str, int], None], prefix: str = JOB_PREFIX) -> str:
    """Create a job's cgroup directory under the slice and set its limit (``prefix``: a session's
    in the sessions slice).

    An existing directory is another job's: it is never removed. A directory we made and could not
    limit is removed again (nothing may run uncapped).
    """
    from dispatch.core.errors import BackendError

    directory = os.path.join(slice_dir, f"{prefix}{job_id}")
    try:
        os.mkdir(directory)
    except OSError as exc:
        raise BackendError(f"cannot create job cgroup {directory}: {exc.strerror}") from None
    try:
        set_limit(directory, cap)
    except OSError as exc:
        try:
            os.rmdir(directory)
        except OSError:
            pass
        raise BackendError(f"cannot limit job cgroup {directory}: {exc.strerror}") from None
    return directory


def is_job_name(name: str, prefix: str = JOB_PREFIX, suffix: str = "") -> bool:
    """Whether ``name`` is one hostrun gives a job cgroup: ``<prefix><pid>-<start time><suffix>``."""
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return False
    parts = name[len(prefix):len(name) - len(suffix)].split("-")
    return len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts)


class SessionForm(NamedTuple):
    """Where a slice keeps its agent sessions: the sessions slice (a child of the slice) and how a
    session's cgroup in it is named."""

    directory: str  # the sessions slice's name in the slice's directory
    prefix: str
    suffix: str


def checked_job_path(slice_dir: str, path: str, prefix: str = JOB_PREFIX, suffix: str = "",
                     sessions: SessionForm | None = None) -> str | None:
    """The job cgroup a ledger row names, normalised, or None when hostrun must leave it alone.

    A row's path is not trusted: it is acted on (killed, removed, its pids read) only when, after
    ``normpath``, it is a direct child of the slice named as hostrun names jobs (or, with
    ``sessions``, a direct child of the sessions slice named as hostrun names sessions), and
    ``realpath`` agrees (no symbolic link on the way). ``<slice>/../victim`` or a link in the slice
    pointing elsewhere would otherwise make a reclaim kill and remove a cgroup that is not hostrun's.
    """
    if not slice_dir or not path.startswith("/") or "\0" in path:
        return None
    norm = os.path.normpath(path)
    base = os.path.normpath(slice_dir)
    name = os.path.basename(norm)
    parent = os.path.dirname(norm)
    if parent == base and is_job_name(name, prefix, suffix):
        real_parent = os.path.realpath(base)
    elif sessions is not None and parent == os.path.join(base, sessions.directory) \
            and is_job_name(name, sessions.prefix, sessions.suffix):
        real_parent = os.path.join(os.path.realpath(base), sessions.directory)
    else:
        return None
    if os.path.realpath(norm) != os.path.join(real_parent, name):
        return None
    return norm


def job_dir_at(slice_dir: str, path: str, prefix: str = JOB_PREFIX, suffix: str = "",
               sessions: SessionForm | None = None) -> str | None:
    """``checked_job_path``, and only while that directory exists (a real one, not a link)."""
    checked = checked_job_path(slice_dir, path, prefix, suffix, sessions)
    if checked is None:
        return None
    try:
        return checked if stat.S_ISDIR(os.lstat(checked).st_mode) else None
    except OSError:
        return None


class JobCgroup(ABC):
    """One job's cgroup. Made before the job starts; the job's process enters it before exec."""

    path: str
    cap: int

    def preexec(self) -> None:  # noqa: B027 - optional hook
        """Runs in the child between fork and exec (direct backends move the child in here)."""

    def adopt(self, pid: int) -> None:  # noqa: B027 - optional hook
        """Runs in hostrun right after the fork, while the child waits: a backend that cannot move
        the child itself (systemd) has it moved here. Raises BackendError when it cannot."""

    def take(self, pids: list[int]) -> None:
        """Move processes that are already running in (an agent session placed after it started,
        ``dispatch.local.sessions.sessionplace``); BackendError naming the first that cannot be moved. A
        process gone meanwhile is passed over."""
        from dispatch.core.errors import BackendError

        procs = os.path.join(self.path, "cgroup.procs")
        for pid in pids:
            try:
                write_text(procs, str(pid))
            except ProcessLookupError:
                continue
            except OSError as exc:
                raise BackendError(f"cannot move process {pid} into {self.path}: {exc.strerror}") from None

    def started(self, pid: int) -> None:  # noqa: B027 - optional hook
        """The job's main process is running as ``pid`` (also its process-group id)."""

    def held_by(self, booking: BookingLink) -> None:
        """An admission engine's booking holds this job (made once admitted): the booking is told
        where the job's cgroup is. A backend whose engine makes the cgroup itself (a shared slice's
        scope) keeps the booking for ``adopt``."""
        booking.set_cgroup(self.path or "")

    @abstractmethod
    def sample(self) -> int:
        """Memory in use now, page cache excluded (for the peak table)."""

    def in_use(self) -> int:
        """``sample`` once, from outside the job's run (admission's room, a report): no descriptor
        is kept (``sample`` keeps ``memory.stat`` open for the run's watch; the admission engine and
        ``hostrun top`` would pile one up per look)."""
        try:
            return self.sample()
        finally:
            self.close()

    @abstractmethod
    def charged_peak(self) -> int:
        """The kernel's own high-water mark (page cache included)."""

    def peak_estimate(self) -> int:
        """The kernel's high-water mark less the page cache still charged now (0 if unknown).

        Read after the job's processes are gone. It can only under-estimate when the job's cache grew
        after its peak, so it is combined with the sampled peak by taking the larger.
        """
        return 0

    @abstractmethod
    def pids(self) -> list[int]: ...

    @abstractmethod
    def signal_all(self, sig: int) -> None: ...

    @abstractmethod
    def kill_all(self) -> bool:
        """SIGKILL every process until none is left; True when empty."""

    @abstractmethod
    def oom_evidence(self) -> OomEvidence:
        """Read the OOM counters; call after the job's processes are gone, before ``remove``."""

    @abstractmethod
    def remove(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file descriptors (e.g. eventfds) held for this job."""

    def held_fds(self) -> list[int]:
        """The file descriptors this object holds (a forked guardian keeps these, closes the rest)."""
        return []


class CapBackend(ABC):
    name: str = ""
    slice_dir: str = ""  # "" when there is no slice (the ``none`` backend)
    # SIGTERM → SIGKILL when the backend itself stops a job (systemd's TimeoutStopSec after an OOM
    # kill); the host's kill_grace, set by whoever opens the slice.
    kill_grace: float = 10.0
    job_affixes: tuple[str, str] = (JOB_PREFIX, "")  # what a job cgroup's name starts and ends with
    # The slice's size when it is not this host's settings' to decide (a shared slice: its daemon's).
    fixed_limit: int | None = None
    # The socket of the engine that admits this slice's jobs when that is the backend's own (a
    # shared slice: root's engine); None: the state dir's own engine admits them.
    engine_socket: str | None = None

    @classmethod
    def probe(cls, configured_slice: str | None = None,
              files: tuple[str, str] | None = None) -> tuple[Probe, CapBackend | None]:
        """Whether this backend works here and, if so, the backend for ``configured_slice`` (the host's
        ``cgroup``; None: the default beside this process's cgroup). ``files``: /proc/self/cgroup and
        /proc/self/mountinfo as already read (None: read them). One signature for every backend
        (``dispatch.capping.BACKENDS``); a backend's test hooks come after it, keyword-only."""
        return Probe(False, f"{cls.name or cls.__name__} is never probed"), None

    @abstractmethod
    def describe(self) -> str:
        """Where the slice is, for ``hostrun doctor``."""

    @abstractmethod
    def ensure_slice(self, limit: int) -> None:
        """Create the slice if missing and make its limit ``limit`` (swap 0)."""

    @abstractmethod
    def slice_usage(self) -> SliceUsage: ...

    @abstractmethod
    def create_job(self, job_id: str, cap: int) -> JobCgroup: ...

    @abstractmethod
    def job_at(self, path: str) -> JobCgroup | None:
        """The job cgroup recorded at ``path`` in the ledger (for reclaiming a dead holder's job), or
        None when it is gone or not one of this slice's (see ``checked_job_path``)."""

    def job_name(self, job_id: str) -> str:
        """The name ``create_job(job_id)`` gives a job's cgroup (``job_id``: its holder's
        ``<pid>-<start time>``), so a ledger row's cgroup can be matched against the row's own holder."""
        prefix, suffix = self.job_affixes
        return f"{prefix}{job_id}{suffix}"

    def job_path_ok(self, path: str) -> bool:
        """Whether a ledger row's cgroup could be one of this slice's jobs or sessions (``hostrun
        ledger`` flags the rows for which it is not; nothing acts on them)."""
        return checked_job_path(self.slice_dir, path, *self.job_affixes, self.session_form) is not None

    def job_dir(self, path: str) -> str | None:
        """``job_dir_at`` for this slice: a job's cgroup, or a session's in its sessions slice."""
        return job_dir_at(self.slice_dir, path, *self.job_affixes, self.session_form)

    # -- agent sessions (``hostrun session``): a sessions slice inside the slice ------------------

    session_form: SessionForm | None = None  # None: this backend runs no sessions

    @property
    def sessions_dir(self) -> str:
        """The sessions slice's directory ("" when this backend runs no sessions)."""
        form = self.session_form
        return os.path.join(self.slice_dir, form.directory) if form is not None and self.slice_dir else ""

    def session_name(self, job_id: str) -> str:
        """The name ``create_session(job_id)`` gives a session's cgroup."""
        form = self.session_form
        if form is None:
            return ""
        return f"{form.prefix}{job_id}{form.suffix}"

    def names_of(self, job_id: str) -> tuple[str, ...]:
        """The names a run of holder ``job_id`` may give its cgroup: a job's, a session's."""
        session = self.session_name(job_id)
        return (self.job_name(job_id), session) if session else (self.job_name(job_id),)

    def take_problem(self, cgroup: str) -> str | None:
        """Why a running process in ``cgroup`` (its path under the mount) could not be moved into a
        session's cgroup here (``JobCgroup.take``), or None."""
        return None

    def ensure_sessions(self, limit: int) -> None:
        """Create the sessions slice if missing and make its limit ``limit`` (swap 0)."""
        from dispatch.core.errors import BackendError

        raise BackendError(f"the {self.name} backend runs no agent sessions")

    def create_session(self, job_id: str, cap: int, high: int) -> JobCgroup:
        """A session's cgroup in the sessions slice: limited to ``cap``, its high mark ``high``
        (reclaim and slow down first) where the cgroup version has one."""
        from dispatch.core.errors import BackendError

        raise BackendError(f"the {self.name} backend runs no agent sessions")

    @property
    def caps_memory(self) -> bool:
        return True
