"""Pure parsers on recorded outputs, and process identity on real processes.

What is real and what is not: the /proc and cgroup texts below are RECORDED, pasted as strings. The
cgroup v1 ones were read on this machine (cgroup v1 memory controller, an unused cgroup2 mount at
/sys/fs/cgroup/unified, no systemd as PID 1), including memory.oom_control and memory.stat of a v1
cgroup right after a real OOM kill. The systemd / cgroup2-only texts and the v2 memory.events are
WRITTEN to match such machines (none exists here), so those cases check our parsing of the documented
format, not a live kernel. ``procinfo`` is tested on real child processes and the real /proc, and its
start time is compared with ``ps`` and with the clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dispatch.capping.base import parse_flat_keyed
from dispatch.capping.cgroupfs import default_slice_path, parse_mountinfo, parse_proc_cgroup
from dispatch.core.hostfacts import MemInfo, parse_loadavg, parse_meminfo
from dispatch.core.procinfo import cmdline, is_alive, start_time
from dispatch.core.units import format_size, parse_duration, parse_size

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# ---------------------------------------------------------------------------------- recorded here
HERE_PROC_CGROUP = """\
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
HERE_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334460k,nr_inodes=3083615,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# memory.stat of this test runner's own v1 memory cgroup (abridged: first and total_* lines).
HERE_V1_MEMORY_STAT = """\
cache 741376
rss 1679360
rss_huge 0
shmem 0
mapped_file 24576
dirty 45056
writeback 0
workingset_refault_anon 0
workingset_refault_file 274
swap 0
swapcached 0
pgpgin 15735
pgpgout 15143
pgfault 35422
pgmajfault 22
inactive_anon 1597440
active_anon 12288
inactive_file 139264
active_file 602112
unevictable 0
hierarchical_memory_limit 9223372036854771712
hierarchical_memsw_limit 9223372036854771712
total_cache 741376
total_rss 1679360
total_rss_huge 0
total_shmem 0
total_mapped_file 24576
"""
# A v1 cgroup (memory and memsw limit 32 MiB) right after `python3 -c 'x = bytearray(200<<20)'`
# was OOM-killed in it; its memory.failcnt read 0 and memory.max_usage_in_bytes 33554432.
HERE_V1_OOM_CONTROL_AFTER_KILL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
HERE_V1_OOM_CONTROL_FRESH = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
HERE_MEMINFO = """\
MemTotal:       24684084 kB
MemFree:        23892876 kB
MemAvailable:   24198912 kB
Buffers:           13208 kB
Cached:           478876 kB
SwapCached:            0 kB
Active:           211440 kB
Inactive:         325340 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Shmem:              8872 kB
VmallocTotal:   34359738367 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
DirectMap1G:    25165824 kB
"""
HERE_LOADAVG = "3.68 2.37 1.01 1/96 20549\n"

# --------------------------------------------------- written to match a systemd cgroup2-only machine
SYSTEMD_PROC_CGROUP = "0::/user.slice/user-1000.slice/session-2.scope\n"
SYSTEMD_MOUNTINFO = (
    "22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "23 28 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "24 28 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev "
    "rw,size=16310472k,nr_inodes=4077618,mode=755\n"
    "28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
    "31 22 0:6 / /sys/kernel/security rw,nosuid,nodev,noexec,relatime shared:8 - securityfs securityfs rw\n"
    "52 28 0:47 / /run/user/1000 rw,nosuid,nodev,relatime shared:273 - tmpfs tmpfs "
    "rw,size=3264780k,mode=700,uid=1000\n"
)
V2_MEMORY_EVENTS_OWN_OOM = "low 0\nhigh 0\nmax 214\noom 1\noom_kill 1\noom_group_kill 0\n"
V2_MEMORY_STAT = """\
anon 314572800
file 943718400
kernel 3145728
kernel_stack 16384
shmem 20971520
file_mapped 0
inactive_anon 335544320
active_anon 0
inactive_file 922746880
active_file 0
"""


