"""Shared fixtures: real cgroup v1 slices under this test process's own memory cgroup.

Every test that runs jobs gets its own config, state directory and slice cgroup (a child of the memory
cgroup this process is in, read from /proc/self/cgroup). Teardown is a leak check in the mitogen
style: it fails the test if a job cgroup, a process in the slice or a booking is left behind, then
cleans up anyway.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ON_CI = os.environ.get("CI") == "true"


def _memory_cgroup() -> tuple[str, str] | None:
    """(mount point of the v1 memory controller, this process's path in it), or None."""
    mount = None
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            rf = right.split()
            if len(rf) >= 3 and rf[0] == "cgroup" and "memory" in rf[2].split(","):
                mount = left.split()[4]
    own = None
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, ctl, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctl.split(","):
                own = path
    if mount is None or own is None:
        return None
    return mount, own


def require_real_cgroups() -> tuple[str, str]:
    """Skip where cgroup v1 + root are missing; on CI (CI=true) that is a failure, never a skip."""
    found = _memory_cgroup()
    problem = None
    if os.geteuid() != 0:
        problem = "these tests need root (they create real memory cgroups)"
    elif found is None:
        problem = "no cgroup v1 memory controller mounted"
    elif not os.access(found[0] + found[1], os.W_OK):
        problem = f"cannot create cgroups under {found[0] + found[1]}"
    if problem:
        if ON_CI:
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)  # only off CI: with CI=true the line above fails instead
    assert found is not None
    return found


