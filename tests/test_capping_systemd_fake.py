"""The systemd backend (``dispatch.capping.systemd.SystemdBackend``) against FAKE systemd tools.

What is real and what is not: these machines have no systemd as PID 1 and no cgroup v2 memory
controller, so no real systemd is ever asked to do anything here. Instead:

- PID 1 is faked with a directory passed as ``proc_root`` (``1/comm`` reads ``systemd`` or ``init``);
- /proc/self/mountinfo is passed in as text (``files=``), pointing the cgroup2 mount at a tmp_path
  directory that holds a hand-written ``cgroup.controllers``;
- ``systemd-run`` and ``systemctl`` are small Python recorder scripts in a directory put first on
  PATH: each appends its argv as one JSON line to a log file; the fake ``systemd-run`` then execs the
  command after ``--`` (as ``systemd-run --scope`` does, keeping the pid), and the fake ``systemctl``
  can be told to fail with a message on stderr.

So these tests check the exact command lines we hand to systemd and how we read its answers, and that
the wrapped command really runs with its argv intact; they do not check that systemd creates the scope,
applies MemoryMax or counts OOMs. Real: the processes started through the fake ``systemd-run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.capping.cgroup2 import Cgroup2Job
from dispatch.capping.systemd import SystemdBackend, slice_cgroup_path
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode

GiB = 1 << 30
MiB = 1 << 20

# A typical systemd, cgroup2-only machine (written to match Debian 12 / Fedora defaults).
SYSTEMD_PROC_CGROUP = "0::/user.slice/user-1000.slice/session-2.scope\n"
SYSTEMD_MOUNTINFO = (
    "22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "23 28 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
    "30 22 0:26 / {mount} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)
# Recorded on this machine (cgroup v1 only for memory): no cgroup2 line kept.
V1_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
"""

RECORDER = """\
#!{python}
import json, os, sys
TOOL = {tool!r}
with open({log!r}, "a", encoding="utf-8") as fh:
    fh.write(json.dumps({{"tool": TOOL, "argv": sys.argv[1:], "pid": os.getpid()}}) + "\\n")
if TOOL == "systemctl":
    fail = {fail!r}
    if os.path.exists(fail):
        with open(fail, encoding="utf-8") as fh:
            code, _, message = fh.read().partition("\\n")
        sys.stderr.write(message)
        sys.exit(int(code))
    sys.exit(0)
args = sys.argv[1:]
if "--" not in args:
    sys.stderr.write("fake systemd-run: no -- before the command\\n")
    sys.exit(1)
command = args[args.index("--") + 1:]
os.execvp(command[0], command)
"""


