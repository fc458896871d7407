"""cgroup v2 (unified) memory controller, driven directly through cgroupfs.

OOM attribution (kernel docs; docs/design.md, "Cap backends and OOM attribution"): ``oom`` counts on the
cgroup whose limit was hit, ``oom_kill`` on the victim's cgroup. Job killed and its own ``oom`` rose → own
cap; killed, own ``oom`` 0 and the slice's ``memory.events.local`` ``oom`` rose → slice full.
``memory.oom.group`` is never set on the slice (it would kill every job when one overflows it).

Not exercised against a real v2 memory controller on these machines (it is bound to v1 here); the tests
run it against a faithful fake cgroupfs.
"""

from __future__ import annotations

import os
import signal

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
    read_text,
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


def held(stat: dict[str, int]) -> int:
    """Anonymous plus shmem: what processes hold that reclaim cannot free (page cache excluded)."""
    return stat.get("anon", 0) + stat.get("shmem", 0)


PAGE = os.sysconf("SC_PAGE_SIZE")


def page_rounded(limit: int) -> int:
    """The kernel stores limits in whole pages and reads them back rounded down."""
    return limit - limit % PAGE


def set_limit(directory: str, limit: int) -> None:
    write_text(os.path.join(directory, "memory.max"), str(page_rounded(limit)))
    swap = os.path.join(directory, "memory.swap.max")
    if os.path.exists(swap):
        write_text(swap, "0")


def enable_memory(directory: str) -> None:
    """Make sure children of ``directory`` get the memory controller."""
    control = os.path.join(directory, "cgroup.subtree_control")
    if "memory" not in read_text(control).split():
        write_text(control, "+memory")


def _blocks_children(directory: str) -> bool:
    """True when ``+memory`` cannot be written to ``directory``'s subtree_control: it is not enabled
    yet and the (non-root) cgroup has processes of its own; the kernel answers EBUSY then."""
    try:
        enabled = "memory" in read_text(os.path.join(directory, "cgroup.subtree_control")).split()
    except OSError:
        return False
    return not enabled and bool(read_pids(os.path.join(directory, "cgroup.procs")))


class Cgroup2Job(JobCgroup):
    def __init__(self, directory: str, cap: int, slice_dir: str, wrapper: list[str] | None = None):
        self.path = directory
        self.cap = cap
        self.slice_dir = slice_dir
        self._wrapper = wrapper
        self._slice_oom_before = self._slice_oom()

    def _slice_oom(self) -> int:
        return read_keyed(os.path.join(self.slice_dir, "memory.events.local")).get("oom", 0)

    def wrap_argv(self, argv: list[str] | tuple[str, ...]) -> list[str]:  # type: ignore[override]
        return [*self._wrapper, "--", *argv] if self._wrapper else list(argv)

    def preexec(self) -> None:
        if self._wrapper is None:
            write_text(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def sample(self) -> int:
        return held(read_keyed(os.path.join(self.path, "memory.stat")))

    def charged_peak(self) -> int:
        try:
            return read_int(os.path.join(self.path, "memory.peak"))
        except OSError:
            return 0

    def peak_estimate(self) -> int:
        stat = read_keyed(os.path.join(self.path, "memory.stat"))
        return max(0, self.charged_peak() - (stat.get("file", 0) - stat.get("shmem", 0)))

    def pids(self) -> list[int]:
        return read_pids(os.path.join(self.path, "cgroup.procs"))

    def signal_all(self, sig: int) -> None:
        kill_pids(os.path.join(self.path, "cgroup.procs"), sig)

    def kill_all(self) -> bool:
        kill_file = os.path.join(self.path, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                write_text(kill_file, "1")
            except OSError:
                pass
        return kill_pids(os.path.join(self.path, "cgroup.procs"), signal.SIGKILL)

    def verdict(self) -> OomVerdict:
        events = read_keyed(os.path.join(self.path, "memory.events"))
        slice_oom = self._slice_oom() - self._slice_oom_before
        killed = events.get("oom_kill", 0) > 0
        own = killed and events.get("oom", 0) > 0
        return OomVerdict(
            killed=killed,
            own=own,
            slice_full=killed and not own and slice_oom > 0,
            counters={
                "oom": events.get("oom", 0),
                "oom_kill": events.get("oom_kill", 0),
                "slice_oom": slice_oom,
            },
        )

    def remove(self) -> None:
        remove_dir(self.path)


class Cgroup2Backend(CapBackend):
    name = "cgroup2"

    def __init__(self, mount: str, slice_path: str) -> None:
        self.mount = mount
        self.slice_path = slice_path
        self.slice_dir = mount.rstrip("/") + slice_path

    @classmethod
    def probe(
        cls, configured_slice: str | None = None, files: tuple[str, str] | None = None
    ) -> tuple[Probe, Cgroup2Backend | None]:
        try:
            cgroup_text, mountinfo = files or read_self_files()
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        mount = parse_mountinfo(mountinfo).get("cgroup2")
        own = parse_proc_cgroup(cgroup_text).get("")
        if not mount or own is None:
            return Probe(False, "no cgroup2 hierarchy mounted"), None
        slice_path = configured_slice or default_slice_path(own)
        parent = os.path.dirname((mount.rstrip("/") + slice_path).rstrip("/"))
        try:
            controllers = read_text(os.path.join(parent, "cgroup.controllers")).split()
        except OSError:
            return Probe(False, f"no cgroup.controllers in {parent}"), None
        if "memory" not in controllers:
            return Probe(False, f"memory controller not available in cgroup v2 at {parent}"), None
        if parent != mount.rstrip("/") and _blocks_children(parent):
            return Probe(False, f"{parent} holds processes of its own, so cgroup v2 cannot give its "
                                f"children the memory controller (no-internal-process rule); set "
                                f"hosts.*.cgroup to a slice outside it"), None
        if not os.access(parent, os.W_OK):
            return Probe(False, f"cannot create cgroups under {parent} (need write access)"), None
        return Probe(True, f"cgroup2 at {mount}"), cls(mount, slice_path)

    def describe(self) -> str:
        return self.slice_dir

    def ensure_slice(self, limit: int) -> None:
        try:
            enable_memory(os.path.dirname(self.slice_dir))
            os.makedirs(self.slice_dir, exist_ok=True)
            enable_memory(self.slice_dir)
            swap = os.path.join(self.slice_dir, "memory.swap.max")
            if (read_int(os.path.join(self.slice_dir, "memory.max")) != page_rounded(limit)
                    or (os.path.exists(swap) and read_int(swap) != 0)):
                set_limit(self.slice_dir, limit)
        except OSError as exc:
            raise BackendError(f"cannot prepare slice {self.slice_dir}: {exc.strerror}") from None

    def slice_usage(self) -> SliceUsage:
        d = self.slice_dir
        try:
            usage = read_int(os.path.join(d, "memory.current"))
            limit = read_int(os.path.join(d, "memory.max"))
        except OSError:
            return SliceUsage(limit=0, usage=0, held=0)
        return SliceUsage(limit=limit, usage=usage, held=held(read_keyed(os.path.join(d, "memory.stat"))))

    def create_job(self, job_id: str, cap: int) -> Cgroup2Job:
        return Cgroup2Job(make_job_dir(self.slice_dir, job_id, cap, set_limit), cap, self.slice_dir)

    def job_at(self, path: str) -> Cgroup2Job | None:
        directory = job_dir_at(self.slice_dir, path, *self.job_affixes)
        return None if directory is None else Cgroup2Job(directory, 0, self.slice_dir)