# Fixtures that need root, real cgroups, sshd or a second local user: a test using any of them (directly
# or through another fixture) is a "system" test, so `pytest -m "not system"` runs the pure ones alone.
SYSTEM_FIXTURES = frozenset({"hostrun", "peers", "other_user", "other_user_account", "slurm", "vm"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a system fixture ``system`` (the fixture closure is transitive), and
    every test that boots the VM ``vm`` as well."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if SYSTEM_FIXTURES & names:
            item.add_marker(pytest.mark.system)
        if "vm" in names:
            item.add_marker(pytest.mark.vm)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """With VM tests selected: run them last, and build (or find) the image and boot the VM in the
    background now, while the rest of the suite runs (an emulated boot takes ~40 s, a fresh image
    ~2 min). The ``vm`` fixture waits for it."""
    items = session.items
    vm_items = [item for item in items if "vm" in getattr(item, "fixturenames", ())]
    if not vm_items or session.config.option.collectonly:
        return
    last = [item for item in vm_items if item.get_closest_marker("vm_last") is not None]
    items[:] = ([item for item in items if item not in vm_items]
                + [item for item in vm_items if item not in last] + last)
    from tests.support.vm import missing_tools

    if missing_tools() is None:
        _VM_START.start()


def cgroup_pids(directory: Path) -> list[int]:
    """Every pid in ``directory``'s cgroup tree. Job cgroups vanish while hostrun cleans up, so a
    directory or ``cgroup.procs`` that disappears mid-walk counts as empty (os.walk skips vanished
    directories; pathlib's rglob raises on them)."""
    pids = []
    for parent, _, files in os.walk(directory):
        if "cgroup.procs" in files:
            try:
                pids += [int(p) for p in Path(parent, "cgroup.procs").read_text().split()]
            except OSError as exc:  # removed between the listing and the read
                if exc.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
    return pids


def _kill_tree(directory: Path) -> None:
    for pid in cgroup_pids(directory):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.05)
    for sub in sorted((Path(d) for d, _, _ in os.walk(directory)), key=lambda p: -len(p.parts)):
        try:
            sub.rmdir()
        except OSError:
            pass
    try:
        directory.rmdir()
    except OSError:
        pass


class Hostrun:
    """One isolated hostrun installation: config file, state dir and slice cgroup."""

    def __init__(self, tmp_path: Path, mount: str, own: str) -> None:
        self.tmp = tmp_path
        self.mount = mount
        self.cgroup = f"{own.rstrip('/')}/hostrun-test-{uuid.uuid4().hex[:8]}"
        self.slice_dir = Path(mount + self.cgroup)
        self.state_dir = tmp_path / "state"
        self.config_path = tmp_path / "hosts.toml"
        self.started: list[subprocess.Popen[str]] = []  # their pipes are closed at teardown
        self.configure()

    def configure(self, slice: str = "300M", top: str = "", host: str = "", peers: str = "") -> None:
        self.config_path.write_text(
            f'state_dir = "{self.state_dir}"\n'
            'kill_grace = "2s"\n'
            'status_interval = "1s"\n'
            f"{top}\n"
            "[hosts.local]\n"
            f'slice = "{slice}"\n'
            f'cgroup = "{self.cgroup}"\n'
            f"{host}\n"
            f"{peers}\n"
        )

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dispatch", "--config", str(self.config_path), *args]

    def run(self, *args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
        kw.setdefault("capture_output", True)
        return subprocess.run(self.argv(*args), text=True, timeout=timeout, check=False, **kw)

    def popen(self, *args: str, **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen(self.argv(*args), text=True, **kw)
        self.started.append(proc)
        return proc

    def reap(self) -> None:
        """Every process ``popen`` started ends with the test, even one a failed test left waiting
        (unreaped, the garbage collector warns in whichever test runs next)."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def close_pipes(self) -> None:
        """The pipes of every process ``popen`` started (a test that only ``wait``s leaves them to
        the garbage collector, which warns: warnings are errors here)."""
        for proc in self.started:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def bookings(self) -> list[tuple[Any, ...]]:
        db = self.state_dir / "ledger.sqlite3"
        if not db.exists():
            return []
        con = sqlite3.connect(db, timeout=30)
        try:
            return con.execute("SELECT id, label, state, pid, size, cgroup FROM bookings").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # created, schema not yet written
                return []
            raise
        finally:
            con.close()

    def job_dirs(self) -> list[Path]:
        """The job cgroups in the slice, and the agent sessions' in its sessions slice."""
        if not self.slice_dir.exists():
            return []
        return sorted(self.slice_dir.glob("job-*")) + sorted(self.slice_dir.glob("sessions/session-*"))

    def engine_pids(self) -> list[int]:
        """The admission engines of this state dir."""
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"dispatch.local.engine.admitd" in argv and str(self.state_dir).encode() in argv:
                found.append(int(name))
        return found

    def ledger_closed(self, timeout: float = 15) -> None:
        """Wait until no admission engine of this state dir holds the ledger open. An engine keeps
        it open while it holds bookings and for a grace after the last one (``holdings.GRACE``); a
        test that damages, fills or remounts the state dir as it is between runs (the ledger closed,
        its WAL checkpointed into the file and gone) waits for this first."""
        ledger = str(self.state_dir / "ledger.sqlite3")

        def closed() -> bool:
            for pid in self.engine_pids():
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(ledger):
                            return False
                    except OSError:
                        continue
            return True

        wait_for(closed, timeout=timeout, interval=0.1)

    def slice_pids(self) -> list[int]:
        return cgroup_pids(self.slice_dir)


@pytest.fixture
def hostrun(tmp_path: Path) -> Iterator[Hostrun]:
    mount, own = require_real_cgroups()
    h = Hostrun(tmp_path, mount, own)
    try:
        yield h
        leaks = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            leaks = [f"process {p} in slice" for p in h.slice_pids()]
            leaks += [f"job cgroup {d.name}" for d in h.job_dirs()]
            leaks += [f"booking {b}" for b in h.bookings()]
            if not leaks:
                break
            time.sleep(0.1)
        assert not leaks, f"left behind: {leaks}"
    finally:
        _kill_tree(h.slice_dir)
        h.reap()
        h.close_pipes()


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until predicate() is truthy; returns its value or fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def require_sshd() -> None:
    problem = None
    if not os.path.exists("/usr/sbin/sshd"):
        problem = "openssh-server is not installed (scripts/setup installs it as root)"
    elif os.geteuid() != 0:
        problem = "test peers need root (sshd privilege separation)"
    if problem:
        if ON_CI:
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)  # only off CI: with CI=true the line above fails instead


def _stop_masters(state_dir: Path) -> None:
    """ControlMaster processes outlive the commands (ControlPersist): stop this test's ones."""
    from dispatch.hosts.ssh.transport import control_dir

    # A master renames itself "ssh: DIR/HASH [mux]"; clients carry "ControlPath=DIR/%C".
    directory = control_dir(str(state_dir))
    subprocess.run(["pkill", "-f", f"{directory}/"], check=False)
    if directory.startswith("/tmp/hostrun-ssh-"):  # the short fallback for long state paths
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def peers(hostrun: Hostrun, tmp_path: Path) -> Iterator[Any]:
    """A factory of real sshd peers: ``peers("peer1", "127.0.0.2")``. Each has its own config, state
    dir and slice cgroup; teardown checks that nothing is left running or booked on any of them."""
    from tests.support.sshd import SshdPeer

    made: list[SshdPeer] = []
    mount, own = hostrun.mount, hostrun.cgroup.rsplit("/", 1)[0]

    def make(name: str = "peer1", address: str = "127.0.0.2", slice: str = "300M",
             extra_env: dict[str, str] | None = None, netns: str | None = None) -> SshdPeer:
        require_sshd()
        root = tmp_path / f"peer-{name}"
        root.mkdir()
        peer = SshdPeer(root, name, address, f"{own}/hostrun-test-{name}-{uuid.uuid4().hex[:6]}",
                        slice, extra_env, netns)
        peer.start()
        made.append(peer)
        return peer

    try:
        yield make
    finally:
        _stop_masters(hostrun.state_dir)
        for peer in made:
            peer.stop()
        for peer in made:
            assert not peer.daemon_leftovers(), f"{peer.name}: report daemon left {peer.daemon_leftovers()}"
            slice_dir = Path(mount + peer.cgroup)
            leftovers = cgroup_pids(slice_dir)
            _kill_tree(slice_dir)
            assert not leftovers, f"processes left in {peer.name}'s slice: {leftovers}"


class OtherUser:
    """A real second local account (created with ``useradd``), for trust-model tests: what another
    user on the same machine can do to a root-run hostrun. ``home`` is a private directory it owns,
    outside root's 0700 pytest tree so it can reach it."""

    def __init__(self, name: str, uid: int, gid: int, home: Path) -> None:
        self.name, self.uid, self.gid, self.home = name, uid, gid, home

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user (no shell, no login environment), checked."""
        kw.setdefault("capture_output", True)
        kw.setdefault("env", {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home)})
        kw.setdefault("check", True)
        return subprocess.run(argv, text=True, user=self.uid, group=self.gid, extra_groups=[], **kw)

    def chown(self, path: Path) -> None:
        """Hand ``path`` (and everything below it) to this user, as if they had made it."""
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(root, name), self.uid, self.gid)
        os.lchown(path, self.uid, self.gid)


OTHER_USER = "hostrun-other"


@pytest.fixture(scope="session")
def other_user_account() -> Iterator[tuple[str, int, int]]:
    """The second account, created once per session when missing (and removed again then)."""
    import pwd
    import shutil

    if os.geteuid() != 0 or shutil.which("useradd") is None:
        problem = "a second local user needs root and useradd"
        if ON_CI:
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)  # only off CI: with CI=true the line above fails instead
    created = False
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        OTHER_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(OTHER_USER)
        created = True
    try:
        yield OTHER_USER, entry.pw_uid, entry.pw_gid
    finally:
        if created:
            subprocess.run(["userdel", OTHER_USER], check=False, capture_output=True)


@pytest.fixture
def other_user(other_user_account: tuple[str, int, int]) -> Iterator[OtherUser]:
    """A second local user with a home directory of its own under /tmp, removed afterwards."""
    import shutil
    import tempfile

    name, uid, gid = other_user_account
    home = Path(tempfile.mkdtemp(prefix="hostrun-other-"))
    os.chown(home, uid, gid)
    os.chmod(home, 0o755)
    try:
        yield OtherUser(name, uid, gid, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def slurm() -> Iterator[Any]:
    """A private one-node Slurm cluster (tests/support/slurmcluster.py), started for the test and
    stopped after.

    Its teardown is a leak check: the test fails if a slurmstepd or a job cgroup is left. Where Slurm,
    root or cgroup v1 are missing, or the cluster does not come up, the test is skipped off CI and
    fails on CI.
    """
    import shutil
    import tempfile

    from tests.support.slurmcluster import ClusterError, SlurmCluster, missing_parts

    problem = missing_parts()
    # munged's socket path must stay under the 108-byte limit: a short directory, not tmp_path.
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    cluster = SlurmCluster(root)
    try:
        if problem is None:
            try:
                cluster.start()
            except ClusterError as exc:
                problem = f"the private Slurm cluster did not start: {exc}"
        if problem:
            if ON_CI:
                pytest.fail(f"CI=true but {problem}")
            pytest.skip(problem)  # only off CI: with CI=true the line above fails instead
        yield cluster
    finally:
        leaks = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not leaks, f"left behind by the Slurm cluster: {leaks}"


def _unavailable(problem: str) -> None:
    if ON_CI:
        pytest.fail(f"CI=true but {problem}")
    pytest.skip(problem)  # only off CI: with CI=true the line above fails instead


class _VmStart:
    """The VM's image, boot and hostrun install, done in a thread started at collection."""

    def __init__(self) -> None:
        import threading

        self.thread: threading.Thread | None = None
        self.machine: Any = None
        self.error: BaseException | None = None
        self.workdir: Path | None = None

    def start(self) -> None:
        import tempfile
        import threading

        if self.thread is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="hostrun-vm-"))
            self.thread = threading.Thread(target=self._run, name="vm-start", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        from tests.support.vm import VM, ensure_image, install_hostrun

        assert self.workdir is not None
        try:
            image = ensure_image(self.workdir / "build.log")
            self.machine = VM(image, self.workdir)
            self.machine.boot()
            install_hostrun(self.machine, Path(__file__).resolve().parent.parent)
        except BaseException as exc:
            self.error = exc

    def wait(self) -> Any:
        self.start()
        assert self.thread is not None
        self.thread.join()
        return self.machine


_VM_START = _VmStart()


@pytest.fixture(scope="session")
def vm() -> Iterator[Any]:
    """A real Debian 12 machine (systemd as PID 1, cgroup v2) in qemu, booted once per session with
    hostrun installed (tests/support/vm.py), started in the background at collection. Teardown: qemu gone and
    its overlay removed."""
    import shutil

    from tests.support.vm import VmError, missing_tools

    problem = missing_tools()
    if problem:
        _unavailable(problem)
    machine = _VM_START.wait()
    try:
        if isinstance(_VM_START.error, VmError) and machine is None:
            _unavailable(f"no VM image: {_VM_START.error}")
        if _VM_START.error is not None:
            raise _VM_START.error
        yield machine
    finally:
        if machine is not None:
            qemu = machine.qemu
            machine.destroy()
            assert qemu is None or qemu.poll() is not None, "qemu still running"
            assert not machine.overlay.exists(), "VM overlay left behind"
        if _VM_START.workdir is not None:
            shutil.rmtree(_VM_START.workdir, ignore_errors=True)


@pytest.fixture
def guest(vm: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of hostrun set-ups inside the VM: ``guest("dev")`` (a normal user) or
    ``guest("root")``, each with its own directory, config, state and slice unit. Teardown is a leak
    check: no job scope, no scope keeper, no booking left, for every set-up made."""
    from tests.support.vmguest import Guest

    made: list[Guest] = []

    def make(user: str = "dev", slice: str = "300M", extra: str = "") -> Guest:
        g = Guest(vm, user, f"{request.node.name[:40]}-{len(made)}")
        g.configure(slice=slice, extra=extra)
        made.append(g)
        return g

    try:
        yield make
    finally:
        problems = []
        for g in made:
            if not vm.running:  # powered off by the test: nothing left to check in it
                continue
            problems += [f"{g.user}: {leak}" for leak in g.leaks()]
            g.clean_up()
        assert not problems, f"left behind in the VM: {problems}"


_NOT_RUN_KINDS = (  # (words in a skip reason, what the summary calls it), first match wins
    (("Claude Code client",), "the real Claude Code client (npm)"),
    (("VM", "qemu"), "the test VM"),
    (("Slurm", "slurm", "munge"), "Slurm"),
    (("sshd", "openssh"), "sshd"),
    (("cgroup v1",), "cgroup v1 (the suite's own cgroup tests; the VM tests run hostrun on systemd and v2)"),
    (("root", "useradd", "cgroup"), "root (real cgroups, a second user)"),
)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One last line naming what did not run and why (a normal user's ``./scripts/test`` skips what
    needs root, sshd, Slurm or the VM; on CI nothing may be skipped, see ``_unavailable``)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    examples: dict[str, str] = {}
    for report in skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        kind = next((name for words, name in _NOT_RUN_KINDS if any(w in reason for w in words)), "other")
        counts[kind] = counts.get(kind, 0) + 1
        examples.setdefault(kind, reason)
    parts = [f"{n} need {kind}" + (f" ({examples[kind]})" if kind in ("the test VM", "other") else "")
             for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    terminalreporter.write_line(f"not run here: {len(skipped)} tests: {'; '.join(parts)}", yellow=True)


@pytest.fixture(scope="session")
def wheelhouse(vm: Any) -> Iterator[Path]:
    """hostrun's wheel and the wheels of its dependencies and test tools, built and downloaded here
    and copied to /tmp/hostrun-wheels in the VM (which reaches no index). Yields the local wheel."""
    import shutil
    import tempfile

    from tests.support.vm import VmError, build_wheelhouse

    directory = Path(tempfile.mkdtemp(prefix="hostrun-wheels-"))
    try:
        try:
            wheel = build_wheelhouse(Path(__file__).resolve().parent.parent, directory)
        except VmError as exc:
            _unavailable(str(exc))
            raise
        vm.put("root", directory, "/tmp/hostrun-wheels")
        vm.ssh("root", "chmod -R a+rX /tmp/hostrun-wheels")
        yield wheel
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if vm.running:
            vm.ssh("root", "rm -rf /tmp/hostrun-wheels", check=False)
