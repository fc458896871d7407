"""systemd transient scopes: ``systemd-run --scope --slice=hostrun.slice -p MemoryMax= …``.

Used when systemd is PID 1: on such machines systemd owns the cgroup tree and writing to it behind its
back is not allowed. The job's scope and the slice are still read through cgroup v2 files (counters,
usage), so OOM attribution is the cgroup2 rule. Not exercised against a real systemd here (these
machines have none as PID 1); tests run it against a command recorder and a fake cgroupfs.
"""

from __future__ import annotations

import os

from dispatch.capping.base import Probe, read_text
from dispatch.capping.cgroup2 import Cgroup2Backend, Cgroup2Job
from dispatch.capping.cgroupfs import parse_mountinfo, read_self_files
from dispatch.core.errors import BackendError

SLICE_UNIT = "hostrun.slice"


def _pid1_is_systemd(proc_root: str = "/proc") -> bool:
    try:
        with open(os.path.join(proc_root, "1", "comm"), encoding="utf-8") as fh:
            return fh.read().strip() == "systemd"
    except OSError:
        return False


def slice_cgroup_path(unit: str) -> str:
    """Where systemd puts a slice unit in the cgroup tree: a dash nests (systemd.slice(5)), so
    ``hostrun.slice`` is ``/hostrun.slice`` and ``hostrun-jobs.slice`` is
    ``/hostrun.slice/hostrun-jobs.slice``."""
    parts = unit[: -len(".slice")].split("-")
    return "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _valid_slice_unit(unit: str) -> bool:
    name = unit[: -len(".slice")] if unit.endswith(".slice") else ""
    return bool(name) and "/" not in unit and all(name.split("-"))


class SystemdBackend(Cgroup2Backend):
    name = "systemd"
    job_affixes = ("hostrun-job-", ".scope")  # the scope units create_job names

    def __init__(self, mount: str, slice_unit: str = SLICE_UNIT, systemd_run: str = "systemd-run",
                 systemctl: str = "systemctl") -> None:
        super().__init__(mount, slice_cgroup_path(slice_unit))
        self.slice_unit = slice_unit
        self.systemd_run = systemd_run
        self.systemctl = systemctl

    @classmethod
    def probe(  # type: ignore[override]
        cls, configured_slice: str | None = None, proc_root: str = "/proc",
        files: tuple[str, str] | None = None,
    ) -> tuple[Probe, SystemdBackend | None]:
        if not _pid1_is_systemd(proc_root):
            return Probe(False, "systemd is not PID 1"), None
        from dispatch.core.pathsearch import which

        run, ctl = which("systemd-run"), which("systemctl")
        if not run or not ctl:
            return Probe(False, "systemd-run or systemctl not on PATH"), None
        try:
            mount = parse_mountinfo((files or read_self_files())[1]).get("cgroup2")
        except OSError as exc:
            return Probe(False, f"cannot read /proc/self: {exc}"), None
        if not mount:
            return Probe(False, "systemd without a unified cgroup2 hierarchy"), None
        try:
            controllers = read_text(os.path.join(mount, "cgroup.controllers")).split()
        except OSError:
            controllers = []
        if "memory" not in controllers:  # hybrid mode: memory is on v1, our counters would be absent
            return Probe(False, f"memory controller not in the cgroup2 hierarchy at {mount} "
                                f"(systemd in hybrid mode)"), None
        unit = (configured_slice or "/" + SLICE_UNIT).strip("/")
        if not _valid_slice_unit(unit):
            return Probe(False, f"hosts.*.cgroup must name a slice unit (e.g. /hostrun.slice) "
                                f"for systemd, not {configured_slice}"), None
        return Probe(True, f"systemd-run at {run}"), cls(mount, unit, run, ctl)

    def describe(self) -> str:
        return f"{self.slice_unit} ({self.slice_dir})"

    def ensure_slice(self, limit: int) -> None:
        try:
            if self.limit_is(self.slice_dir, limit):
                return  # already right: skip a systemctl round trip on every job
        except (OSError, ValueError):
            pass
        argv = [self.systemctl, "set-property", "--runtime", self.slice_unit,
                f"MemoryMax={limit}", "MemorySwapMax=0"]
        import subprocess

        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            why = (proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[0]
            raise BackendError(f"cannot set limits on {self.slice_unit}: {why}")

    def create_job(self, job_id: str, cap: int) -> Cgroup2Job:
        prefix, suffix = self.job_affixes
        unit = f"{prefix}{job_id}{suffix}"
        wrapper = [self.systemd_run, "--scope", "--quiet", "--collect", f"--slice={self.slice_unit}",
                   f"--unit={unit}", "-p", f"MemoryMax={cap}", "-p", "MemorySwapMax=0"]
        return Cgroup2Job(os.path.join(self.slice_dir, unit), cap, self.slice_dir, wrapper=wrapper)
