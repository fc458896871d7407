"""cgroup v2 (unified) memory controller, driven directly through cgroupfs.

OOM attribution (kernel docs; docs/design.md, "Cap backends and OOM attribution"): ``oom`` counts on the
cgroup whose limit was hit, ``oom_kill`` on the victim's cgroup. Job killed and its own ``oom`` rose → own
cap; killed, own ``oom`` 0 and the slice's ``memory.events.local`` ``oom`` rose → slice full.
``memory.oom.group`` is never set on the slice (it would kill every job when one overflows it).

Tested against a faithful fake cgroupfs here (these machines bind memory to v1), and against a real
kernel with cgroup v2 in the test VM (tests/vm/test_vm_*.py).
"""

from __future__ import annotations

import os

from dispatch.capping.base import (
    SESSION_CGROUP_PREFIX,
    OomEvidence,
    make_job_dir,
    read_int,
    read_keyed,
    read_pids,
    read_text,
    remove_dir,
    write_text,
)
from dispatch.capping.cgroupdir import DirectBackend, DirectJob, MemoryFiles, attribute, page_rounded
from dispatch.core.errors import BackendError

FILES = MemoryFiles(limit="memory.max", usage="memory.current", peak="memory.peak", anon="anon",
                    shmem="shmem", cache="file")


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


class Cgroup2Job(DirectJob):
    memfiles = FILES

    def __init__(self, directory: str, cap: int, slice_dir: str, *outer: str):
        """``slice_dir``: the cgroup whose limit holds this one; ``outer``: those above it that may
        run out too (a session's: the sessions slice, then the slice)."""
        super().__init__(directory, cap)
        self.slice_dir = slice_dir
        self.limits = (slice_dir, *outer)
        self._slice_oom_before = self._slice_oom()

    def _slice_oom(self) -> int:
        return sum(read_keyed(os.path.join(d, "memory.events.local")).get("oom", 0) for d in self.limits)

    def kill_all(self) -> bool:
        kill_file = os.path.join(self.path, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                write_text(kill_file, "1")
            except OSError:
                pass
        return super().kill_all()

    def oom_evidence(self) -> OomEvidence:
        events = read_keyed(os.path.join(self.path, "memory.events"))
        oom, oom_kill = events.get("oom", 0), events.get("oom_kill", 0)
        slice_oom = self._slice_oom() - self._slice_oom_before
        return attribute(oom_kill, oom, slice_oom, {"oom": oom, "oom_kill": oom_kill, "slice_oom": slice_oom})


class Cgroup2Backend(DirectBackend):
    name = "cgroup2"
    memfiles = FILES
    mount_key = "cgroup2"
    cgroup_key = ""
    not_mounted = "no cgroup2 hierarchy mounted"
    found = "cgroup2"
    set_limit = staticmethod(set_limit)

    @classmethod
    def parent_problem(cls, mount: str, parent: str) -> str | None:
        try:
            controllers = read_text(os.path.join(parent, "cgroup.controllers")).split()
        except OSError:
            return f"no cgroup.controllers in {parent}"
        if "memory" not in controllers:
            return f"memory controller not available in cgroup v2 at {parent}"
        if parent != mount.rstrip("/") and _blocks_children(parent):
            return (f"{parent} holds processes of its own, so cgroup v2 cannot give its children "
                    f"the memory controller (no-internal-process rule); set hosts.*.cgroup to a "
                    f"slice outside it")
        return None

    @classmethod
    def move_problem(cls, mount: str, own: str, slice_path: str) -> str | None:
        """cgroup v2 moves a process only by a write to the ``cgroup.procs`` of the nearest cgroup
        above both its old and its new cgroup. A normal user's login shell sits in
        ``session-N.scope`` (root's), so the nearest common cgroup of it and the user's delegated
        subtree is root's too: every job would fail with "Permission denied" (and ``doctor`` used to
        call the backend usable)."""
        own_parts = [p for p in own.split("/") if p]
        slice_parts = [p for p in slice_path.split("/") if p]
        common: list[str] = []
        for a, b in zip(own_parts, slice_parts):
            if a != b:
                break
            common.append(a)
        procs = os.path.join(mount.rstrip("/"), *common, "cgroup.procs")
        if os.access(procs, os.W_OK):
            return None
        return (f"cannot move a job from {own} into {slice_path}: {procs} is not writable (cgroup v2 "
                "moves a process only within a subtree delegated to you); start hostrun inside that "
                "subtree (e.g. under 'systemd-run --user --scope -p Delegate=yes'), or use the "
                "systemd backend")

    def limit_is(self, directory: str, limit: int) -> bool:
        swap = os.path.join(directory, "memory.swap.max")
        return (super().limit_is(directory, limit)
                and (not os.path.exists(swap) or read_int(swap) == 0))

    def make_slice(self) -> None:
        enable_memory(os.path.dirname(self.slice_dir))
        super().make_slice()
        enable_memory(self.slice_dir)

    def create_job(self, job_id: str, cap: int) -> Cgroup2Job:
        return Cgroup2Job(make_job_dir(self.slice_dir, job_id, cap, set_limit), cap, self.slice_dir)

    def make_sessions(self) -> None:
        super().make_sessions()
        enable_memory(self.sessions_dir)

    def create_session(self, job_id: str, cap: int, high: int) -> Cgroup2Job:
        """A session's cgroup in the sessions slice, limited to ``cap`` and held back (reclaim,
        throttling) above ``high``; a kill there takes the whole session (``memory.oom.group``):
        an agent left without the processes it started cannot go on."""
        directory = make_job_dir(self.sessions_dir, job_id, cap, set_limit, SESSION_CGROUP_PREFIX)
        try:
            write_text(os.path.join(directory, "memory.high"), str(page_rounded(high)))
            write_text(os.path.join(directory, "memory.oom.group"), "1")
        except OSError as exc:
            remove_dir(directory)
            raise BackendError(f"cannot set the high mark of session cgroup {directory}: "
                               f"{exc.strerror}") from None
        return Cgroup2Job(directory, cap, self.sessions_dir, self.slice_dir)

    def job_at(self, path: str) -> Cgroup2Job | None:
        directory = self.job_dir(path)
        return None if directory is None else Cgroup2Job(directory, 0, os.path.dirname(directory))
