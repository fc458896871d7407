"""The VM as the real second machine: this host (cgroup v1, root) is the controller, the VM (its own
kernel, 2 GiB of memory, systemd + cgroup v2) the peer, reached over ssh as root and as a normal user.
Nothing is installed there but Debian's python3 and rsync: the agent ships itself.

Jobs sent there are mostly plain programs (dd, sleep, sh). A python job compares python3 -V of both
machines (3.11.7 here, 3.11.2 there) to the minor version, so it runs; a configured probe that reads
the full version refuses it 247. The power-off test runs last
(``vm_last``): the machine stays off after it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import MiB
from tests.conftest import Hostrun, _stop_masters, wait_for
from tests.support.vmguest import Guest

HOG = ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
TOP = 'enable_across_machines = true\nagent_idle = "0"\nreport_timeout = "30s"\nreport_deadline = "40s"'


class Pair:
    """This host's hostrun (the ``hostrun`` fixture) with the VM user's set-up as its peer ``vm``."""

    def __init__(self, hostrun: Hostrun, peer: Guest, tree: Path) -> None:
        self.hostrun = hostrun
        self.peer = peer
        self.tree = tree

    def configure(self, top: str = "", host: str = "") -> None:
        self.hostrun.configure(top=f"{TOP}\n{top}", peers=self.peer.host_table(extra=host))

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.hostrun.run(*args, cwd=self.tree, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return self.hostrun.popen(*args, cwd=self.tree)


def _pair(user: str, hostrun: Hostrun, guest: Any, tmp_path: Path) -> Iterator[Pair]:
    peer = guest(user, slice="1G")
    peer.as_peer()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("from the tree\n")
    p = Pair(hostrun, peer, tree)
    p.configure()
    try:
        yield p
    finally:
        _stop_masters(hostrun.state_dir)


@pytest.fixture(params=["root", "dev"])
def pair(request: pytest.FixtureRequest, hostrun: Hostrun, guest: Any, tmp_path: Path) -> Iterator[Pair]:
    """The VM as a peer, logged in as root and (a second run) as its normal user."""
    yield from _pair(request.param, hostrun, guest, tmp_path)


@pytest.fixture
def root_pair(hostrun: Hostrun, guest: Any, tmp_path: Path) -> Iterator[Pair]:
    """The VM as a peer, logged in as root: for what one login shows as well as two."""
    yield from _pair("root", hostrun, guest, tmp_path)


def report(pair: Pair) -> dict[str, Any]:
    done = pair.run("report", "--json")
    return {h["host"]: h for h in json.loads(done.stdout)["hosts"]}


def test_report_reads_the_vms_own_memory_and_backend(pair: Pair) -> None:
    hosts = report(pair)
    vm = hosts["vm"]
    assert vm["ok"], vm["error"]
    r = vm["report"]
    assert r["backend"] == "systemd" and r["hostname"] == "hostrun-vm"
    assert 1800 * MiB <= r["memory"]["total"] <= 2048 * MiB  # its own 2 GiB, not this host's 23.5
    assert r["slice"]["limit"] == 1024 * MiB
    assert pair.peer.slice_unit in r["slice_path"]


def test_peer_runs_give_exact_codes_under_the_vms_systemd(pair: Pair) -> None:
    """Output streamed back, the job's status passed through, 250 at its cap, 253 past its runtime,
    in the VM's own scopes (user manager for dev, system manager for root)."""
    ok = pair.run("--peer", "-m", "64M", "--result-file", str(pair.tree.parent / "ok.json"), "--",
                  "sh", "-c", "cat a.txt; echo to-stderr >&2; exit 3")
    assert ok.returncode == 3, ok.stderr
    assert ok.stdout == "from the tree\n" and "to-stderr" in ok.stderr
    result = json.loads((pair.tree.parent / "ok.json").read_text())
    assert result["host"] == "vm" and result["backend"] == "systemd"
    assert f"/{pair.peer.slice_unit}/hostrun-job-" in result["cgroup"]
    codes = [pair.run("--peer", "-m", "20M", "--", *HOG).returncode for _ in range(3)]
    assert codes == [ExitCode.OWN_CAP] * 3
    slow = pair.run("--peer", "--max-runtime", "2s", "--", "sleep", "60")
    assert slow.returncode == ExitCode.MAX_RUNTIME, slow.stderr
    assert pair.peer.leaks() == []


