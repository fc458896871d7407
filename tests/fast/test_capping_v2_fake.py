"""The cgroup v2 backend (``dispatch.capping.cgroup2``) against a FAKE cgroupfs.

What is real and what is not: these machines have no cgroup v2 memory controller (memory is bound to
the v1 hierarchy; the unified mount has only ``hugetlb``), so nothing here touches a real cgroup v2
memory controller. The backend runs against a directory tree under tmp_path that mimics a cgroup2
mount: the interface files (cgroup.controllers, cgroup.subtree_control, memory.max, memory.swap.max,
memory.current, memory.stat, memory.events, memory.events.local, memory.peak, cgroup.procs,
cgroup.kill) are plain files whose contents the tests write by hand. ``FakeCgroup2`` plays the small part
of the kernel that a plain directory cannot: mkdir fills a new cgroup with its interface files and
rmdir refuses a cgroup that still has processes or children. It does NOT account memory, raise
counters, move processes or apply limits: the tests check our side of the file protocol (what we
write, where, in what order, and how we read the counters back), not the kernel's behaviour.

Real: the processes. ``preexec`` runs in a real forked child, and ``kill_all``/``signal_all`` really
signal real ``sleep`` processes whose pids are listed in the fake cgroup.procs (a helper thread removes
a pid from the file once the process has exited, as the kernel does).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.capping import ORDER, candidates
from dispatch.capping.base import flat_value, parse_flat_keyed
from dispatch.capping.cgroup2 import Cgroup2Backend, Cgroup2Job
from dispatch.capping.cgroupfs import SOCKET_ENV
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import GiB, MiB

ROOT_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"

# Recorded on this (cgroup v1) machine: /proc/self/cgroup, and the cgroup lines of /proc/self/mountinfo.
RECORDED_V1_CGROUP = """\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/44d0081f2b2dae8266e3b3cfd1c7498a
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
RECORDED_V1_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
"""
RECORDED_UNIFIED_LINE = "41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n"
RECORDED_UNIFIED_CONTROLLERS = "hugetlb\n"  # /sys/fs/cgroup/unified/cgroup.controllers here


def events(**counts: int) -> str:
    """memory.events / memory.events.local as a 6.x kernel prints them."""
    fields = {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0, "oom_group_kill": 0}
    fields.update(counts)
    return "".join(f"{k} {v}\n" for k, v in fields.items())


def memory_stat(anon: int = 0, file: int = 0, shmem: int = 0) -> str:
    """A v2 memory.stat (abridged, real key names and order). ``file`` includes shmem, as in v2."""
    rows = [
        ("anon", anon), ("file", file), ("kernel", 3 * MiB), ("kernel_stack", 16384),
        ("pagetables", 65536), ("sec_pagetables", 0), ("percpu", 0), ("sock", 0), ("vmalloc", 0),
        ("shmem", shmem), ("zswap", 0), ("zswapped", 0), ("file_mapped", 0), ("file_dirty", 0),
        ("file_writeback", 0), ("swapcached", 0), ("anon_thp", 0), ("file_thp", 0), ("shmem_thp", 0),
        ("inactive_anon", anon + shmem), ("active_anon", 0), ("inactive_file", file - shmem),
        ("active_file", 0), ("unevictable", 0), ("slab_reclaimable", 0), ("slab_unreclaimable", 0),
        ("slab", 0), ("workingset_refault_anon", 0), ("workingset_refault_file", 0), ("pgfault", 1200),
        ("pgmajfault", 0),
    ]
    return "".join(f"{k} {v}\n" for k, v in rows)


def _escape(path: str) -> str:
    """How the kernel writes a path into mountinfo."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


