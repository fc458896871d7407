"""The systemd backend (``dispatch.capping.systemd``) and its D-Bus client against FAKES.

What is real and what is not: these machines have no systemd as PID 1 and no cgroup v2 memory
controller, so no real systemd is asked anything here (tests/vm/test_vm_systemd.py does that, in a VM):

- PID 1 is faked with a directory passed as ``proc_root`` (``1/comm`` reads ``systemd`` or ``init``);
- /proc/self/mountinfo is passed in as text (``files=``), pointing the cgroup2 mount at a tmp_path
  directory that holds a hand-written ``cgroup.controllers`` (and the user manager's, for delegation);
- the manager is ``tests.support.fakesystemd.FakeManager``, a thread on a Unix socket that answers the calls
  hostrun makes and records them (it decodes with hostrun's own codec);
- the keeper is a real ``cat`` forked by the real code.

So these tests check which manager is chosen and why not, the exact units and properties asked for,
how answers, errors, signals and silence are handled, and the keeper's behaviour; they do not check
that systemd creates the scope, applies MemoryMax or counts OOMs.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.capping import dbus
from dispatch.capping.systemd import (
    KEEPER_NAME,
    Manager,
    SystemdBackend,
    SystemdJob,
    _spawn_keeper,
    find_manager,
    slice_cgroup_path,
)
from dispatch.core.errors import BackendError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import GiB, MiB
from tests.support.fakesystemd import FakeManager

UID = os.geteuid() or 1000  # a user manager's owner: as root, the socket is handed to uid 1000
USER_ROOT = f"/user.slice/user-{UID}.slice/user@{UID}.service"

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


class FakeSystemd:
    """PID 1, mountinfo, the cgroup2 mount (the user manager's subtree in it) and $XDG_RUNTIME_DIR
    with the user manager's socket, all under tmp_path. The socket is served by a FakeManager."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc_root = tmp_path / "proc"
        (self.proc_root / "1").mkdir(parents=True)
        self.pid1("systemd")
        self.mount = tmp_path / "sys-fs-cgroup"
        self.mount.mkdir()
        (self.mount / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        self.user_root = Path(str(self.mount) + USER_ROOT)
        self.user_root.mkdir(parents=True)
        (self.user_root / "cgroup.controllers").write_text("cpu memory pids\n")
        # A short directory: a Unix socket path must stay under 108 bytes.
        import tempfile

        self.runtime = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))
        (self.runtime / "systemd").mkdir()
        self.manager = FakeManager(str(self.runtime / "systemd" / "private"))
        if os.geteuid() == 0:
            os.lchown(self.manager.path, UID, UID)

    def close(self) -> None:
        import shutil

        self.manager.close()
        shutil.rmtree(self.runtime, ignore_errors=True)

    def pid1(self, comm: str) -> None:
        (self.proc_root / "1" / "comm").write_text(comm + "\n")

    def files(self, mountinfo: str | None = None) -> tuple[str, str]:
        text = SYSTEMD_MOUNTINFO.format(mount=self.mount) if mountinfo is None else mountinfo
        return SYSTEMD_PROC_CGROUP, text

    def probe(self, configured: str | None = None, files: tuple[str, str] | None = None,
              euid: int = UID, environ: dict[str, str] | None = None) -> Any:
        env = {"XDG_RUNTIME_DIR": str(self.runtime)} if environ is None else environ
        return SystemdBackend.probe(configured, proc_root=str(self.proc_root), files=files or self.files(),
                                    euid=euid, environ=env)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSystemd]:
    fs = FakeSystemd(tmp_path)
    try:
        yield fs
    finally:
        fs.close()


@pytest.fixture
def backend(fake: FakeSystemd) -> Iterator[SystemdBackend]:
    probe, found = fake.probe()
    assert probe.ok, probe.detail
    assert isinstance(found, SystemdBackend) and found.manager is not None
    try:
        yield found
    finally:
        found.manager.close()  # as a job's remove() does at the end of a run


# --------------------------------------------------------------------------------------------- probe
def test_probe_finds_the_users_own_manager(fake: FakeSystemd) -> None:
    probe, backend = fake.probe()
    assert probe == (True, f"user manager at {fake.runtime}/systemd/private")
    assert isinstance(backend, SystemdBackend) and backend.manager is not None
    assert backend.manager.user and backend.manager.root_cgroup == USER_ROOT
    assert backend.slice_unit == "hostrun.slice"
    assert backend.slice_dir == f"{fake.mount}{USER_ROOT}/hostrun.slice"
    assert backend.describe() == f"hostrun.slice in the user manager ({backend.slice_dir})"
    assert fake.manager.calls == []  # probing asks the manager nothing


