"""A cluster reached through a login node over SSH: a real sshd (tests/support/sshd.py, root on 127.0.0.x with
a home of its own) whose Slurm client commands talk to the private cluster (tests/support/slurmcluster.py).
The tree is rsynced to the login node's work root, srun runs there, the job's argv travels as bytes
on the session's stdin (never through the login shell), and ``--return`` brings files back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.guards.workdirs import owner_path, read_owner
from tests.support.slurmcluster import SlurmCluster

pytestmark = pytest.mark.system
TOP = "enable_across_machines = true"


def login_cluster(hostrun: Any, peers: Any, slurm: SlurmCluster, extra: str = "") -> Any:
    peer = peers("login1", "127.0.0.2")
    hostrun.configure(top=TOP, peers=(f'[hosts.farm]\nkind = "slurm"\nssh = "login1"\n'
                                      f'ssh_config = "{peer.ssh_config}"\nslurm_conf = "{slurm.conf}"\n'
                                      f"{extra}\n"))
    return peer


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "sub").mkdir(parents=True)
    (root / "data.txt").write_text("from the controller\n")
    return root


def test_the_tree_is_synced_and_the_job_runs_in_it(hostrun: Any, peers: Any, slurm: SlurmCluster,
                                                     tmp_path: Path) -> None:
    peer = login_cluster(hostrun, peers, slurm)
    src = tree(tmp_path)
    odd = ["a b", "$(touch x)", "'\";|&", "\udcff"]
    script = ("import os, sys; print(open('../data.txt').read().strip()); print(os.getcwd()); "
              "print(repr([os.fsencode(a) for a in sys.argv[1:]])); open('out.txt', 'w').write('made')")
    done = hostrun.run("--peer=farm", "--tree", str(src), "--return", "out.txt", "-l", "lg",
                       "--session", "lg-session", "--",
                       "python3", "-c", script, *odd, cwd=src / "sub", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "from the controller"
    assert lines[1].startswith(str(peer.home / "hostrun-work")) and lines[1].endswith("/sub")
    assert lines[2] == repr([os.fsencode(a) for a in odd])
    assert not (peer.home / "x").exists() and not Path(lines[1], "x").exists()
    assert (src / "sub" / "out.txt").read_text() == "made"  # --return
    history = json.loads(hostrun.run("history", "--json").stdout)
    assert [(r["host"], r["label"], r["exit_code"]) for r in history] == [("farm", "lg", 0)]
    assert history[0]["peak_bytes"] > 0
    # The work directory there is claimed for the session, as a peer's agent claims its copy, so
    # 'hostrun workdir list|clean' on the login node knows whose it is.
    owner = read_owner(str(Path(lines[1]).parent))
    assert owner is not None and owner.session == "lg-session" and str(src) in owner.purpose
    assert Path(owner_path(str(Path(lines[1]).parent))).stat().st_mode & 0o777 == 0o644


def test_codes_and_stdin_through_the_login_node(hostrun: Any, peers: Any, slurm: SlurmCluster,
                                                tmp_path: Path) -> None:
    login_cluster(hostrun, peers, slurm)
    src = tree(tmp_path)
    oom = hostrun.run("--peer=farm", "--tree", str(src), "-m", "64M", "--", "python3", "-c",
                      "x = bytearray(300 << 20)", cwd=src, stdin=subprocess.DEVNULL)
    assert oom.returncode == ExitCode.OWN_CAP, oom.stderr
    never = hostrun.run("--peer=farm", "--tree", str(src), "-m", "100T", "--", "true", cwd=src,
                        stdin=subprocess.DEVNULL)
    assert never.returncode == ExitCode.NEVER_FITS, never.stderr
    piped = hostrun.run("--peer=farm", "--tree", str(src), "--stdin", "--", "sh", "-c", "cat; exit 4",
                        cwd=src, input="through ssh\n")
    assert (piped.returncode, piped.stdout) == (4, "through ssh\n"), piped.stderr


def test_ctrl_c_cancels_the_job_on_the_cluster(hostrun: Any, peers: Any, slurm: SlurmCluster,
                                               tmp_path: Path) -> None:
    login_cluster(hostrun, peers, slurm)
    src = tree(tmp_path)
    proc = hostrun.popen("--peer=farm", "--tree", str(src), "-l", "far", "--", "sleep", "300", cwd=src,
                         stdin=subprocess.DEVNULL)
    try:
        slurm.wait_for("far")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    # ended by the SIGINT handed to its task (FAILED) or by the cancel after it (CANCELLED)
    [state] = slurm.run(["squeue", "-h", "-t", "all", "-n", "far", "-o", "%T"]).stdout.split()
    assert state in ("FAILED", "CANCELLED")


def test_a_killed_client_leaves_nothing_running_on_the_cluster(hostrun: Any, peers: Any,
                                                                 slurm: SlurmCluster, tmp_path: Path) -> None:
    """hostrun SIGKILLed: its guardian kills the ssh session and cancels the job through the login
    node (found by its token), so the job does not run on alone."""
    login_cluster(hostrun, peers, slurm)
    src = tree(tmp_path)
    proc = hostrun.popen("--peer=farm", "--tree", str(src), "-l", "gone", "--", "sleep", "300", cwd=src,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    slurm.wait_for("gone")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while slurm.run(["squeue", "-h", "-n", "gone", "-o", "%T"]).stdout.strip():  # running/completing
        assert time.monotonic() < deadline, slurm.run(["squeue", "-h", "-n", "gone", "-o", "%T"]).stdout
        time.sleep(0.1)
    [state] = slurm.run(["squeue", "-h", "-t", "all", "-n", "gone", "-o", "%T"]).stdout.split()
    assert state in ("CANCELLED", "FAILED")


def test_the_report_is_read_through_the_login_node(hostrun: Any, peers: Any, slurm: SlurmCluster) -> None:
    login_cluster(hostrun, peers, slurm)
    done = hostrun.run("report", "--json", "--host", "farm")
    assert done.returncode == 0, done.stderr
    [farm] = json.loads(done.stdout)["hosts"]
    assert farm["ok"], farm["error"]
    report = farm["report"]
    assert report["kind"] == "slurm" and [n["name"] for n in report["nodes"]] == [slurm.node]
    assert report["totals"]["nodes_up"] == 1


def test_a_connection_lost_mid_run_is_251_and_the_job_is_cancelled(
        hostrun: Any, peers: Any, slurm: SlurmCluster, tmp_path: Path) -> None:
    """The login node's sshd sessions die under a running job (its listener stays): srun's session
    ends with ssh's 255, hostrun says 251 and cancels the job over a new connection."""
    peer = login_cluster(hostrun, peers, slurm)
    src = tree(tmp_path)
    proc = hostrun.popen("--peer=farm", "--tree", str(src), "-l", "cut", "--", "sleep", "300", cwd=src,
                         stdin=subprocess.DEVNULL)
    try:
        slurm.wait_for("cut")
        for pid in peer.pids()[1:]:  # every connection's sshd, not the listener
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == ExitCode.CONNECTION_LOST, err
    assert "login node broke during the run" in err
    deadline = time.monotonic() + 30
    while slurm.run(["squeue", "-h", "-n", "cut", "-o", "%T"]).stdout.strip():
        assert time.monotonic() < deadline, slurm.run(["squeue", "-h", "-n", "cut", "-o", "%T"]).stdout
        time.sleep(0.1)


def test_a_slurm_conf_the_login_node_lacks_is_refused_before_the_sync(hostrun: Any, peers: Any,
                                                                       slurm: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """Was: the tree synced, srun retried the missing file for 60 s, exit 1. Now: 2 at once, named,
    nothing synced."""
    peer = peers("login1", "127.0.0.2")
    missing = tmp_path / "no-such-slurm.conf"
    hostrun.configure(top=TOP, peers=(f'[hosts.farm]\nkind = "slurm"\nssh = "login1"\n'
                                      f'ssh_config = "{peer.ssh_config}"\nslurm_conf = "{missing}"\n'))
    src = tree(tmp_path)
    done = hostrun.run("--peer=farm", "--tree", str(src), "--", "true", cwd=src, stdin=subprocess.DEVNULL,
                       timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"hosts.farm.slurm_conf: {missing}: no such file on the login node; nothing ran" in done.stderr
    assert not (peer.home / "hostrun-work").exists()
