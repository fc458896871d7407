"""cgroup v1 memory controller, driven directly through cgroupfs (what these machines have).

OOM attribution (docs/design.md, "Cap backends and OOM attribution"; measured here): v1 has no ``oom``
counter, and ``failcnt`` stays 0 once a memsw limit is set, so before the job starts we register an OOM
eventfd on the job and one on the slice (``cgroup.event_control``). The kernel notifies the cgroup that
ran out *and every cgroup below it*, so a slice-wide OOM also wakes the job's eventfd.
``memory.oom_control``'s ``oom_kill`` counts only the victim's own cgroup. Hence: killed and (job events -
slice events) > 0 → own cap; killed and slice events > 0 → slice full.
"""

from __future__ import annotations

import os
import signal

from dispatch.capping import eventfd
from dispatch.capping.base import (
    CapBackend,
    JobCgroup,
    OomVerdict,
    Probe,
    SliceUsage,
    job_dir_at,
    kill_pids,
    make_job_dir,
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

PAGE = os.sysconf("SC_PAGE_SIZE")


def _held(stat: dict[str, int]) -> int:
    """Memory processes hold and the kernel cannot reclaim: anonymous plus shmem (tmpfs).

    Not ``usage - file cache``: usage also carries kernel memory left behind by finished jobs' dead
    cgroups, which would make an empty slice look occupied.
    """
    return stat.get("total_rss", 0) + stat.get("total_shmem", 0)


def set_limit(directory: str, limit: int) -> None:
    """Set memory and memory+swap limits to the same value (swap 0), in the order the kernel needs.

    memsw must stay >= the memory limit, so when raising set memsw first, when lowering set the
    memory limit first. The kernel rounds to pages, so we do too (and compare rounded values).
    """
    limit -= limit % PAGE
    mem = os.path.join(directory, "memory.limit_in_bytes")
    memsw = os.path.join(directory, "memory.memsw.limit_in_bytes")
    has_memsw = os.path.exists(memsw)
    current = read_int(mem)
    order = [(memsw, limit), (mem, limit)] if limit >= current else [(mem, limit), (memsw, limit)]
    for path, value in order:
        if path == memsw and not has_memsw:
            continue
        write_text(path, str(value))


class _OomWatch:
    """An eventfd registered on a cgroup's memory.oom_control; counts OOM notifications."""

    def __init__(self, directory: str) -> None:
        self.efd = eventfd.open_eventfd()
        ofd = os.open(os.path.join(directory, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            write_text(os.path.join(directory, "cgroup.event_control"), f"{self.efd} {ofd}")
        except OSError:
            os.close(self.efd)
            raise
        finally:
            os.close(ofd)
        self.count = 0

    def read(self) -> int:
        self.count += eventfd.drain(self.efd)
        return self.count

    def close(self) -> None:
        if self.efd >= 0:
            os.close(self.efd)
            self.efd = -1


class Cgroup1Job(JobCgroup):
    def __init__(self, directory: str, cap: int, slice_dir: str, watch: bool = True) -> None:
        self.path = directory
        self.cap = cap
        self._job_watch = _OomWatch(directory) if watch else None
        self._slice_watch = _OomWatch(slice_dir) if watch else None

    def preexec(self) -> None:
        write_text(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def _stat(self) -> dict[str, int]:
        return read_keyed(os.path.join(self.path, "memory.stat"))

    def sample(self) -> int:
        return _held(self._stat())

    def charged_peak(self) -> int:
        try:
            return read_int(os.path.join(self.path, "memory.max_usage_in_bytes"))
        except OSError:
            return 0

    def peak_estimate(self) -> int:
        stat = self._stat()
        cache = stat.get("total_cache", 0) - stat.get("total_shmem", 0)
        return max(0, self.charged_peak() - cache)

    def pids(self) -> list[int]:
        return read_pids(os.path.join(self.path, "cgroup.procs"))

    def signal_all(self, sig: int) -> None:
        kill_pids(os.path.join(self.path, "cgroup.procs"), sig)

    def kill_all(self) -> bool:
        return kill_pids(os.path.join(self.path, "cgroup.procs"), signal.SIGKILL)

    def verdict(self) -> OomVerdict:
        oom = read_keyed(os.path.join(self.path, "memory.oom_control"))
        job_events = self._job_watch.read() if self._job_watch else 0
        slice_events = self._slice_watch.read() if self._slice_watch else 0
        killed = oom.get("oom_kill", 0) > 0
        own = killed and job_events - slice_events > 0
        return OomVerdict(
            killed=killed,
            own=own,
            slice_full=killed and not own and slice_events > 0,
            counters={
                "oom_kill": oom.get("oom_kill", 0),
                "job_oom_events": job_events,
                "slice_oom_events": slice_events,
            },
        )

    def remove(self) -> None:
        self.close()
        remove_dir(self.path)

    def close(self) -> None:
        for watch in (self._job_watch, self._slice_watch):
            if watch:
                watch.close()

    def held_fds(self) -> list[int]:
        return [w.efd for w in (self._job_watch, self._slice_watch) if w is not None and w.efd >= 0]


class Cgroup1Backend(CapBackend):
    name = "cgroup1"

    def __init__(self, mount: str, slice_path: str) -> None:
        self.mount = mount
        self.slice_path = slice_path
        self.slice_dir = mount.rstrip("/") + slice_path

    @classmethod
    def probe(cls, configured_slice: str | None = None) -> tuple[Probe, Cgroup1Backend | None]:
        try:
            cgroup_text, mountinfo = read_self_files()
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        mount = parse_mountinfo(mountinfo).get("memory")
        own = parse_proc_cgroup(cgroup_text).get("memory")
        if not mount or own is None:
            return Probe(False, "no cgroup v1 memory controller mounted"), None
        slice_path = configured_slice or default_slice_path(own)
        parent = os.path.dirname((mount.rstrip("/") + slice_path).rstrip("/"))
        if not os.access(parent, os.W_OK):
            return Probe(False, f"cannot create cgroups under {parent} (need write access)"), None
        return Probe(True, f"memory controller at {mount}"), cls(mount, slice_path)

    def describe(self) -> str:
        return self.slice_dir

    def ensure_slice(self, limit: int) -> None:
        try:
            os.makedirs(self.slice_dir, exist_ok=True)
            if read_int(os.path.join(self.slice_dir, "memory.limit_in_bytes")) != limit - limit % PAGE:
                set_limit(self.slice_dir, limit)
        except OSError as exc:
            raise BackendError(f"cannot prepare slice {self.slice_dir}: {exc.strerror}") from None

    def slice_usage(self) -> SliceUsage:
        d = self.slice_dir
        try:
            usage = read_int(os.path.join(d, "memory.usage_in_bytes"))
            limit = read_int(os.path.join(d, "memory.limit_in_bytes"))
        except OSError:
            return SliceUsage(limit=0, usage=0, held=0)
        return SliceUsage(limit=limit, usage=usage, held=_held(read_keyed(os.path.join(d, "memory.stat"))))

    def create_job(self, job_id: str, cap: int) -> Cgroup1Job:
        directory = make_job_dir(self.slice_dir, job_id, cap, set_limit)
        try:
            return Cgroup1Job(directory, cap, self.slice_dir)
        except OSError as exc:  # the OOM eventfds could not be registered
            remove_dir(directory)
            raise BackendError(f"cannot watch job cgroup {directory}: {exc.strerror}") from None

    def job_at(self, path: str) -> Cgroup1Job | None:
        directory = job_dir_at(self.slice_dir, path, *self.job_affixes)
        return None if directory is None else Cgroup1Job(directory, 0, self.slice_dir, watch=False)
