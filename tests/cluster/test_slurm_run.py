"""``hostrun --peer=CLUSTER -- CMD`` against a real private Slurm cluster (tests/support/slurmcluster.py):
exit codes, streams, --mem from the recorded peak, Ctrl-C, a killed client, odd bytes.

The cluster's jobs run here (one node, this machine), so the "shared filesystem" is this one. Each
test's fixture teardown fails the test if a step process or a job cgroup is left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import MiB
from dispatch.hosts.slurm import facts as sf
from tests.support.slurmcluster import SlurmCluster

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, cluster: SlurmCluster, extra: str = "") -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(f"enable_across_machines = true\nstate_dir = '{tmp_path / 'state'}'\nkill_grace = '2s'\n"
                    f"[hosts.farm]\nkind = 'slurm'\nslurm_conf = '{cluster.conf}'\n{extra}")
    return path


def hostrun_argv(cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dispatch", "--config", str(cfg), *args]


def hostrun(cfg: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(hostrun_argv(cfg, *args), capture_output=True, timeout=120, check=False,
                          cwd=kw.pop("cwd", ROOT), **kw)  # type: ignore[call-overload, no-any-return]


def job(cluster: SlurmCluster, job_id: str) -> sf.JobRecord:
    record = sf.parse_job(cluster.run(sf.job_command(job_id)).stdout)
    assert record is not None
    return record


def history(cfg: Path) -> list[dict[str, object]]:
    done = hostrun(cfg, "history", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_exit_status_and_streams_pass_through(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    done = hostrun(cfg, "--host", "farm", "-l", "st", "--", "sh", "-c",
                   "echo out; echo err >&2; printf 'no newline' >&2; exit 7")
    assert done.returncode == 7, done.stderr
    assert done.stdout == b"out\n"  # stdout untouched, stderr apart
    # srun's own line ("srun: error: NODE: task 0: Exited with exit code 7\n") lands before or
    # after the job's unterminated last line, as srun forwards it when the task ends
    job_err = re.sub(rb"srun: error: [^\n]*task 0: Exited with exit code 7\n", b"", done.stderr)
    assert job_err == b"err\nno newline"
    assert b"\x1f" not in done.stderr and b"hostrun-peak" not in done.stderr
    [(job_id, name, state)] = slurm.jobs()
    assert (name, state) == ("st", "FAILED")
    assert "hostrun:" in slurm.run(["scontrol", "show", "job", "-o", job_id]).stdout  # its comment
    [row] = history(cfg)
    assert (row["host"], row["label"], row["exit_code"], row["outcome"]) == ("farm", "st", 7, "exit")
    assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] > 0  # the step cgroup's peak


def test_argv_with_odd_bytes_reaches_the_job_unchanged(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    odd = ["a b", "$(touch /tmp/x)", ";|&", "'\"", "new\nline", "\udcff\udcfe", "-c"]
    script = "import os, sys; sys.stdout.buffer.write(repr([os.fsencode(a) for a in sys.argv[1:]]).encode())"
    done = hostrun(cfg, "--peer=farm", "--", "python3", "-c", script, *odd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == repr([os.fsencode(a) for a in odd])


def test_stdin_only_when_asked_and_threads_become_cpus(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    asked = hostrun(cfg, "--peer=farm", "--stdin", "--threads", "2", "--", "sh", "-c",
                    'cat; echo "$MAKEFLAGS $SLURM_CPUS_PER_TASK"', input=b"piped\n", stdin=None)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == b"piped\n-j2 2\n"
    unasked = hostrun(cfg, "--peer=farm", "--", "sh", "-c", "cat; echo done")
    assert unasked.stdout == b"done\n"


def test_over_its_mem_is_250_and_the_peak_sizes_the_next_run(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    grow = ["python3", "-c", "x = bytearray(300 << 20)"]
    done = hostrun(cfg, "--peer=farm", "-l", "grow", "-m", "64M", "--", *grow)
    assert done.returncode == ExitCode.OWN_CAP, done.stderr
    assert b"state OUT_OF_MEMORY" in done.stderr and b"exit 250 (own-cap)" in done.stderr
    [first] = slurm.jobs()
    assert job(slurm, first[0]).memory == 64 * MiB
    alerts = hostrun(cfg, "alerts", "--json")
    assert alerts.returncode == 0, alerts.stderr
    [alert] = json.loads(alerts.stdout)
    assert alert["host"] == "farm" and "--peer=farm" in alert["action"] and "-m 512M" in alert["action"]
    # no -m now: twice the worst peak (the 64M it was killed at), rounded up to 512 MiB
    again = hostrun(cfg, "--peer=farm", "-l", "grow", "--", *grow)
    assert again.returncode == 0, again.stderr
    second = slurm.jobs()[-1]
    assert job(slurm, second[0]).memory == 512 * MiB
    rows = history(cfg)
    assert [(r["outcome"], r["cap_bytes"], r["booking_kind"], r["hit_ceiling"]) for r in rows] == [
        ("own-cap", 64 * MiB, "cap", True), ("exit", 512 * MiB, "peak", False)]
    assert rows[1]["peak_bytes"] >= 300 * MiB  # type: ignore[operator]
    # the third run is sized from the worst peak of both (>= 300 MiB: 1 GiB)
    third = hostrun(cfg, "--peer=farm", "-l", "grow", "--", "true")
    assert third.returncode == 0
    assert job(slurm, slurm.jobs()[-1][0]).memory == 1024 * MiB


def test_a_mem_no_node_can_hold_is_243_and_nothing_is_recorded(slurm: SlurmCluster,
                                                                tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    done = hostrun(cfg, "--peer=farm", "-m", "100T", "--", "true")
    assert done.returncode == ExitCode.NEVER_FITS, done.stderr
    assert b"no node of cluster farm could ever hold the job" in done.stderr
    assert history(cfg) == []


def test_a_bad_partition_is_a_configuration_error(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm, "partition = 'nope'\n")
    done = hostrun(cfg, "--peer=farm", "--", "true")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert b"cluster farm refused the job" in done.stderr and b"partition" in done.stderr
    bad_flag = config(tmp_path, slurm, "srun_args = ['--bogus']\n")
    done = hostrun(bad_flag, "--peer=farm", "--", "true")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert b"unrecognized option '--bogus'" in done.stderr


def test_max_runtime_becomes_time_and_a_timeout_is_253(slurm: SlurmCluster, tmp_path: Path) -> None:
    """--max-runtime 1m gives the job --time=1 (read back from slurmctld). Waiting the minute out
    costs 60-90 s (Slurm checks limits every 30 s), so the test then lowers the running job's limit
    to 0 with scontrol: Slurm's own time-limit check ends it TIMEOUT at its next pass."""
    cfg = config(tmp_path, slurm)
    proc = subprocess.Popen(hostrun_argv(cfg, "--peer=farm", "-l", "slow", "--max-runtime", "1m", "--",
                                         "sleep", "300"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        job_id = slurm.wait_for("slow")
        assert "TimeLimit=00:01:00" in slurm.run(["scontrol", "show", "job", "-o", job_id]).stdout
        assert slurm.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=0"]).returncode == 0
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == ExitCode.MAX_RUNTIME, err
    assert b"state TIMEOUT" in err
    assert job(slurm, job_id).state == "TIMEOUT"


def test_ctrl_c_cancels_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = config(tmp_path, slurm)
    proc = subprocess.Popen(hostrun_argv(cfg, "--peer=farm", "-l", "long", "--", "sleep", "300"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT)
    try:
        job_id = slurm.wait_for("long")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    # ended by the SIGINT handed to its task (FAILED) or by the cancel after it (CANCELLED)
    assert job(slurm, job_id).state in ("FAILED", "CANCELLED")
    [row] = history(cfg)
    assert row["exit_code"] == 130


def queued_behind_a_full_node(slurm: SlurmCluster, cfg: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A job holding the node's memory (its id, to cancel), and hostrun's job queued behind it."""
    node = sf.parse_nodes(slurm.run(sf.node_command()).stdout)[0]
    held = slurm.run(["sbatch", "--parsable", f"--mem={node.real_memory // MiB - 100}M", "-J", "hold",
                      "--wrap", "sleep 120"]).stdout.strip()
    proc = subprocess.Popen(hostrun_argv(cfg, "--peer=farm", "-l", "queued", "-m", "200M", "--",
                                         "true"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    return held, proc


def test_a_pending_job_is_cancelled_on_ctrl_c(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job that waits in Slurm's queue (the node's memory held) has no step to signal: Ctrl-C
    cancels it at once."""
    cfg = config(tmp_path, slurm)
    held, proc = queued_behind_a_full_node(slurm, cfg)
    try:
        slurm.wait_for("queued", "PENDING")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        slurm.run(["scancel", held])
    assert proc.returncode == 130, err
    [queued] = [j for j in slurm.jobs() if j[1] == "queued"]
    assert queued[2] == "CANCELLED"
    [row] = history(cfg)  # it never ran: 0 s (was 1.0: RunTime 0 + 1)
    assert row["duration_s"] == 0.0 and isinstance(row["waited_s"], float) and row["waited_s"] > 0, row


def test_a_killed_client_leaves_nothing_running(slurm: SlurmCluster, tmp_path: Path) -> None:
    """hostrun SIGKILLed: its guardian kills srun and cancels the job (measured here: the job has
    left RUNNING within ~0.1 s; the bound below is generous)."""
    cfg = config(tmp_path, slurm)
    proc = subprocess.Popen(hostrun_argv(cfg, "--peer=farm", "-l", "orphan", "--", "sleep", "300"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    job_id = slurm.wait_for("orphan")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while job(slurm, job_id).state in ("RUNNING", "COMPLETING") or slurm.step_pids():
        assert time.monotonic() < deadline, job(slurm, job_id)
        time.sleep(0.1)
    assert job(slurm, job_id).state == "CANCELLED"


def test_auto_sends_a_job_the_local_slice_cannot_hold_to_the_cluster(hostrun: Any,
                                                                       slurm: SlurmCluster) -> None:
    hostrun.configure(slice="300M", top="enable_across_machines = true",
                      peers=f"[hosts.farm]\nkind = 'slurm'\nslurm_conf = '{slurm.conf}'\n")
    done = hostrun.run("--auto", "-m", "1G", "-l", "big", "--", "sh", "-c", 'echo "job $SLURM_JOB_ID"',
                       stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "local does not fit; farm fits: node" in done.stderr
    [(job_id, name, state)] = slurm.jobs()
    assert (done.stdout, name, state) == (f"job {job_id}\n", "big", "COMPLETED")
    assert job(slurm, job_id).memory == 1 << 30
    assert hostrun.bookings() == []


def test_a_scripts_preflight_is_checked_here_before_the_cluster(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A script's admission (its inputs, this tree's) is checked here: unchanged inputs skip the
    second run (78) with nothing submitted; a run-condition about the machine (a command on PATH)
    cannot be checked on a node before the job starts, so it refuses (78), nothing submitted."""
    cfg = config(tmp_path, slurm)
    (tmp_path / "input.txt").write_text("v1\n")
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n# admission: inputs-changed input.txt\necho ran\n")
    job.chmod(0o755)
    first = hostrun(cfg, "--peer=farm", "--", str(job), cwd=tmp_path)
    assert (first.returncode, first.stdout) == (0, b"ran\n"), first.stderr
    again = hostrun(cfg, "--peer=farm", "--", str(job), cwd=tmp_path)
    assert again.returncode == ExitCode.NOT_RUN and b"nothing to do" in again.stderr, again.stderr
    assert len(slurm.jobs()) == 1
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\n# run-condition: command sh\necho ran\n")
    tool.chmod(0o755)
    refused = hostrun(cfg, "--peer=farm", "--", str(tool), cwd=tmp_path)
    assert refused.returncode == ExitCode.NOT_RUN, refused.stderr
    assert (b"tool.sh:2: run-condition command is about the machine the job runs on, a node of "
            b"cluster farm") in refused.stderr
    assert len(slurm.jobs()) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_a_forwarded_signal_reaches_the_job_itself(slurm: SlurmCluster, tmp_path: Path,
                                                   sig: signal.Signals) -> None:
    """The job's own handler runs, as it does locally (not only the node's wrapper shell): it
    traps the signal, leaves a file and exits 3, which passes through."""
    cfg = config(tmp_path, slurm)
    caught, ready = tmp_path / "caught", tmp_path / "ready"
    name = sig.name.removeprefix("SIG")
    script = f'trap "touch {caught}; exit 3" {name}; touch {ready}; sleep 100 & wait'
    proc = subprocess.Popen(hostrun_argv(cfg, "--peer=farm", "-l", "trapper", "--", "sh", "-c", script),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert caught.exists(), err
    assert proc.returncode == 3, err


def test_the_half_rule_never_asks_more_than_the_largest_node(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    """A label that peaked at over half a node: twice its peak is more than any node has, so
    the next run asks for the node's memory (with a warning), instead of 243."""
    from dispatch.local.admission.ledger import Ledger

    cfg = config(tmp_path, slurm)
    node = sf.parse_nodes(slurm.run(sf.node_command()).stdout)[0]
    (tmp_path / "state").mkdir(mode=0o700)
    ledger = Ledger(str(tmp_path / "state"))
    try:  # as a run of it on the cluster would have recorded it
        ledger.record_peak("wide", "farm", node.real_memory * 6 // 10, False, 1.0, cap=None)
    finally:
        ledger.close()
    done = hostrun(cfg, "--peer=farm", "-l", "wide", "--", "true")
    assert done.returncode == 0, done.stderr
    assert b"more than any node has; asking for the largest node's" in done.stderr
    assert job(slurm, slurm.jobs()[-1][0]).memory == node.real_memory


def test_a_directory_the_node_lacks_is_refused_not_run_in_tmp(slurm: SlurmCluster, tmp_path: Path) -> None:
    """hostrun runs in a mount namespace of its own, in a directory on a tmpfs only it sees: the
    node (slurmstepd, in the machine's namespace) cannot enter it, and Slurm would run the job in
    /tmp. hostrun refuses it (78), names the directory, and nothing runs or is recorded."""
    cfg = config(tmp_path, slurm)
    base = tmp_path / "ns"
    base.mkdir()
    trace = f"hostrun-wrongdir-{os.getpid()}"
    inner = " ".join(hostrun_argv(cfg, "--peer=farm", "-l", "wrongdir", "--", "touch", trace))
    script = (f"mount -t tmpfs none {base} && mkdir {base}/work && cd {base}/work && "
              f"PYTHONPATH={ROOT} exec {inner}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == ExitCode.NOT_RUN, done.stderr
    assert f"the job's directory {base}/work does not exist on the node".encode() in done.stderr
    assert not (Path("/tmp") / trace).exists()
    assert history(cfg) == []


def test_the_recorded_peak_leaves_out_page_cache_as_a_local_run_does(slurm: SlurmCluster,
                                                                      tmp_path: Path) -> None:
    """Writing 300 MiB to a file charges its page cache to the step's cgroup; the high-water mark
    counts it, hostrun's peak (here as on its own machine) does not."""
    cfg = config(tmp_path, slurm)
    data = tmp_path / "data"
    done = hostrun(cfg, "--peer=farm", "-l", "writer", "--", "dd", "if=/dev/zero", f"of={data}",
                   "bs=1M", "count=300", "status=none")
    assert done.returncode == 0, done.stderr
    [row] = history(cfg)
    assert isinstance(row["peak_bytes"], int) and 0 < row["peak_bytes"] < 100 * MiB, row


@pytest.mark.parametrize("args, needle", [
    (("--threads", "64"), b"64 threads (--threads, else heavy_threads): no node of cluster farm has"),
    (("--gpu-memory", "1G"), b"--gpu-memory: no node of cluster farm has a GPU; it could never start"),
])
def test_what_no_node_could_ever_start_is_243_at_once(slurm: SlurmCluster, tmp_path: Path,
                                                      args: tuple[str, ...], needle: bytes) -> None:
    """More threads than a node has CPUs stayed PENDING for good; a GPU on a cluster without one was
    exit 1 ("end state could not be read"). Both are refused before anything is submitted."""
    cfg = config(tmp_path, slurm)
    done = hostrun(cfg, "--peer=farm", *args, "--", "true")
    assert done.returncode == ExitCode.NEVER_FITS, done.stderr
    assert needle in done.stderr
    assert slurm.jobs() == [] and history(cfg) == []


def test_a_pending_job_says_why_it_waits(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Slurm's reason for a job it keeps pending, every status_interval, as a local waiter's line;
    then the job runs once the node is free."""
    cfg = config(tmp_path, slurm, "")
    text = cfg.read_text().replace("kill_grace = '2s'\n", "kill_grace = '2s'\nstatus_interval = '1s'\n")
    cfg.write_text(text)
    held, proc = queued_behind_a_full_node(slurm, cfg)
    try:
        slurm.wait_for("queued", "PENDING")
        time.sleep(2.5)
        slurm.run(["scancel", held])
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        slurm.run(["scancel", held])
    assert proc.returncode == 0, err
    assert re.search(rb"waiting in cluster farm's queue: (Resources|Priority) \(Slurm job \d+\)", err), err
    # Its run time is the node's clock around the job, not Slurm's whole-second RunTime + 1 s.
    [row] = history(cfg)
    assert isinstance(row["duration_s"], float) and 0.0 < row["duration_s"] < 1.0, row
    assert isinstance(row["waited_s"], float) and row["waited_s"] > 2.0, row


def test_a_child_oom_killed_in_a_job_that_exits_0_passes_0_through(slurm: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    """As locally: the job's own 0 passes through with a warning, and the label is marked as having
    hit its cap (its next runs are sized from its --mem)."""
    cfg = config(tmp_path, slurm)
    script = 'python3 -c "x = bytearray(400 << 20)"; exit 0'
    done = hostrun(cfg, "--peer=farm", "-l", "parent", "-m", "128M", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    assert b"a process of the job was OOM-killed at its --mem" in done.stderr
    assert b"but the job exited 0; passing 0 through" in done.stderr
    [row] = history(cfg)
    assert (row["exit_code"], row["outcome"], row["hit_ceiling"]) == (0, "exit", True)


def test_a_command_the_node_lacks_is_said_as_locally(slurm: SlurmCluster, tmp_path: Path) -> None:
    """127 and hostrun's own line (was the wrapper shell's ``X: 2: X: not found``); a job a signal
    killed leaves no ``Terminated`` of the wrapper's."""
    cfg = config(tmp_path, slurm)
    done = hostrun(cfg, "--peer=farm", "--", "no-such-cmd-x")
    assert done.returncode == 127, done.stderr
    assert b"hostrun: cannot run 'no-such-cmd-x' on a node of cluster farm: No such file" in done.stderr
    assert b"not found" not in done.stderr and b"env:" not in done.stderr
    done = hostrun(cfg, "--peer=farm", "--", "sh", "-c", "kill -TERM $$")
    assert done.returncode == 143 and b"Terminated\n" not in done.stderr, done.stderr