# ------------------------------------------------------------------------------- /proc/self/cgroup
def test_parse_proc_cgroup_v1_here() -> None:
    parsed = parse_proc_cgroup(HERE_PROC_CGROUP)
    assert parsed["memory"] == "/process_api/44d0081f2b2dae8266e3b3cfd1c7498a"
    assert parsed["name=systemd"] == "/"
    assert parsed[""] == "/"  # the (unused) unified line
    assert set(parsed) == {"name=systemd", "pids", "blkio", "freezer", "devices", "memory", "cpuset",
                           "cpuacct", "cpu", ""}


def test_parse_proc_cgroup_systemd_v2_only() -> None:
    assert parse_proc_cgroup(SYSTEMD_PROC_CGROUP) == {"": "/user.slice/user-1000.slice/session-2.scope"}


def test_parse_proc_cgroup_comounted_controllers_colons_and_junk() -> None:
    text = "4:cpu,cpuacct:/docker/abc\n3:memory:/odd:name\n\ngarbage\n"
    assert parse_proc_cgroup(text) == {"cpu": "/docker/abc", "cpuacct": "/docker/abc", "memory": "/odd:name"}


# ---------------------------------------------------------------------------- /proc/self/mountinfo
def test_parse_mountinfo_v1_here() -> None:
    assert parse_mountinfo(HERE_MOUNTINFO) == {"memory": "/sys/fs/cgroup/memory",
                                               "cgroup2": "/sys/fs/cgroup/unified"}


def test_parse_mountinfo_systemd_v2_only() -> None:
    assert parse_mountinfo(SYSTEMD_MOUNTINFO) == {"cgroup2": "/sys/fs/cgroup"}


def test_parse_mountinfo_comounted_memory_and_optional_fields() -> None:
    text = ("40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime shared:6 - cgroup cgroup rw,name=systemd\n"
            "41 31 0:38 / /sys/fs/cgroup/cpu,memory rw,relatime shared:7 master:3 - cgroup cgroup "
            "rw,cpu,memory\n")
    assert parse_mountinfo(text) == {"memory": "/sys/fs/cgroup/cpu,memory"}


def test_parse_mountinfo_unescapes_the_mount_point() -> None:
    """The kernel writes a space in a mount point as \\040 (and tab, newline, backslash likewise)."""
    text = "35 31 0:32 / /mnt/my\\040cgroups\\134v2 rw,relatime - cgroup2 cgroup2 rw\n"
    assert parse_mountinfo(text) == {"cgroup2": "/mnt/my cgroups\\v2"}


@pytest.mark.parametrize("point", [
    "/plain", "/a\\040b", "/\\134\\040", "/x\\0400", "/end\\04", "/end\\", "/\\89x", "/\\\\040",
    "/tab\\011nl\\012", "/\\0", "/\\1234",
])
def test_parse_mountinfo_unescapes_as_the_octal_rule_says(point: str) -> None:
    """The hand-written decoder (no ``re`` on every job's path) agrees with the rule it replaced:
    each backslash followed by three octal digits, left to right, is one character."""
    import re

    expected = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
    assert parse_mountinfo(f"35 31 0:32 / {point} rw - cgroup2 cgroup2 rw\n") == {"cgroup2": expected}


def test_parse_mountinfo_first_mount_wins() -> None:
    text = HERE_MOUNTINFO + "99 31 0:39 / /elsewhere rw - cgroup cgroup rw,memory\n"
    assert parse_mountinfo(text)["memory"] == "/sys/fs/cgroup/memory"