class FakeCgroup2:
    """A directory standing in for a cgroup2 mount, plus the kernel's mkdir/rmdir behaviour below it."""

    def __init__(self, root: Path, *, kill_file: bool = True, peak_file: bool = True) -> None:
        self.root = root
        self.kill_file = kill_file  # cgroup.kill exists from Linux 5.14
        self.peak_file = peak_file  # memory.peak exists from Linux 5.19
        self.children: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        root.mkdir()
        files = {
            "cgroup.controllers": ROOT_CONTROLLERS + "\n",
            "cgroup.subtree_control": "\n",
            "cgroup.procs": "1\n",  # the root cgroup always holds processes; it is exempt
            "cgroup.max.depth": "max\n",
            "memory.stat": memory_stat(),
            "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        }
        for name, text in files.items():
            (root / name).write_text(text)

    # -- the kernel's part ------------------------------------------------------------------------
    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_mkdir, real_rmdir = os.mkdir, os.rmdir

        def mkdir(path: str | os.PathLike[str], mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            real_mkdir(path, mode, dir_fd=dir_fd)
            if dir_fd is None and self._inside(path):
                self._populate(Path(os.path.abspath(path)))

        def rmdir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> None:
            if dir_fd is None and self._inside(path) and os.path.isdir(path):
                self._kernel_rmdir(Path(os.path.abspath(path)), real_rmdir)
            else:
                real_rmdir(path, dir_fd=dir_fd)

        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "rmdir", rmdir)

    def _inside(self, path: str | os.PathLike[str]) -> bool:
        return os.path.abspath(path).startswith(str(self.root) + os.sep)

    def _populate(self, directory: Path) -> None:
        """What the kernel creates in a new cgroup; memory.* only if the parent enables memory."""
        parent_control = (directory.parent / "cgroup.subtree_control").read_text().split()
        enabled = sorted({t.lstrip("+") for t in parent_control if not t.startswith("-")})
        files = {
            "cgroup.controllers": " ".join(enabled) + "\n",
            "cgroup.subtree_control": "\n",
            "cgroup.procs": "",
            "cgroup.threads": "",
            "cgroup.type": "domain\n",
            "cgroup.events": "populated 0\nfrozen 0\n",
        }
        if self.kill_file:
            files["cgroup.kill"] = ""
        if "memory" in enabled:
            files.update({
                "memory.max": "max\n", "memory.high": "max\n", "memory.low": "0\n", "memory.min": "0\n",
                "memory.swap.max": "max\n", "memory.swap.current": "0\n", "memory.current": "0\n",
                "memory.stat": memory_stat(), "memory.events": events(), "memory.events.local": events(),
                "memory.oom.group": "0\n",
            })
            if self.peak_file:
                files["memory.peak"] = "0\n"
        for name, text in files.items():
            (directory / name).write_text(text)

    @staticmethod
    def _kernel_rmdir(directory: Path, real_rmdir: object) -> None:
        procs = directory / "cgroup.procs"
        busy = (procs.exists() and procs.read_text().split()) or any(p.is_dir() for p in directory.iterdir())
        if busy:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(directory))
        for f in directory.iterdir():
            f.unlink()
        assert callable(real_rmdir)
        real_rmdir(directory)

    def attach(self, directory: Path, proc: subprocess.Popen[bytes]) -> None:
        """List a real process in ``directory``'s cgroup.procs; drop it once it exits (as the kernel does)."""
        procs = directory / "cgroup.procs"
        self.children.append(proc)
        procs.write_text(procs.read_text() + f"{proc.pid}\n")

        def reap() -> None:
            proc.wait()
            with self._lock:  # one reaper at a time; readers see the old or the new file, whole
                left = [p for p in procs.read_text().split() if p != str(proc.pid)]
                tmp = directory / f".procs.{proc.pid}.tmp"
                tmp.write_text("".join(f"{p}\n" for p in left))
                os.replace(tmp, procs)

        threading.Thread(target=reap, daemon=True).start()

    # -- helpers for the tests ---------------------------------------------------------------------
    def path(self, cgroup: str) -> Path:
        return self.root / cgroup.strip("/") if cgroup.strip("/") else self.root

    def make(self, cgroup: str, *, enable_memory: bool = True, procs: str = "") -> Path:
        """Create ``cgroup`` (and its parents) as a kernel would; optionally with processes of its own."""
        d = self.root
        for part in [p for p in cgroup.split("/") if p]:
            if enable_memory:
                (d / "cgroup.subtree_control").write_text("cpu memory pids\n")  # the kernel's form
            d = d / part
            if not d.exists():
                os.mkdir(d)
        if procs:
            (d / "cgroup.procs").write_text(procs)
        return d

    def files(self, own: str) -> tuple[str, str]:
        """(/proc/self/cgroup, /proc/self/mountinfo) of a process in cgroup ``own`` on a v2-only host."""
        v2_mountinfo = (
            "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
            "23 27 0:22 / /sys rw,relatime - sysfs sysfs rw\n"
            "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
            f"35 23 0:30 / {_escape(str(self.root))} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 "
            "cgroup2 rw,nsdelegate,memory_recursiveprot\n"
        )
        return f"0::{own}\n", v2_mountinfo


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCgroup2]:
    fs = FakeCgroup2(tmp_path / "cgroup2")
    fs.install(monkeypatch)
    yield fs
    for proc in fs.children:  # only our own children, by pid
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def backend_for(fs: FakeCgroup2, own: str = "/", configured: str | None = None) -> Cgroup2Backend:
    probe, backend = Cgroup2Backend.probe(configured, files=fs.files(own))
    assert probe.ok, probe.detail
    assert backend is not None
    return backend


