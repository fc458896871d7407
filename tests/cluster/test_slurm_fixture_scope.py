"""The private Slurm cluster's tear-down stops only what it started (issue 27, item 6).

Other users and other sessions may run Slurm on the same machine: a ``slurmstepd`` that is not this
cluster's (here a real process of that name, started by the test and outside the cluster) must
neither be reported as a leak nor killed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import _unavailable
from tests.support.slurmcluster import ClusterError, SlurmCluster, missing_parts


@pytest.mark.system  # starts the private Slurm cluster: root, though it uses no system fixture
def test_tear_down_leaves_another_slurmstepd_alone(tmp_path: Path) -> None:
    problem = missing_parts()
    if problem:
        _unavailable(problem)
    sleep = shutil.which("sleep")
    assert sleep is not None
    stranger_exe = tmp_path / "slurmstepd"  # /proc/PID/stat names it "slurmstepd", as a real one
    shutil.copy(sleep, stranger_exe)
    stranger = subprocess.Popen([str(stranger_exe), "300"])
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    cluster = SlurmCluster(root)
    try:
        try:
            cluster.start()
        except ClusterError as exc:
            _unavailable(f"the private Slurm cluster did not start: {exc}")
            raise
        done = cluster.run(["srun", "-N1", "true"], timeout=60)
        assert done.returncode == 0, done.stderr
        # Its own steps are still seen (the leak check is not blind): one running job's slurmstepd.
        job = subprocess.Popen(["srun", "-N1", "-J", "held", "sleep", "60"], env=cluster.env,
                               cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            job_id = cluster.wait_for("held")
            assert int(job_id) >= cluster.first_job
            deadline = time.monotonic() + 20
            while not cluster.step_pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cluster.step_pids(), "the cluster's own slurmstepd was not recognised"
            assert stranger.pid not in cluster.step_pids()
        finally:
            cluster.run(["scancel", "--full", "--quiet", "--name", "held"])
            job.wait(timeout=30)
        leaks = cluster.stop()
        assert leaks == []
        assert stranger.poll() is None, "the tear-down killed a slurmstepd that was not its own"
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        stranger.kill()
        stranger.wait(timeout=10)


ROOT = Path(__file__).resolve().parents[2]


def test_no_script_or_fixture_stops_processes_by_name() -> None:
    """``pkill``/``killall`` match every user's and session's processes of that name: the scripts
    and the test fixtures stop what they started by pid (or by the cgroup they created), and the
    demo's peer has a name of its own (``demo-peer-$$``), never a fixed one another demo shares."""
    by_name = re.compile(r"\b(pkill|killall)\b")
    offenders = []
    for path in [*sorted((ROOT / "scripts").iterdir()), *sorted((ROOT / "tests/support").glob("*.py"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if by_name.search(line) and "command -v pkill" not in line:  # setup installs procps
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
    demo = (ROOT / "scripts/demo").read_text()
    assert 'peer="demo-peer-$$"' in demo and 'peer="demo-peer"' not in demo