def test_root_talks_to_the_system_manager(tmp_path: Path) -> None:
    manager, where = find_manager(euid=0, environ={})
    if manager is None:  # no systemd here: the reason names the socket
        assert where == "/run/systemd/private missing"
    else:
        assert manager.socket_path == "/run/systemd/private" and manager.root_cgroup == ""
        assert not manager.user


def test_without_a_user_manager_the_probe_says_how_to_get_one(fake: FakeSystemd, tmp_path: Path) -> None:
    probe, backend = fake.probe(environ={"XDG_RUNTIME_DIR": str(tmp_path / "nowhere")})
    assert backend is None and not probe.ok
    assert f"no systemd user manager for uid {UID}" in probe.detail
    assert "loginctl enable-linger" in probe.detail


def test_a_manager_socket_of_someone_else_is_not_used(fake: FakeSystemd) -> None:
    other = UID + 1
    probe, backend = fake.probe(euid=other, environ={"XDG_RUNTIME_DIR": str(fake.runtime)})
    assert backend is None
    assert probe.detail == f"{fake.runtime}/systemd/private belongs to uid {UID}, not {other}"


def test_memory_not_delegated_to_the_user_manager_says_the_fix(fake: FakeSystemd) -> None:
    (fake.user_root / "cgroup.controllers").write_text("cpu pids\n")
    probe, backend = fake.probe()
    assert backend is None
    assert f"the memory controller is not delegated to user@{UID}.service (it has: cpu pids)" in probe.detail
    assert "Delegate=pids memory cpu" in probe.detail


@pytest.mark.parametrize("comm", ["init", "process_api", "systemd-journal"])
def test_probe_fails_when_pid1_is_not_systemd(fake: FakeSystemd, comm: str) -> None:
    fake.pid1(comm)
    assert fake.probe() == ((False, "systemd is not PID 1"), None)


def test_probe_fails_without_a_readable_pid1(fake: FakeSystemd) -> None:
    (fake.proc_root / "1" / "comm").unlink()
    assert fake.probe() == ((False, "systemd is not PID 1"), None)


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


def test_a_dashed_slice_unit_lives_inside_its_parent_slice(fake: FakeSystemd) -> None:
    """systemd.slice(5): hostrun-jobs.slice is a child of hostrun.slice in the cgroup tree."""
    assert slice_cgroup_path("hostrun.slice") == "/hostrun.slice"
    assert slice_cgroup_path("a-b-c.slice") == "/a.slice/a-b.slice/a-b-c.slice"
    probe, backend = fake.probe("/hostrun-jobs.slice")
    assert probe.ok and isinstance(backend, SystemdBackend)
    assert backend.slice_dir == f"{fake.mount}{USER_ROOT}/hostrun.slice/hostrun-jobs.slice"
    job = backend.create_job("4-2", GiB)
    assert job.path == f"{backend.slice_dir}/hostrun-job-4-2.scope"


# ----------------------------------------------------------------------------- the slice and the scope
def test_ensure_slice_sets_its_properties_and_starts_it(fake: FakeSystemd, backend: SystemdBackend) -> None:
    backend.ensure_slice(8 * GiB)
    assert fake.manager.members() == ["Subscribe", "SetUnitProperties", "StartUnit"]
    _, (unit, runtime, props) = fake.manager.calls[1]
    assert (unit, runtime) == ("hostrun.slice", True)
    assert props == [("MemoryMax", ("t", 8 * GiB)), ("MemorySwapMax", ("t", 0))]
    assert fake.manager.calls[2][1] == ["hostrun.slice", "fail"]
    assert not os.path.exists(backend.slice_dir)  # systemd makes the cgroup, never we


def test_a_slice_already_at_its_limit_costs_no_round_trip(fake: FakeSystemd, backend: SystemdBackend) -> None:
    os.makedirs(backend.slice_dir)
    Path(backend.slice_dir, "memory.max").write_text(f"{GiB}\n")
    Path(backend.slice_dir, "memory.swap.max").write_text("0\n")
    backend.ensure_slice(GiB)
    assert fake.manager.calls == []


def test_an_error_reply_is_one_backend_error_naming_the_manager(fake: FakeSystemd,
                                                                backend: SystemdBackend) -> None:
    fake.manager.errors["SetUnitProperties"] = ("org.freedesktop.DBus.Error.AccessDenied",
                                                "Access denied")
    with pytest.raises(BackendError) as err:
        backend.ensure_slice(8 * GiB)
    assert str(err.value) == "cannot set limits on hostrun.slice through the user manager: Access denied"
    assert err.value.exit_code == ExitCode.NOT_RUN


