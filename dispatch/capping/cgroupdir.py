"""What the two direct backends (cgroup1, cgroup2) share: a slice and job cgroups hostrun writes itself.

Both versions keep the same facts in files of different names (``MemoryFiles``); what differs beyond
the names (how a limit is set, OOM attribution, what the probe must check) stays in ``cgroup1`` and
``cgroup2``.
"""

from __future__ import annotations

import os
from abc import abstractmethod

from dispatch.capping.base import (
    SESSION_CGROUP_PREFIX,
    CapBackend,
    JobCgroup,
    OomEvidence,
    Probe,
    SessionForm,
    SliceUsage,
    flat_value,
    kill_pids,
    read_int,
    read_keyed,
    read_pids,
    remove_dir,
    write_text,
)
from dispatch.capping.cgroupfs import (
    default_slice_path,
    parse_mountinfo,
    parse_proc_cgroup,
    read_self_files,
)
from dispatch.core.errors import BackendError
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    import signal
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

PAGE = os.sysconf("SC_PAGE_SIZE")
STAT_READ = 1 << 16  # bytes of memory.stat one sample reads


def page_rounded(limit: int) -> int:
    """The kernel stores limits in whole pages and reads them back rounded down."""
    return limit - limit % PAGE


class MemoryFiles(NamedTuple):
    """One cgroup version's names for the memory files and ``memory.stat`` keys hostrun reads."""

    limit: str  # the memory limit
    usage: str  # everything charged now
    peak: str  # the kernel's high-water mark
    anon: str  # memory.stat: anonymous memory
    shmem: str  # memory.stat: shmem (tmpfs)
    cache: str  # memory.stat: page cache, shmem included

    def held(self, stat: dict[str, int]) -> int:
        """Memory processes hold and the kernel cannot reclaim: anonymous plus shmem (tmpfs).

        Not ``usage - file cache``: usage also carries kernel memory left behind by finished jobs'
        dead cgroups, which would make an empty slice look occupied.
        """
        return stat.get(self.anon, 0) + stat.get(self.shmem, 0)

    def held_in(self, data: bytes) -> int:
        """``held`` of ``memory.stat`` as read, its raw bytes (the two keys looked up, not parsed)."""
        return flat_value(data, self.anon) + flat_value(data, self.shmem)


def attribute(oom_kills: int, own_ooms: int, slice_ooms: int, counters: dict[str, int]) -> OomEvidence:
    """The attribution rule both versions apply to their own counters: a process of the job was
    OOM-killed and the job's own limit was hit → own cap; killed, not its own, the slice's hit → slice
    full (docs/design.md, "Cap backends and OOM attribution")."""
    killed = oom_kills > 0
    own = killed and own_ooms > 0
    return OomEvidence(killed=killed, own=own, slice_full=killed and not own and slice_ooms > 0,
                      counters=counters)