def test_slice_full_on_the_peer_is_254(pair: Pair) -> None:
    """A job run in the VM directly holds 400M of a 600M slice (booked at its cap, adj 0); the job
    sent with --peer is a gamble that takes 300M: the VM's slice overflows, the kernel there kills
    the gamble. (Sizes well inside the VM's 2 GiB: a machine-wide OOM would be a different code.)"""
    g = pair.peer
    g.configure(slice="600M")
    g.as_peer()
    hold = (f"import time; x = bytearray(400 << 20); open('{g.dir}/ready', 'w').close(); "
            "time.sleep(600)")
    holder = subprocess.Popen(
        [*g.vm.ssh_argv(g.user), "--", g.hostrun_cmd("-m", "500M", "--label", "holder", "--", "python3",
                                                     "-c", hold)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: g.sh(f"test -e {g.dir}/ready", check=False).returncode == 0, timeout=120,
                 interval=1)
        victim = pair.run("--peer", "--label", "gamble", "--", "dd", "if=/dev/zero", "of=/dev/null",
                          "bs=300M", "count=1")
        assert victim.returncode == ExitCode.SLICE_FULL, victim.stderr
    finally:
        g.sh("pkill -TERM -f 'label holder'", check=False)
        holder.wait(timeout=60)


def test_a_program_the_peer_lacks_is_compared_only_when_the_job_runs_it(root_pair: Pair) -> None:
    """The VM has no Rust (this host does): a job that runs cat is not refused, cargo is (247)."""
    pair = root_pair
    done = pair.run("--peer", "--", "sh", "-c", "cat a.txt")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the tree\n"
    cargo = pair.run("--peer", "--", "cargo", "build")
    assert cargo.returncode == ExitCode.TOOLCHAIN_MISMATCH
    assert "toolchain: rustc -Vv: found only here" in cargo.stderr


def test_a_python_job_runs_across_a_patch_release_and_the_table_decides_its_probes(
        root_pair: Pair) -> None:
    """pyenv's 3.11.7 here, Debian's 3.11.2 in the VM: before, every ``--peer -- python3 …`` job was
    refused 247 and ``toolchain_programs = { python3 = [...] }`` changed nothing. Now the minor
    versions agree, so it runs; a probe configured for python3 replaces ``python3 -V``, and one that
    prints the full version tells the two machines apart."""
    pair = root_pair
    here = subprocess.run(["python3", "-V"], capture_output=True, text=True, check=True).stdout
    there = pair.peer.sh("python3 -V").stdout
    assert here.split(".")[:2] == there.split(".")[:2] and here != there, (here, there)
    done = pair.run("--peer", "--", "python3", "-c", "print(open('a.txt').read(), end='')")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the tree\n"
    strict = "python3 -c 'import platform; print(platform.python_version())'"
    pair.configure(top=f"[toolchain_programs]\npython3 = [{json.dumps(strict)}]")
    refused = pair.run("--peer", "--", "python3", "-c", "print(1)")
    assert refused.returncode == ExitCode.TOOLCHAIN_MISMATCH, refused.stderr
    assert f"toolchain: {strict}: here " in refused.stderr
    assert "python3 -V" not in refused.stderr


def test_jobs_larger_than_the_vm_are_refused_as_documented(root_pair: Pair) -> None:
    pair = root_pair
    too_big = pair.run("--peer", "-m", "3G", "--", "true")
    assert too_big.returncode == ExitCode.NEVER_FITS, too_big.stderr  # its slice is 1 GiB
    assert "larger than the whole slice (1.0 GiB: hosts.local.slice in " in too_big.stderr
    pair.configure(host='peer_memory_cap = "1536M"')
    capped = pair.run("--peer", "-m", "3G", "--", "true")
    assert capped.returncode == ExitCode.OVER_PEER_CAP, capped.stderr


def test_a_peer_without_a_slice_says_why_in_one_line(root_pair: Pair) -> None:
    """No slice configured anywhere: the default reserve (2 GiB) leaves nothing of the VM's 1.9 GiB.
    That is one line naming RAM, reserve and the key, 78, and ``doctor`` says it for the peer."""
    pair = root_pair
    g = pair.peer
    g.sh("sed -i '/^slice = /d' ~/.config/hostrun/hosts.toml")
    done = pair.run("--peer", "-m", "100M", "--", "true")
    assert done.returncode == ExitCode.NOT_RUN, done.stderr
    assert "the default reserve" in done.stderr  # and the line to add to the peer's own file:
    assert re.search(r'add slice = "\d+M" under \[hosts\.local\] in /\S+/\.config/hostrun/hosts\.toml',
                     done.stderr), done.stderr
    doctor = json.loads(pair.run("doctor", "--json").stdout)
    (vm,) = [p for p in doctor["peers"] if p["host"] == "vm"]
    assert not vm["ok"]
    assert any("the default reserve" in problem for problem in vm["problems"]), vm["problems"]


def test_memory_taken_outside_the_slice_holds_a_peer_job_and_says_so(root_pair: Pair) -> None:
    """1.3 GiB taken in the VM outside hostrun (~0.5 GiB left available): a 700M job there waits (its
    1 GiB slice alone would admit it), naming the machine, and runs once that memory is freed."""
    pair = root_pair
    g = pair.peer
    hold = "import time; x = bytearray(1300 << 20); print('held', flush=True); time.sleep(600)"
    hog = subprocess.Popen([*g.vm.ssh_argv("root"), "--", shlex.join(["python3", "-c", hold])],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
        job = pair.popen("--peer", "-m", "700M", "--", "true")
        try:
            assert job.stderr is not None
            line = job.stderr.readline()
            while "waiting" not in line and line:
                line = job.stderr.readline()
            assert "the machine has" in line and "memory used outside the slice holds it" in line
        finally:
            g.sh("pkill -f 'bytearray.1300'", check=False)  # ssh without a tty: the remote side
            hog.wait(timeout=60)                             # outlives a local kill
        assert job.wait(timeout=120) == 0
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        assert hog.stdout is not None
        hog.stdout.close()
        g.sh("pkill -f 'bytearray.1300'", check=False)


def test_a_frozen_machine_is_251_and_its_job_is_gone_after_it_thaws(root_pair: Pair) -> None:
    pair = root_pair
    g = pair.peer
    job = pair.popen("--peer", "-m", "64M", "--", "sh", "-c", "echo started; exec sleep 300")
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "started"
        g.vm.freeze()
        started = time.monotonic()
        try:
            code = job.wait(timeout=120)
        finally:
            frozen_for = time.monotonic() - started
            g.vm.thaw()
        assert code == ExitCode.CONNECTION_LOST, job.stderr.read() if job.stderr else ""
        assert frozen_for < 60
    finally:
        if job.poll() is None:
            job.kill()
    # The agent there sees its connection gone once the machine runs again, and stops the job.
    wait_for(lambda: g.sh("pgrep -f 'sleep 300'", check=False).returncode == 1, timeout=120, interval=2)
    assert g.leaks() == []


@pytest.mark.vm_last
def test_a_powered_off_machine_is_246(root_pair: Pair, vm: Any) -> None:
    pair = root_pair
    assert pair.run("--peer", "--", "true").returncode == 0
    vm.power_off()
    done = pair.run("--peer", "--", "true")
    assert done.returncode == ExitCode.PEER_UNREACHABLE, done.stderr
    hosts = report(pair)
    assert not hosts["vm"]["ok"] and hosts["local"]["ok"]
