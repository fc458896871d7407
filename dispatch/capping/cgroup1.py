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

from dispatch.capping import eventfd
from dispatch.capping.base import (
    SESSION_CGROUP_PREFIX,
    OomEvidence,
    make_job_dir,
    read_int,
    read_keyed,
    remove_dir,
    write_text,
)
from dispatch.capping.cgroupdir import DirectBackend, DirectJob, MemoryFiles, attribute, page_rounded
from dispatch.core.errors import BackendError

FILES = MemoryFiles(limit="memory.limit_in_bytes", usage="memory.usage_in_bytes",
                    peak="memory.max_usage_in_bytes", anon="total_rss", shmem="total_shmem",
                    cache="total_cache")


def set_limit(directory: str, limit: int) -> None:
    """Set memory and memory+swap limits to the same value (swap 0), in the order the kernel needs.

    memsw must stay >= the memory limit, so when raising set memsw first, when lowering set the
    memory limit first. The kernel rounds to pages, so we do too (and compare rounded values).
    """
    limit = page_rounded(limit)
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


class Cgroup1Job(DirectJob):
    memfiles = FILES

    def __init__(self, directory: str, cap: int, slice_dir: str, watch: bool = True) -> None:
        super().__init__(directory, cap)
        self._job_watch = _OomWatch(directory) if watch else None
        self._slice_watch = _OomWatch(slice_dir) if watch else None

    def preexec(self) -> None:
        """The forked child moves itself in by writing 0 ("this thread") to ``tasks``: a fork has
        one thread, so the thread is the whole process, and the kernel (5.19 and later) moves a
        lone thread that is the writer itself without taking the global threadgroup lock whose
        write side ``cgroup.procs`` takes, and which waits for an RCU grace period: 5-20 ms on these
        machines, 0.15 ms this way (an older kernel takes the lock either way)."""
        write_text(os.path.join(self.path, "tasks"), "0")

    def oom_evidence(self) -> OomEvidence:
        oom_kill = read_keyed(os.path.join(self.path, "memory.oom_control")).get("oom_kill", 0)
        job_events = self._job_watch.read() if self._job_watch else 0
        slice_events = self._slice_watch.read() if self._slice_watch else 0
        return attribute(oom_kill, job_events - slice_events, slice_events, {
            "oom_kill": oom_kill, "job_oom_events": job_events, "slice_oom_events": slice_events})

    def close(self) -> None:
        for watch in (self._job_watch, self._slice_watch):
            if watch:
                watch.close()
        super().close()

    def held_fds(self) -> list[int]:
        return [w.efd for w in (self._job_watch, self._slice_watch) if w is not None and w.efd >= 0]


class Cgroup1Backend(DirectBackend):
    name = "cgroup1"
    memfiles = FILES
    mount_key = cgroup_key = "memory"
    not_mounted = "no cgroup v1 memory controller mounted"
    found = "memory controller"
    set_limit = staticmethod(set_limit)

    def create_job(self, job_id: str, cap: int) -> Cgroup1Job:
        directory = make_job_dir(self.slice_dir, job_id, cap, set_limit)
        try:
            return Cgroup1Job(directory, cap, self.slice_dir)
        except OSError as exc:  # the OOM eventfds could not be registered
            remove_dir(directory)
            raise BackendError(f"cannot watch job cgroup {directory}: {exc.strerror}") from None

    def create_session(self, job_id: str, cap: int, high: int) -> Cgroup1Job:
        """A session's cgroup in the sessions slice. cgroup v1 has no high mark (its soft limit only
        acts under the whole machine's pressure): the cap alone holds it. Its OOM is told apart from
        the sessions slice's (and, through it, the slice's) as a job's is from the slice's."""
        directory = make_job_dir(self.sessions_dir, job_id, cap, set_limit, SESSION_CGROUP_PREFIX)
        try:
            return Cgroup1Job(directory, cap, self.sessions_dir)
        except OSError as exc:
            remove_dir(directory)
            raise BackendError(f"cannot watch session cgroup {directory}: {exc.strerror}") from None

    def job_at(self, path: str) -> Cgroup1Job | None:
        directory = self.job_dir(path)
        return None if directory is None else Cgroup1Job(directory, 0, os.path.dirname(directory),
                                                         watch=False)