class DirectJob(JobCgroup):
    """A job cgroup whose child moves itself in (``preexec``) and whose files hostrun reads."""

    memfiles: MemoryFiles

    def __init__(self, directory: str, cap: int) -> None:
        self.path = directory
        self.cap = cap

    def preexec(self) -> None:
        write_text(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    _stat_fd = -1  # memory.stat, kept open from the first sample to ``close``

    def _stat(self) -> dict[str, int]:
        return read_keyed(os.path.join(self.path, "memory.stat"))

    def sample(self) -> int:
        """``held`` now. The job watch samples every 10-50 ms: memory.stat is read through a
        descriptor kept open (a read from offset 0 has the kernel write the file afresh) and only
        its two keys are looked up, ~4x less CPU than an open, a text read and a full parse."""
        try:
            if self._stat_fd < 0:
                self._stat_fd = os.open(os.path.join(self.path, "memory.stat"), os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._stat_fd, STAT_READ, 0)
        except OSError:
            return 0
        if len(data) >= STAT_READ:  # not all of it (never seen: ~1-2 KiB)
            return self.memfiles.held(self._stat())
        return self.memfiles.held_in(data)

    def charged_peak(self) -> int:
        try:
            return read_int(os.path.join(self.path, self.memfiles.peak))
        except OSError:
            return 0

    def peak_estimate(self) -> int:
        stat = self._stat()
        cache = stat.get(self.memfiles.cache, 0) - stat.get(self.memfiles.shmem, 0)
        return max(0, self.charged_peak() - cache)

    def pids(self) -> list[int]:
        return read_pids(os.path.join(self.path, "cgroup.procs"))

    def signal_all(self, sig: int) -> None:
        kill_pids(os.path.join(self.path, "cgroup.procs"), sig)

    def kill_all(self) -> bool:
        return kill_pids(os.path.join(self.path, "cgroup.procs"), signal.SIGKILL)

    def close(self) -> None:
        if self._stat_fd >= 0:
            os.close(self._stat_fd)
            self._stat_fd = -1

    def remove(self) -> None:
        self.close()
        remove_dir(self.path)


class DirectBackend(CapBackend):
    """A slice under a cgroupfs mount: found from /proc/self, limited by writing its files."""

    memfiles: MemoryFiles
    mount_key: str  # the hierarchy's key in ``parse_mountinfo``
    cgroup_key: str  # its key in ``parse_proc_cgroup``
    not_mounted: str  # the probe's answer when there is none
    found: str  # the probe's answer when there is, before " at <mount>"

    def __init__(self, mount: str, slice_path: str) -> None:
        self.mount = mount
        self.slice_path = slice_path
        self.slice_dir = mount.rstrip("/") + slice_path

    @classmethod
    def probe(
        cls, configured_slice: str | None = None, files: tuple[str, str] | None = None
    ) -> tuple[Probe, DirectBackend | None]:
        """``files``: /proc/self/cgroup and /proc/self/mountinfo as read (tests pass recorded ones)."""
        try:
            cgroup_text, mountinfo = files or read_self_files()
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        mount = parse_mountinfo(mountinfo).get(cls.mount_key)
        own = parse_proc_cgroup(cgroup_text).get(cls.cgroup_key)
        if not mount or own is None:
            return Probe(False, cls.not_mounted), None
        slice_path = configured_slice or default_slice_path(own)
        parent = os.path.dirname((mount.rstrip("/") + slice_path).rstrip("/"))
        problem = cls.parent_problem(mount, parent)
        if problem is not None:
            return Probe(False, problem), None
        if not os.access(parent, os.W_OK):
            return Probe(False, f"cannot create cgroups under {parent} (need write access)"), None
        problem = cls.move_problem(mount, own, slice_path)
        if problem is not None:
            return Probe(False, problem), None
        return Probe(True, f"{cls.found} at {mount}"), cls(mount, slice_path)

    @classmethod
    def parent_problem(cls, mount: str, parent: str) -> str | None:
        """Why the slice cannot be made under ``parent`` (checked before write access), or None."""
        return None

    @classmethod
    def move_problem(cls, mount: str, own: str, slice_path: str) -> str | None:
        """Why a job's process could not move from hostrun's own cgroup ``own`` into the slice, or
        None (checked last, once the slice could be made)."""
        return None

    @staticmethod
    @abstractmethod
    def set_limit(directory: str, limit: int) -> None:
        """Limit a cgroup to ``limit`` bytes, swap 0."""

    def limit_is(self, directory: str, limit: int) -> bool:
        """Whether a cgroup's limit already is ``limit`` (page-rounded, as the kernel keeps it)."""
        return read_int(os.path.join(directory, self.memfiles.limit)) == page_rounded(limit)

    def describe(self) -> str:
        return self.slice_dir

    def make_slice(self) -> None:
        os.makedirs(self.slice_dir, exist_ok=True)

    def ensure_slice(self, limit: int) -> None:
        try:
            self.make_slice()
            if not self.limit_is(self.slice_dir, limit):
                self.set_limit(self.slice_dir, limit)
        except OSError as exc:
            raise BackendError(f"cannot prepare slice {self.slice_dir}: {exc.strerror}") from None

    session_form = SessionForm("sessions", SESSION_CGROUP_PREFIX, "")

    def take_problem(self, cgroup: str) -> str | None:
        return self.move_problem(self.mount, cgroup, self.slice_path)

    def make_sessions(self) -> None:
        os.makedirs(self.sessions_dir, exist_ok=True)

    def ensure_sessions(self, limit: int) -> None:
        """The sessions slice inside the slice (made once the slice is), limited to ``limit``."""
        try:
            self.make_sessions()
            if not self.limit_is(self.sessions_dir, limit):
                self.set_limit(self.sessions_dir, limit)
        except OSError as exc:
            raise BackendError(f"cannot prepare the sessions slice {self.sessions_dir}: "
                               f"{exc.strerror}") from None

    def slice_usage(self) -> SliceUsage:
        d = self.slice_dir
        try:
            usage = read_int(os.path.join(d, self.memfiles.usage))
            limit = read_int(os.path.join(d, self.memfiles.limit))
        except OSError:
            return SliceUsage(limit=0, usage=0, held=0)
        held = self.memfiles.held(read_keyed(os.path.join(d, "memory.stat")))
        return SliceUsage(limit=limit, usage=usage, held=held)