class FakeSystemd:
    """PID 1, mountinfo, the cgroup2 mount and recorder tools, all under tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc_root = tmp_path / "proc"
        (self.proc_root / "1").mkdir(parents=True)
        self.pid1("systemd")
        self.mount = tmp_path / "sys-fs-cgroup"
        self.mount.mkdir()
        (self.mount / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "calls.jsonl"
        self.fail_file = tmp_path / "systemctl-fails"
        for tool in ("systemd-run", "systemctl"):
            script = self.bin / tool
            script.write_text(RECORDER.format(python=sys.executable, tool=tool, log=str(self.log),
                                              fail=str(self.fail_file)))
            script.chmod(0o755)

    def pid1(self, comm: str) -> None:
        (self.proc_root / "1" / "comm").write_text(comm + "\n")

    def files(self, mountinfo: str | None = None) -> tuple[str, str]:
        text = SYSTEMD_MOUNTINFO.format(mount=self.mount) if mountinfo is None else mountinfo
        return SYSTEMD_PROC_CGROUP, text

    def fail_systemctl(self, code: int, stderr: str) -> None:
        self.fail_file.write_text(f"{code}\n{stderr}")

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def probe(self, configured: str | None = None, files: tuple[str, str] | None = None) -> Any:
        return SystemdBackend.probe(configured, proc_root=str(self.proc_root), files=files or self.files())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSystemd:
    fs = FakeSystemd(tmp_path)
    monkeypatch.setenv("PATH", f"{fs.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
    return fs


@pytest.fixture
def backend(fake: FakeSystemd) -> SystemdBackend:
    probe, found = fake.probe()
    assert probe.ok, probe.detail
    assert isinstance(found, SystemdBackend)
    return found


# --------------------------------------------------------------------------------------------- probe
def test_probe_ok(fake: FakeSystemd) -> None:
    probe, backend = fake.probe()
    assert probe == (True, f"systemd-run at {fake.bin}/systemd-run")
    assert isinstance(backend, SystemdBackend)
    assert backend.systemd_run == f"{fake.bin}/systemd-run"
    assert backend.systemctl == f"{fake.bin}/systemctl"
    assert backend.slice_unit == "hostrun.slice"
    assert backend.slice_dir == f"{fake.mount}/hostrun.slice"
    assert backend.describe() == f"hostrun.slice ({fake.mount}/hostrun.slice)"
    assert fake.calls() == []  # probing runs nothing


@pytest.mark.parametrize("comm", ["init", "process_api", "systemd-journal"])
def test_probe_fails_when_pid1_is_not_systemd(fake: FakeSystemd, comm: str) -> None:
    fake.pid1(comm)
    assert fake.probe() == ((False, "systemd is not PID 1"), None)


def test_probe_fails_without_a_readable_pid1(fake: FakeSystemd) -> None:
    (fake.proc_root / "1" / "comm").unlink()
    assert fake.probe() == ((False, "systemd is not PID 1"), None)


def test_probe_fails_when_the_tools_are_missing(fake: FakeSystemd, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    only_ctl = tmp_path / "only-systemctl"
    only_ctl.mkdir()
    os.symlink(fake.bin / "systemctl", only_ctl / "systemctl")
    monkeypatch.setenv("PATH", str(only_ctl))  # this machine has real ones in /usr/bin: keep them out
    assert fake.probe() == ((False, "systemd-run or systemctl not on PATH"), None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert fake.probe() == ((False, "systemd-run or systemctl not on PATH"), None)


def test_probe_fails_without_a_cgroup2_mount(fake: FakeSystemd) -> None:
    probe, backend = fake.probe(files=fake.files(V1_MOUNTINFO))
    assert backend is None
    assert probe == (False, "systemd without a unified cgroup2 hierarchy")


def test_probe_fails_in_hybrid_mode(fake: FakeSystemd) -> None:
    """systemd with cgroup2 mounted but memory on v1 (hybrid): our v2 counters would not exist."""
    (fake.mount / "cgroup.controllers").write_text("hugetlb\n")  # what this machine's unified mount has
    probe, backend = fake.probe()
    assert backend is None
    assert not probe.ok
    assert f"memory controller not in the cgroup2 hierarchy at {fake.mount}" in probe.detail


@pytest.mark.parametrize("configured", ["/hostrun", "/a.slice/b.slice", "/user.slice/hostrun",
                                        "/hostrun.scope", "/a--b.slice", "/-.slice", "/hostrun-.slice"])
def test_probe_fails_for_a_cgroup_that_is_not_a_slice_unit(fake: FakeSystemd, configured: str) -> None:
    probe, backend = fake.probe(configured)
    assert backend is None
    assert probe.ok is False
    assert probe.detail == (f"hosts.*.cgroup must name a slice unit (e.g. /hostrun.slice) for systemd, "
                            f"not {configured}")


def test_probe_accepts_a_configured_slice_unit(fake: FakeSystemd) -> None:
    probe, backend = fake.probe("/builds.slice")
    assert probe.ok and isinstance(backend, SystemdBackend)
    assert backend.slice_unit == "builds.slice"
    assert backend.slice_dir == f"{fake.mount}/builds.slice"


def test_a_dashed_slice_unit_lives_inside_its_parent_slice(fake: FakeSystemd) -> None:
    """systemd.slice(5): hostrun-jobs.slice is a child of hostrun.slice in the cgroup tree."""
    assert slice_cgroup_path("hostrun.slice") == "/hostrun.slice"
    assert slice_cgroup_path("a-b-c.slice") == "/a.slice/a-b.slice/a-b-c.slice"
    probe, backend = fake.probe("/hostrun-jobs.slice")
    assert probe.ok and isinstance(backend, SystemdBackend)
    assert backend.slice_dir == f"{fake.mount}/hostrun.slice/hostrun-jobs.slice"
    job = backend.create_job("4-2", GiB)
    assert job.path == f"{fake.mount}/hostrun.slice/hostrun-jobs.slice/hostrun-job-4-2.scope"


# --------------------------------------------------------------------------------------- ensure_slice
def test_ensure_slice_sets_the_slice_properties(fake: FakeSystemd, backend: SystemdBackend) -> None:
    backend.ensure_slice(8 * GiB)
    assert fake.calls() == [{
        "tool": "systemctl",
        "argv": ["set-property", "--runtime", "hostrun.slice", f"MemoryMax={8 * GiB}", "MemorySwapMax=0"],
        "pid": fake.calls()[0]["pid"],
    }]
    assert not (fake.mount / "hostrun.slice").exists()  # systemd makes the cgroup, never we


def test_failing_systemctl_is_a_backend_error_with_its_first_line(fake: FakeSystemd,
                                                                  backend: SystemdBackend) -> None:
    fake.fail_systemctl(1, "Failed to set unit properties on hostrun.slice: Access denied\n"
                           "See system logs and 'systemctl status hostrun.slice' for details.\n")
    with pytest.raises(BackendError) as err:
        backend.ensure_slice(8 * GiB)
    assert str(err.value) == ("cannot set limits on hostrun.slice: "
                              "Failed to set unit properties on hostrun.slice: Access denied")
    assert err.value.exit_code == ExitCode.NOT_RUN
    assert [c["tool"] for c in fake.calls()] == ["systemctl"]


def test_silently_failing_systemctl_reports_its_exit_status(fake: FakeSystemd,
                                                            backend: SystemdBackend) -> None:
    fake.fail_systemctl(3, "")
    with pytest.raises(BackendError, match=r"^cannot set limits on hostrun.slice: exit 3$"):
        backend.ensure_slice(GiB)


# ----------------------------------------------------------------------------------------- create_job
def test_create_job_wraps_the_command_in_a_scope(fake: FakeSystemd, backend: SystemdBackend) -> None:
    job = backend.create_job("12-3456", 512 * MiB)
    assert isinstance(job, Cgroup2Job)
    assert job.cap == 512 * MiB
    assert job.path == f"{fake.mount}/hostrun.slice/hostrun-job-12-3456.scope"
    assert job.wrap_argv(["cargo", "test", "--", "--nocapture"]) == [
        f"{fake.bin}/systemd-run", "--scope", "--quiet", "--collect", "--slice=hostrun.slice",
        "--unit=hostrun-job-12-3456.scope", "-p", f"MemoryMax={512 * MiB}", "-p", "MemorySwapMax=0",
        "--", "cargo", "test", "--", "--nocapture",
    ]
    assert fake.calls() == []  # nothing runs until the job is started
    assert not os.path.exists(job.path)  # systemd makes the scope's cgroup, never we


def test_the_wrapped_command_runs_with_its_argv_intact(fake: FakeSystemd, backend: SystemdBackend) -> None:
    job = backend.create_job("7-1", GiB)
    args = ["two words", 'double "quoted"', "it's", "$HOME", "*", "", "--", "-p"]
    argv = [sys.executable, "-c", "import json, os, sys; print(json.dumps([os.getpid(), sys.argv[1:]]))",
            *args]
    # as the runner does: preexec in the child (a no-op here: systemd-run moves the process itself)
    proc = subprocess.Popen(job.wrap_argv(argv), stdout=subprocess.PIPE, text=True, preexec_fn=job.preexec)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    child_pid, child_args = json.loads(out)
    assert child_args == args
    (call,) = fake.calls()
    assert call["tool"] == "systemd-run"
    assert call["argv"] == job.wrap_argv(argv)[1:]
    # systemd-run --scope execs the command: the pid the runner watches is the job's own
    assert call["pid"] == child_pid == proc.pid
    assert not os.path.exists(job.path)  # preexec wrote nothing into the (not yet existing) scope


def test_a_failing_command_passes_its_status_through(fake: FakeSystemd, backend: SystemdBackend) -> None:
    job = backend.create_job("7-2", GiB)
    done = subprocess.run(job.wrap_argv(["sh", "-c", "exit 7"]), check=False)
    assert done.returncode == 7


def test_verdict_reads_the_scope_and_slice_counters(fake: FakeSystemd, backend: SystemdBackend) -> None:
    """Counters come from the cgroup files systemd would create (written by hand here)."""
    slice_dir = fake.mount / "hostrun.slice"
    slice_dir.mkdir()
    (slice_dir / "memory.events.local").write_text("low 0\nhigh 0\nmax 0\noom 2\noom_kill 0\n")
    job = backend.create_job("8-1", GiB)  # the slice's earlier OOMs (2) are the baseline
    scope = Path(job.path)
    scope.mkdir()
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 0\noom_kill 1\n")
    assert (job.verdict().killed, job.verdict().slice_full) == (True, False)
    (slice_dir / "memory.events.local").write_text("low 0\nhigh 0\nmax 5\noom 3\noom_kill 0\n")
    v = job.verdict()
    assert (v.killed, v.own, v.slice_full) == (True, False, True)
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    v = job.verdict()
    assert (v.killed, v.own, v.slice_full) == (True, True, False)


def test_job_paths_are_the_scope_units_it_creates(fake: FakeSystemd, backend: SystemdBackend) -> None:
    job = backend.create_job("12-345", 64 << 20)
    assert backend.job_path_ok(job.path)
    assert not backend.job_path_ok(f"{backend.slice_dir}/job-12-345")  # not a name this backend gives
    assert not backend.job_path_ok(f"{backend.slice_dir}/../hostrun-job-12-345.scope")
    assert not backend.job_path_ok(f"{backend.slice_dir}/hostrun-job-12.scope")