# ----------------------------------------------------------------------------------- default slice
@pytest.mark.parametrize(("own", "expected"), [
    ("/process_api/44d0081f2b2dae8266e3b3cfd1c7498a",
     "/process_api/44d0081f2b2dae8266e3b3cfd1c7498a/hostrun"),
    ("/", "/hostrun"),
    ("/user.slice/user-1000.slice/session-2.scope", "/user.slice/user-1000.slice/session-2.scope/hostrun"),
    ("/a/b/hostrun/job-3-99", "/a/b/hostrun"),  # hostrun started from inside a hostrun job
    ("/a/b/hostrun/job-3-99/nested", "/a/b/hostrun"),
    ("/a/b/hostrun", "/a/b/hostrun"),
    ("/a/b/", "/a/b/hostrun"),
    ("/a/hostrun-test-1f2e", "/a/hostrun-test-1f2e/hostrun"),  # only the exact name counts
])
def test_default_slice_path(own: str, expected: str) -> None:
    assert default_slice_path(own) == expected


# --------------------------------------------------------------------------------- flat keyed files
def test_parse_flat_keyed_v1_memory_stat_here() -> None:
    stat = parse_flat_keyed(HERE_V1_MEMORY_STAT)
    assert stat["total_rss"] == 1679360
    assert stat["total_shmem"] == 0
    assert stat["cache"] == 741376
    assert stat["hierarchical_memory_limit"] == 9223372036854771712
    assert len(stat) == len(HERE_V1_MEMORY_STAT.splitlines())


def test_parse_flat_keyed_v1_oom_control_here() -> None:
    assert parse_flat_keyed(HERE_V1_OOM_CONTROL_AFTER_KILL) == {"oom_kill_disable": 0, "under_oom": 0,
                                                                "oom_kill": 1}
    assert parse_flat_keyed(HERE_V1_OOM_CONTROL_FRESH)["oom_kill"] == 0


def test_parse_flat_keyed_v2_memory_events_and_stat() -> None:
    assert parse_flat_keyed(V2_MEMORY_EVENTS_OWN_OOM) == {"low": 0, "high": 0, "max": 214, "oom": 1,
                                                          "oom_kill": 1, "oom_group_kill": 0}
    stat = parse_flat_keyed(V2_MEMORY_STAT)
    assert stat["anon"] + stat["shmem"] == 320 * MiB


def test_parse_flat_keyed_skips_what_is_not_key_value() -> None:
    text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nname notanumber\n\n  oom   3  \nmax\n"
    assert parse_flat_keyed(text) == {"oom": 3}


# ------------------------------------------------------------------------------------- host facts
def test_parse_meminfo_here() -> None:
    assert parse_meminfo(HERE_MEMINFO) == MemInfo(total=24684084 * KiB, available=24198912 * KiB)


def test_parse_meminfo_without_memavailable_uses_memfree() -> None:
    old = "MemTotal:        2048000 kB\nMemFree:          512000 kB\nBuffers:           1000 kB\n"
    assert parse_meminfo(old) == MemInfo(total=2048000 * KiB, available=512000 * KiB)


def test_parse_loadavg_here() -> None:
    assert parse_loadavg(HERE_LOADAVG) == (3.68, 2.37, 1.01)


# -------------------------------------------------------------------------------------------- units
@pytest.mark.parametrize(("text", "expected"), [
    ("512M", 512 * MiB), ("8G", 8 * GiB), ("1.5GiB", 3 * GiB // 2), ("1024", 1024), (1024, 1024),
    ("2GB", 2 * GiB), ("64k", 64 * KiB), ("1T", TiB), (" 8 g ", 8 * GiB), ("0", 0), ("300MiB", 300 * MiB),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-1", "8X", "1.5.2G", "G", "8 GiBs", "1e3", True, -5])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", 30.0), ("2h", 7200.0), ("1.5m", 90.0), ("250ms", 0.25), ("10min", 600.0), ("1d", 86400.0),
    ("45", 45.0), (12, 12.0), (2.5, 2.5),
])
def test_parse_duration(text: str | float, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "soon", "-3s", "5y", "1h30m", True, -1])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "expected"), [
    (512 * MiB, "512 MiB"), (5 * GiB, "5.0 GiB"), (3 * GiB // 2, "1.5 GiB"), (2 * TiB, "2.0 TiB"),
    (1023, "1023 B"),
    (0, "0 B"), (64 * KiB, "64 KiB"), (-GiB, "-1.0 GiB"), (None, "-"),
])
def test_format_size(n: int | None, expected: str) -> None:
    assert format_size(n) == expected