def test_create_job_asks_for_nothing_until_the_process_exists(fake: FakeSystemd,
                                                              backend: SystemdBackend) -> None:
    backend.kill_grace = 2.5
    job = backend.create_job("12-3456", 512 * MiB)
    assert isinstance(job, SystemdJob)
    assert job.path == f"{backend.slice_dir}/hostrun-job-12-3456.scope"
    assert fake.manager.calls == []
    assert not os.path.exists(job.path)  # systemd makes the scope's cgroup, never we
    props = dict(job._properties)
    assert props["Slice"] == ("s", "hostrun.slice")
    assert props["MemoryMax"] == ("t", 512 * MiB) and props["MemorySwapMax"] == ("t", 0)
    assert props["OOMPolicy"] == ("s", "stop")
    assert props["TimeoutStopUSec"] == ("t", 2_500_000)
    assert props["CollectMode"] == ("s", "inactive-or-failed")


def test_a_transient_scope_is_started_with_both_pids_and_waited_for(fake: FakeSystemd,
                                                                    backend: SystemdBackend) -> None:
    manager = backend.manager
    assert manager is not None
    props = [("PIDs", ("au", [11, 22])), ("Slice", ("s", "hostrun.slice"))]
    manager.start("hostrun-job-1-2.scope", props)
    member, (unit, mode, sent, aux) = fake.manager.calls[-1]
    assert (member, unit, mode, aux) == ("StartTransientUnit", "hostrun-job-1-2.scope", "fail", [])
    assert sent == props


def test_the_jobs_end_may_come_before_the_reply(fake: FakeSystemd, backend: SystemdBackend) -> None:
    fake.manager.job_removed_first = True
    assert backend.manager is not None
    backend.manager.start("hostrun-job-1-3.scope", [("PIDs", ("au", [1]))])


def test_a_failed_start_job_is_a_backend_error(fake: FakeSystemd, backend: SystemdBackend) -> None:
    fake.manager.job_result = "failed"
    assert backend.manager is not None
    with pytest.raises(BackendError, match=r"^the user manager could not start hostrun-job-1-4.scope "
                                           r"\(start job: failed\)$"):
        backend.manager.start("hostrun-job-1-4.scope", [("PIDs", ("au", [1]))])


def test_a_silent_manager_is_an_error_after_the_timeout(fake: FakeSystemd) -> None:
    fake.manager.silent.add("Subscribe")
    with pytest.raises(dbus.DBusError, match=r"no answer from .* within 0.3 s"):
        with dbus.Connection(fake.manager.path, timeout=0.3) as conn:
            conn.manager("Subscribe")


def test_a_refused_authentication_is_an_error(fake: FakeSystemd) -> None:
    fake.manager.refuse_auth = True
    with pytest.raises(dbus.DBusError, match=r"refused authentication: REJECTED EXTERNAL"):
        dbus.Connection(fake.manager.path)


def test_no_socket_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(dbus.DBusError, match=r"^cannot talk to .*/none: No such file or directory$"):
        dbus.Connection(str(tmp_path / "none"))


# ------------------------------------------------------------------------------------ the wire format
def test_a_method_call_is_encoded_as_the_specification_lays_it_out() -> None:
    """A hand-checked message (D-Bus specification, "Message Format"): little-endian, method call,
    body length, serial, header fields as a(yv) padded to 8, then the body."""
    data = dbus.encode_message(dbus.METHOD_CALL, 7, {1: "/a", 3: "M"}, "u", (5,))
    assert data[:12] == b"l\x01\x00\x01" + struct.pack("<II", 4, 7)
    # fields: PATH 'o' "/a", MEMBER 's' "M", SIGNATURE 'g' "u"
    fields = (b"\x01\x01o\x00" + struct.pack("<I", 2) + b"/a\x00" + b"\x00" * 5
              + b"\x03\x01s\x00" + struct.pack("<I", 1) + b"M\x00" + b"\x00" * 6
              + b"\x08\x01g\x00\x01u\x00")
    assert data[12:16] == struct.pack("<I", len(fields))
    assert data[16:16 + len(fields)] == fields
    body_at = 16 + len(fields) + (-(16 + len(fields)) % 8)
    assert data[body_at:] == struct.pack("<I", 5)
    assert dbus.message_size(data[:16]) == len(data)