def ready(fs: FakeCgroup2, limit: int = 8 * GiB) -> Cgroup2Backend:
    """A backend whose slice /ci/hostrun exists with its limit (parent /ci delegated, no processes)."""
    fs.make("/ci")
    backend = backend_for(fs, own="/ci/runner", configured="/ci/hostrun")
    backend.ensure_slice(limit)
    return backend


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"])


# --------------------------------------------------------------------------------------------- probe
def test_probe_ok_in_a_container_root(fake: FakeCgroup2) -> None:
    """Own cgroup '/', memory in the root's controllers: the default slice is <mount>/hostrun."""
    probe, backend = Cgroup2Backend.probe(None, files=fake.files("/"))
    assert probe == (True, f"cgroup2 at {fake.root}")
    assert backend is not None
    assert backend.mount == str(fake.root)
    assert backend.slice_path == "/hostrun"
    assert backend.slice_dir == f"{fake.root}/hostrun"
    assert backend.describe() == f"{fake.root}/hostrun"


def test_probe_ok_with_configured_slice(fake: FakeCgroup2) -> None:
    fake.make("/ci")
    fake.make("/ci/runner", procs="4242\n")
    probe, backend = Cgroup2Backend.probe("/ci/hostrun", files=fake.files("/ci/runner"))
    assert probe.ok, probe.detail
    assert backend is not None and backend.slice_dir == f"{fake.root}/ci/hostrun"


def test_probe_from_inside_a_job_finds_the_same_slice(fake: FakeCgroup2) -> None:
    fake.make("/ci/hostrun/job-3-99", procs="5000\n")
    backend = backend_for(fake, own="/ci/hostrun/job-3-99")
    assert backend.slice_path == "/ci/hostrun"
    assert backend.slice_dir == f"{fake.root}/ci/hostrun"


def test_probe_fails_when_memory_is_not_in_cgroup_controllers(fake: FakeCgroup2) -> None:
    """This machine's situation (recorded): cgroup2 mounted, but it only has hugetlb."""
    (fake.root / "cgroup.controllers").write_text(RECORDED_UNIFIED_CONTROLLERS)
    mountinfo = RECORDED_V1_MOUNTINFO + RECORDED_UNIFIED_LINE.format(mount=_escape(str(fake.root)))
    probe, backend = Cgroup2Backend.probe(None, files=(RECORDED_V1_CGROUP, mountinfo))
    assert backend is None
    assert probe == (False, f"memory controller not available in cgroup v2 at {fake.root}")


def test_probe_fails_without_a_cgroup2_mount(fake: FakeCgroup2) -> None:
    probe, backend = Cgroup2Backend.probe(None, files=(RECORDED_V1_CGROUP, RECORDED_V1_MOUNTINFO))
    assert backend is None
    assert probe == (False, "no cgroup2 hierarchy mounted")