def test_format_size_round_trips_through_parse_size() -> None:
    for n in (512 * MiB, 8 * GiB, 3 * GiB // 2, 64 * KiB):
        assert parse_size(format_size(n)) == n


# ------------------------------------------------------------------------- procinfo (real /proc)
TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> int:
    with open("/proc/stat", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("btime "))


def _ps_lstart(pid: int) -> float:
    out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                         check=True, env={**os.environ, "LC_ALL": "C"}).stdout.strip()
    return time.mktime(time.strptime(out, "%a %b %d %H:%M:%S %Y"))


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()[0]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:  # only the children this test started
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()


# Sets its own comm to one with spaces and parentheses, says so, then waits.
ODD_COMM = "a) (b) c) d"
ODD_CHILD = f"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(15, {ODD_COMM.encode()!r}, 0, 0, 0) != 0:  # PR_SET_NAME
    sys.exit("prctl failed")
print("ready", flush=True)
time.sleep(60)
"""


def test_start_time_of_a_real_child(children: list[subprocess.Popen[str]]) -> None:
    before = time.time()
    proc = subprocess.Popen(["sleep", "60"], text=True)
    children.append(proc)
    after = time.time()
    started = start_time(proc.pid)
    assert started is not None
    assert start_time(proc.pid) == started  # stable
    wall = _boot_time() + started / TICKS
    assert before - 1 <= wall <= after + 1
    assert abs(_ps_lstart(proc.pid) - wall) <= 1.0


def test_start_time_with_spaces_and_parentheses_in_comm(children: list[subprocess.Popen[str]]) -> None:
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", ODD_CHILD], stdout=subprocess.PIPE, text=True)
    children.append(proc)
    after = time.time()
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    with open(f"/proc/{proc.pid}/comm", encoding="ascii") as fh:
        assert fh.read() == ODD_COMM + "\n"
    with open(f"/proc/{proc.pid}/stat", "rb") as fh:
        raw = fh.read()
    assert f"({ODD_COMM})".encode() in raw
    started = start_time(proc.pid)
    assert started is not None
    # the hazard is real: naive whitespace splitting reads a different field
    assert int(raw.split()[21]) != started
    # independent readings: the clock around the spawn, and ps's own start time
    wall = _boot_time() + started / TICKS
    assert before - 1 <= wall <= after + 1
    assert abs(_ps_lstart(proc.pid) - wall) <= 1.0
    assert is_alive(proc.pid, started)
    assert "import ctypes" in cmdline(proc.pid)


def test_is_alive(children: list[subprocess.Popen[str]]) -> None:
    proc = subprocess.Popen(["sleep", "60"], text=True)
    children.append(proc)
    started = start_time(proc.pid)
    assert started is not None
    assert is_alive(proc.pid, started)
    assert not is_alive(proc.pid, started + 1)  # same pid, another process (pid reuse)
    assert not is_alive(proc.pid, started - 1)
    assert not is_alive(0, started)
    assert not is_alive(-1, started)
    me = start_time(os.getpid())
    assert me is not None and is_alive(os.getpid(), me)

    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _state(proc.pid) != b"Z":  # killed but not yet reaped: a zombie is not alive
        assert time.monotonic() < deadline, "child did not become a zombie"
        time.sleep(0.01)
    assert start_time(proc.pid) == started
    assert not is_alive(proc.pid, started)
    proc.wait()
    assert start_time(proc.pid) is None
    assert not is_alive(proc.pid, started)