@pytest.mark.parametrize(("signature", "body"), [
    ("ssa(sv)a(sa(sv))", ("u.scope", "fail", [("PIDs", ("au", [1, 2])), ("MemoryMax", ("t", 1 << 40)),
                                               ("OOMPolicy", ("s", "stop")), ("X", ("b", True))], [])),
    ("uoss", (3, "/org/freedesktop/systemd1/job/3", "x.scope", "done")),
    ("sa{sv}as", ("i", [("A", ("s", "active")), ("B", ("t", 9))], ["c", "d"])),
    ("sba(sv)", ("hostrun.slice", True, [("MemorySwapMax", ("t", 0))])),
    ("ayxdn", ([1, 2, 3], -5, 2.5, -2)),
])
def test_messages_round_trip(signature: str, body: tuple[object, ...]) -> None:
    data = dbus.encode_message(dbus.METHOD_RETURN, 9, {5: 3}, signature, body)
    msg = dbus.decode_message(data)
    assert (msg.kind, msg.serial, msg.reply_to) == (dbus.METHOD_RETURN, 9, 3)
    assert [tuple(v) if isinstance(v, tuple) else v for v in msg.body] == list(body)


def test_split_signature() -> None:
    assert dbus.split_signature("sa(sv)u") == ["s", "a(sv)", "u"]
    assert dbus.split_signature("a{sv}a(sa(sv))") == ["a{sv}", "a(sa(sv))"]
    with pytest.raises(ValueError):
        dbus.split_signature("a(sv")


# --------------------------------------------------------------------------------------------- keeper
def test_the_keeper_ignores_stop_signals_and_leaves_when_the_pipe_closes() -> None:
    """The scope's keeper: ``cat`` on a pipe only hostrun writes to, in its own session, deaf to the
    signals systemd's stop (OOMPolicy=stop) and a terminal send; gone once the pipe closes."""
    pid, fd = _spawn_keeper("/bin/cat")
    try:
        time.sleep(0.2)
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert fh.read().split(b"\0")[0] == KEEPER_NAME.encode()
        assert os.getsid(pid) == pid
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            os.kill(pid, sig)
        time.sleep(0.2)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still there
        # (as root it also asks for oom_score_adj -1000; the VM tests see that, a container may not)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_scope_copy_without_a_keeper_kills_and_reads_the_cgroup_files(tmp_path: Path) -> None:
    """A guardian's or a reclaimer's copy of a job (``job_at``) has no keeper: its verdict reads the
    scope's files, and ``remove`` leaves the cgroup to systemd."""
    slice_dir = tmp_path / "hostrun.slice"
    scope = slice_dir / "hostrun-job-8-1.scope"
    scope.mkdir(parents=True)
    (slice_dir / "memory.events.local").write_text("low 0\nhigh 0\nmax 0\noom 2\noom_kill 0\n")
    job = SystemdJob(str(scope), 0, str(slice_dir))
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    v = job.oom_evidence()
    assert (v.killed, v.own, v.slice_full) == (True, True, False)
    job.remove()
    assert scope.exists()


def test_the_counters_seen_last_stand_when_the_scope_is_gone(tmp_path: Path) -> None:
    """systemd may stop the scope after an OOM kill (TimeoutStopSec) before hostrun reads it: the
    counters remembered at the last sample decide."""
    slice_dir = tmp_path / "hostrun.slice"
    scope = slice_dir / "hostrun-job-8-2.scope"
    scope.mkdir(parents=True)
    (slice_dir / "memory.events.local").write_text("oom 0\n")
    job = SystemdJob(str(scope), 64 * MiB, str(slice_dir))
    (scope / "memory.events").write_text("oom 1\noom_kill 1\n")
    (scope / "memory.peak").write_text(f"{64 * MiB}\n")
    (scope / "memory.stat").write_text("anon 1000\n")
    job.sample()
    for name in ("memory.events", "memory.peak", "memory.stat"):
        (scope / name).unlink()
    scope.rmdir()
    v = job.oom_evidence()
    assert (v.killed, v.own) == (True, True)
    assert job.charged_peak() == 64 * MiB


def test_job_paths_are_the_scope_units_it_creates(backend: SystemdBackend) -> None:
    job = backend.create_job("12-345", 64 << 20)
    assert backend.job_path_ok(job.path)
    assert not backend.job_path_ok(f"{backend.slice_dir}/job-12-345")  # not a name this backend gives
    assert not backend.job_path_ok(f"{backend.slice_dir}/../hostrun-job-12-345.scope")
    assert not backend.job_path_ok(f"{backend.slice_dir}/hostrun-job-12.scope")


def test_manager_label() -> None:
    assert Manager("/x", "", user=False).label == "the system manager"
    assert Manager("/x", "/u", user=True).label == "the user manager"