def test_the_backend_choice_probes_no_v2_backend_where_memory_is_on_v1(
        fake: FakeCgroup2, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine's situation: cgroup2 mounted beside a v1 memory hierarchy, which holds the memory
    controller, so systemd and cgroup2 can never work; with no shared socket, only cgroup1 is probed
    (and imported). The cgroup2 probe agrees on the same files."""
    (fake.root / "cgroup.controllers").write_text(RECORDED_UNIFIED_CONTROLLERS)
    files = (RECORDED_V1_CGROUP,
             RECORDED_V1_MOUNTINFO + RECORDED_UNIFIED_LINE.format(mount=_escape(str(fake.root))))
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "no-such.sock"))
    assert candidates(files) == ("cgroup1",)
    assert candidates((RECORDED_V1_CGROUP, RECORDED_V1_MOUNTINFO)) == ("cgroup1",)
    assert not Cgroup2Backend.probe(None, files=files)[0].ok
    socket = tmp_path / "shared.sock"
    socket.write_text("")
    monkeypatch.setenv(SOCKET_ENV, str(socket))
    assert candidates(files) == ("shared", "cgroup1")  # its probe asks the daemon
    assert candidates((RECORDED_V1_CGROUP, RECORDED_V1_MOUNTINFO)) == ("cgroup1",)


def test_the_backend_choice_probes_every_backend_on_a_v2_host(
        fake: FakeCgroup2, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "no-such.sock"))
    assert candidates(fake.files("/")) == ("systemd", "cgroup2", "cgroup1")
    assert backend_for(fake).name == "cgroup2"  # the probe that was kept succeeds on these files
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path))  # exists
    assert candidates(fake.files("/")) == ORDER
    assert candidates(None) == ORDER  # unreadable: every probe says why


def test_probe_fails_when_the_slice_parent_does_not_exist(fake: FakeCgroup2) -> None:
    probe, backend = Cgroup2Backend.probe("/nowhere/hostrun", files=fake.files("/"))
    assert backend is None
    assert probe == (False, f"no cgroup.controllers in {fake.root}/nowhere")


def test_probe_fails_when_parent_has_processes_and_no_memory_for_children(fake: FakeCgroup2) -> None:
    """v2 'no internal processes': +memory in a non-root cgroup holding processes gets EBUSY, so the
    default slice under the shell's own session cgroup can never work; the probe must say so."""
    session = fake.make("/user.slice/session-2.scope", procs="1234\n1240\n")
    assert "memory" in (session / "cgroup.controllers").read_text().split()
    probe, backend = Cgroup2Backend.probe(None, files=fake.files("/user.slice/session-2.scope"))
    assert backend is None
    assert not probe.ok
    assert f"{session} holds processes" in probe.detail
    assert "hosts.*.cgroup" in probe.detail


def test_probe_memory_missing_in_a_delegated_parent(fake: FakeCgroup2) -> None:
    """/ci exists but the root never enabled memory for its children."""
    fake.make("/ci", enable_memory=False)
    probe, backend = Cgroup2Backend.probe("/ci/hostrun", files=fake.files("/ci"))
    assert backend is None
    assert probe == (False, f"memory controller not available in cgroup v2 at {fake.root}/ci")


# --------------------------------------------------------------------------------------- ensure_slice
def test_ensure_slice_enables_memory_and_sets_limit_and_no_swap(fake: FakeCgroup2) -> None:
    backend = backend_for(fake, own="/")
    backend.ensure_slice(8 * GiB)
    slice_dir = Path(backend.slice_dir)
    assert (fake.root / "cgroup.subtree_control").read_text() == "+memory"
    assert (slice_dir / "cgroup.subtree_control").read_text() == "+memory"
    # the parent enabled memory before the slice was made, so the kernel gave it memory.* files
    assert "memory" in (slice_dir / "cgroup.controllers").read_text().split()
    assert (slice_dir / "memory.max").read_text() == str(8 * GiB)
    assert (slice_dir / "memory.swap.max").read_text() == "0"
    assert (slice_dir / "memory.oom.group").read_text() == "0\n"  # never set on the slice


def test_ensure_slice_leaves_an_already_enabled_parent_alone(fake: FakeCgroup2) -> None:
    (fake.root / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    backend = backend_for(fake, own="/")
    backend.ensure_slice(4 * GiB)
    assert (fake.root / "cgroup.subtree_control").read_text() == "cpu io memory pids\n"


def test_ensure_slice_changes_an_existing_limit(fake: FakeCgroup2) -> None:
    backend = ready(fake, 8 * GiB)
    backend.ensure_slice(6 * GiB)
    assert (Path(backend.slice_dir) / "memory.max").read_text() == str(6 * GiB)
    assert backend.slice_usage().limit == 6 * GiB


def test_ensure_slice_turns_swap_off_when_the_limit_is_already_right(fake: FakeCgroup2) -> None:
    """A slice left with the right memory.max but swap allowed must still get memory.swap.max = 0."""
    backend = ready(fake, 8 * GiB)
    (Path(backend.slice_dir) / "memory.swap.max").write_text("max\n")
    backend.ensure_slice(8 * GiB)
    assert (Path(backend.slice_dir) / "memory.swap.max").read_text() == "0"


def test_ensure_slice_failure_is_a_backend_error(fake: FakeCgroup2) -> None:
    backend = Cgroup2Backend(str(fake.root), "/gone/hostrun")
    with pytest.raises(BackendError) as err:
        backend.ensure_slice(GiB)
    assert f"cannot prepare slice {fake.root}/gone/hostrun" in str(err.value)
    assert err.value.exit_code == ExitCode.NOT_RUN


# ----------------------------------------------------------------------------------------- create_job
def test_create_job_makes_a_capped_child_without_swap(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("7-4242", 512 * MiB)
    assert isinstance(job, Cgroup2Job)
    assert job.path == f"{backend.slice_dir}/job-7-4242"
    assert job.cap == 512 * MiB
    assert (Path(job.path) / "memory.max").read_text() == str(512 * MiB)
    assert (Path(job.path) / "memory.swap.max").read_text() == "0"


def test_create_job_never_removes_an_existing_job_directory(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    first = backend.create_job("7-4242", 512 * MiB)
    with pytest.raises(BackendError, match=r"cannot create job cgroup .*/job-7-4242: File exists"):
        backend.create_job("7-4242", 256 * MiB)
    assert os.path.isdir(first.path)
    assert (Path(first.path) / "memory.max").read_text() == str(512 * MiB)


def test_job_at(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("1-1", 64 * MiB)
    found = backend.job_at(job.path)
    assert found is not None and found.path == job.path
    assert backend.job_at(f"{backend.slice_dir}/job-9-9") is None  # gone
    assert backend.job_at(str(fake.root / "ci")) is None  # not inside the slice
    assert backend.job_at(backend.slice_dir + "-other/job-1-1") is None


def test_a_ledger_path_outside_the_slice_is_never_killed_or_removed(fake: FakeCgroup2) -> None:
    """The reclaim path (``stop_reclaimed``) acts only on this slice's job cgroups. A symbolic link in
    the slice pointing out can only be made here: real cgroupfs refuses symlink() (EPERM), so
    test_cgroup_paths.py covers the other shapes against real cgroup v1."""
    from dispatch.local.admission.rooms import stop_reclaimed
    from dispatch.local.store.ledgerdb import Booking

    backend = ready(fake)
    victim = fake.make("/ci/job-5-5")  # named like a job, next to the slice
    proc = sleeper()
    fake.attach(victim, proc)
    link = Path(backend.slice_dir) / "job-6-6"
    link.symlink_to(victim)
    slice_dir = backend.slice_dir
    shapes = [str(link), f"{slice_dir}/../job-5-5", str(victim), f"{slice_dir}/job-1-1/../../job-5-5",
              f"{slice_dir}/job-5-5/..", "job-5-5", f"{slice_dir}//job-6-6"]
    rows = [Booking(id=i, host="local", label="x", state="running", pid=1, pid_start=1, size=1, cap=1,
                    kind="cap", cgroup=path, command="x", session=None, queued=0.0, since=0.0, reason=None)
            for i, path in enumerate(shapes)]
    for row in rows:
        assert backend.job_at(row.cgroup or "") is None, row.cgroup
        assert not backend.job_path_ok(row.cgroup or ""), row.cgroup
    stop_reclaimed(backend, rows)
    assert proc.poll() is None and victim.is_dir() and link.is_symlink()
    assert str(proc.pid) in (victim / "cgroup.procs").read_text().split()
    # A real job of the slice, named by a path that normalises to it, is still found and stopped.
    job = backend.create_job("7-7", 64 * MiB)
    inside = sleeper()
    fake.attach(Path(job.path), inside)
    found = backend.job_at(f"{slice_dir}/job-1-1/../job-7-7")
    assert found is not None and found.path == job.path
    assert backend.job_path_ok(job.path)
    stop_reclaimed(backend, [rows[0]._replace(cgroup=f"{slice_dir}/./job-7-7", pid=7, pid_start=7)])
    inside.wait(timeout=10)
    assert not os.path.exists(job.path)


# -------------------------------------------------------------------------------------------- verdict
def test_verdict_own_cap(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("1-1", 64 * MiB)
    (Path(job.path) / "memory.events").write_text(events(max=40, oom=1, oom_kill=1))
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (True, True, False)
    assert v.counters == {"oom": 1, "oom_kill": 1, "slice_oom": 0}


def test_verdict_slice_full(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("1-1", 4 * GiB)
    (Path(job.path) / "memory.events").write_text(events(oom_kill=1))
    (Path(backend.slice_dir) / "memory.events.local").write_text(events(max=12, oom=1))
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (True, False, True)
    assert v.counters == {"oom": 0, "oom_kill": 1, "slice_oom": 1}


def test_verdict_slice_oom_before_the_job_does_not_count(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    slice_events = Path(backend.slice_dir) / "memory.events.local"
    slice_events.write_text(events(oom=3, oom_kill=0))  # an earlier job filled the slice
    job = backend.create_job("2-2", 4 * GiB)
    (Path(job.path) / "memory.events").write_text(events(oom_kill=1))
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (True, False, False)
    assert v.counters["slice_oom"] == 0
    slice_events.write_text(events(oom=4))  # ... and now it rises while this job runs
    assert job.oom_evidence().slice_full is True


def test_verdict_not_killed(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("3-3", 64 * MiB)
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (False, False, False)
    assert v.counters == {"oom": 0, "oom_kill": 0, "slice_oom": 0}
    # hitting the limit without a kill (reclaim won) is not an OOM kill either
    (Path(job.path) / "memory.events").write_text(events(max=9, oom=1, oom_kill=0))
    (Path(backend.slice_dir) / "memory.events.local").write_text(events(oom=1))
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (False, False, False)


def test_verdict_uses_the_local_slice_counter_not_the_hierarchical_one(fake: FakeCgroup2) -> None:
    """The slice's memory.events counts its jobs' own-cap OOMs too; only .local says the slice was full."""
    backend = ready(fake)
    job = backend.create_job("4-4", 4 * GiB)
    (Path(backend.slice_dir) / "memory.events").write_text(events(oom=5, oom_kill=5))
    (Path(job.path) / "memory.events").write_text(events(oom_kill=1))
    v = job.oom_evidence()
    assert (v.killed, v.slice_full) == (True, False)


# ---------------------------------------------------------------------------- sample, usage, peak
def test_sample_is_anon_plus_shmem_without_page_cache(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("5-5", GiB)
    (Path(job.path) / "memory.stat").write_text(memory_stat(anon=300 * MiB, file=900 * MiB, shmem=20 * MiB))
    (Path(job.path) / "memory.current").write_text(str(1250 * MiB))
    assert job.sample() == 320 * MiB


def test_samples_read_memory_stat_afresh_through_one_descriptor(fake: FakeCgroup2) -> None:
    """The watch's samples keep memory.stat open (read again from offset 0); ``remove`` closes it."""
    backend = ready(fake)
    job = backend.create_job("5-6", GiB)
    stat_file = Path(job.path) / "memory.stat"
    stat_file.write_text(memory_stat(anon=300 * MiB, shmem=20 * MiB))
    assert job.sample() == 320 * MiB
    fd = job._stat_fd
    assert os.readlink(f"/proc/self/fd/{fd}") == str(stat_file)
    stat_file.write_text(memory_stat(anon=700 * MiB, file=5 * MiB))
    assert job.sample() == 700 * MiB
    assert job._stat_fd == fd
    job.remove()
    assert job._stat_fd == -1 and not os.path.exists(f"/proc/self/fd/{fd}")


def test_flat_value_is_parse_flat_keyed_for_one_key() -> None:
    """What a sample looks up in memory.stat's bytes is what the full parse reads, key for key:
    this machine's own memory.stat (cgroup v1), a v2 one, and the edge cases."""
    texts = [memory_stat(anon=3 * MiB, file=7 * MiB, shmem=1), "anon 5\nanon_thp 9\n", "x 1\nshmem 2",
             "shmem_thp 4\nshmem x\n", "", "total_rss 1 2\ntotal_rss_huge 3\n"]
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own = Path("/sys/fs/cgroup/memory" + path) / "memory.stat"
        if "memory" in controllers.split(",") and own.exists():
            texts.append(own.read_text())
    for text in texts:
        parsed = parse_flat_keyed(text)
        for key in {*parsed, "anon", "shmem", "total_rss", "total_shmem", "total_rss_huge", "x", "nope"}:
            assert flat_value(text.encode(), key) == parsed.get(key, 0), (key, text[:80])


def test_charged_peak(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("5-6", GiB)
    (Path(job.path) / "memory.peak").write_text(f"{GiB}\n")
    assert job.charged_peak() == GiB


def test_charged_peak_is_zero_before_linux_5_19(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = FakeCgroup2(tmp_path / "cg", peak_file=False)
    fs.install(monkeypatch)
    job = ready(fs).create_job("5-7", GiB)
    assert not (Path(job.path) / "memory.peak").exists()
    assert job.charged_peak() == 0


def test_slice_usage(fake: FakeCgroup2) -> None:
    backend = ready(fake, 8 * GiB)
    d = Path(backend.slice_dir)
    (d / "memory.current").write_text(f"{3 * GiB}\n")
    (d / "memory.stat").write_text(memory_stat(anon=GiB, file=GiB + 512 * MiB, shmem=256 * MiB))
    usage = backend.slice_usage()
    assert usage.limit == 8 * GiB
    assert usage.usage == 3 * GiB
    assert usage.held == GiB + 256 * MiB
    assert usage.used == GiB + 256 * MiB  # page cache never counts against room


def test_slice_usage_of_a_missing_slice_is_zero(fake: FakeCgroup2) -> None:
    backend = backend_for(fake, own="/")
    assert backend.slice_usage() == (0, 0, 0)


def test_slice_without_a_limit_reads_as_unlimited(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    (Path(backend.slice_dir) / "memory.max").write_text("max\n")
    assert backend.slice_usage().limit == (1 << 63) - 1


# ------------------------------------------------------------------------------- processes (real)
def test_preexec_moves_the_child_into_the_job(fake: FakeCgroup2) -> None:
    """As the runner does: preexec runs in the forked child, before exec, and writes its own pid."""
    backend = ready(fake)
    job = backend.create_job("6-6", GiB)
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        preexec_fn=job.preexec, capture_output=True, text=True, check=True,
    )
    child_pid = int(out.stdout)
    assert child_pid != os.getpid()
    assert (Path(job.path) / "cgroup.procs").read_text() == str(child_pid)
    assert job.pids() == [child_pid]


def test_kill_all_writes_cgroup_kill_and_kills_the_listed_processes(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("8-8", GiB)
    procs = [sleeper(), sleeper()]
    for p in procs:
        fake.attach(Path(job.path), p)
    assert sorted(job.pids()) == sorted(p.pid for p in procs)
    assert job.kill_all() is True
    assert (Path(job.path) / "cgroup.kill").read_text() == "1"
    for p in procs:  # cgroup.kill in the fake does nothing: these died of our own SIGKILLs
        assert p.wait(timeout=5) == -signal.SIGKILL
    assert job.pids() == []


def test_kill_all_without_cgroup_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels before 5.14 have no cgroup.kill: the processes are still killed, and no file is made."""
    fs = FakeCgroup2(tmp_path / "cg", kill_file=False)
    fs.install(monkeypatch)
    try:
        job = ready(fs).create_job("8-9", GiB)
        proc = sleeper()
        fs.attach(Path(job.path), proc)
        assert job.kill_all() is True
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not (Path(job.path) / "cgroup.kill").exists()
    finally:
        for p in fs.children:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_signal_all_sends_the_signal(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("9-9", GiB)
    proc = sleeper()
    fake.attach(Path(job.path), proc)
    job.signal_all(signal.SIGTERM)
    assert proc.wait(timeout=5) == -signal.SIGTERM


# -------------------------------------------------------------------------------------------- remove
def test_remove_after_the_job_is_gone(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("10-1", GiB)
    proc = sleeper()
    fake.attach(Path(job.path), proc)
    assert job.kill_all()
    job.remove()
    assert not os.path.exists(job.path)
    job.remove()  # already gone: no error
    assert os.path.isdir(backend.slice_dir)


def test_remove_refuses_while_processes_remain(fake: FakeCgroup2) -> None:
    backend = ready(fake)
    job = backend.create_job("10-2", GiB)
    proc = sleeper()
    fake.attach(Path(job.path), proc)
    with pytest.raises(OSError) as err:
        job.remove()  # retries EBUSY for 2 s, then gives up
    assert err.value.errno == errno.EBUSY
    assert os.path.isdir(job.path)
    assert proc.poll() is None  # remove never kills
