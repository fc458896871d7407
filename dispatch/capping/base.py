"""The memory-cap axis: one interface, interchangeable backends (systemd, cgroup2, cgroup1, none).

A backend owns one *slice* (the parent of all hostrun jobs on the host, limited to the slice size,
swap 0) and makes one child *job cgroup* per job (limited to the job's cap, swap 0). Pure parsers of
the kernel's files live here too, so they can be tested on recorded outputs.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from dispatch.records import NamedTuple


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


class OomVerdict(NamedTuple):
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


def read_text(path: str) -> str:
    with open(path, encoding="ascii") as fh:
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
    with open(path, "w", encoding="ascii") as fh:
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


def make_job_dir(slice_dir: str, job_id: str, cap: int,
                 set_limit: Callable[[str, int], None]) -> str:
    """Create a job's cgroup directory under the slice and set its limit.

    An existing directory is another job's: it is never removed. A directory we made and could not
    limit is removed again (nothing may run uncapped).
    """
    from dispatch.errors import BackendError

    directory = os.path.join(slice_dir, f"job-{job_id}")
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


def is_job_dir(slice_dir: str, path: str) -> bool:
    """Whether a path recorded in the ledger is a job cgroup of this slice (and still there)."""
    return path.startswith(slice_dir + "/") and os.path.isdir(path)


class JobCgroup(ABC):
    """One job's cgroup. Made before the job starts; the job's process enters it before exec."""

    path: str
    cap: int

    def wrap_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv to exec; systemd wraps it in ``systemd-run --scope``, direct backends do not."""
        return list(argv)

    def preexec(self) -> None:  # noqa: B027 - optional hook
        """Runs in the child between fork and exec (direct backends move the child in here)."""

    def started(self, pid: int) -> None:  # noqa: B027 - optional hook
        """The job's main process is running as ``pid`` (also its process-group id)."""

    @abstractmethod
    def sample(self) -> int:
        """Memory in use now, page cache excluded (for the peak table)."""

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
    def verdict(self) -> OomVerdict:
        """Read the OOM counters; call after the job's processes are gone, before ``remove``."""

    @abstractmethod
    def remove(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file descriptors (e.g. eventfds) held for this job."""


class CapBackend(ABC):
    name: str = ""

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
        """The job cgroup recorded at ``path`` in the ledger (for reclaiming a dead holder's job)."""

    @property
    def caps_memory(self) -> bool:
        return True
