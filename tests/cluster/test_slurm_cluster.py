"""The private Slurm cluster of tests/support/slurmcluster.py against the real Slurm here, and the
facts read live.

What a ``SlurmHost`` kind will rely on: a job's own status comes back through srun, a job over its
``--mem`` is killed by Slurm's cgroup and ends OUT_OF_MEMORY (srun itself exits 1 then, so the state
must be read, not srun's status), and the node figures parsed from ``scontrol`` are Slurm's own.

A ``--time`` test is left out: Slurm's limits are whole minutes and slurmctld checks them every 30 s,
so ``srun --time=0:01 sleep 120`` ran 85 s here before ending TIMEOUT (recorded in
tests/recorded/slurm/job_timeout.txt and parsed by tests/fast/test_slurmfacts.py).
"""

from __future__ import annotations

import time

from dispatch.hosts.slurm import facts as sf
from tests.support.slurmcluster import SlurmCluster


def test_srun_passes_the_exit_status_through(slurm: SlurmCluster) -> None:
    assert slurm.run(["srun", "true"]).returncode == 0
    done = slurm.run(["srun", "sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (done.returncode, done.stdout) == (7, "out\n")
    # srun adds its own line: "srun: error: NODE: task 0: Exited with exit code 7"
    assert "err" in done.stderr.splitlines() and "exit code 7" in done.stderr


def test_a_job_over_its_mem_ends_out_of_memory(slurm: SlurmCluster) -> None:
    done = slurm.run(["srun", "--mem=50M", "-J", "oom", "python3", "-c", "x = bytearray(300 << 20)"])
    assert done.returncode == 1, done.stderr  # srun's own status for an OOM-killed step
    assert "Out Of Memory" in done.stderr
    [job_id] = slurm.run(["squeue", "-h", "-t", "all", "-n", "oom", "-o", "%i"]).stdout.split()
    job = sf.parse_job(slurm.run(sf.job_command(job_id)).stdout)
    assert job is not None
    assert (job.state, job.reason, job.memory) == ("OUT_OF_MEMORY", "OutOfMemory", 50 << 20)


def test_a_job_within_its_mem_completes(slurm: SlurmCluster) -> None:
    done = slurm.run(["srun", "--mem=200M", "-J", "fits", "python3", "-c", "x = bytearray(100 << 20)"])
    assert done.returncode == 0, done.stderr
    [job_id] = slurm.run(["squeue", "-h", "-t", "all", "-n", "fits", "-o", "%i"]).stdout.split()
    job = sf.parse_job(slurm.run(sf.job_command(job_id)).stdout)
    assert job is not None and (job.state, job.exit_code) == ("COMPLETED", 0)


def test_node_facts_match_scontrol(slurm: SlurmCluster) -> None:
    held = slurm.run(["sbatch", "--parsable", "--mem=300M", "-J", "hold", "--wrap", "sleep 60"])
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip()
    try:
        text = ""
        deadline = time.monotonic() + 30  # bounded wait for the job to be placed
        while time.monotonic() < deadline:
            text = slurm.run(sf.node_command()).stdout
            if "AllocMem=0 " not in text:
                break
            time.sleep(0.1)
        [node] = sf.parse_nodes(text)
        raw = sf.parse_key_values(text)
        assert node.name == slurm.node
        assert node.real_memory == int(raw["RealMemory"]) << 20
        assert node.alloc_memory == int(raw["AllocMem"]) << 20 == 300 << 20
        assert node.free_memory == int(raw["FreeMem"]) << 20
        assert (node.cpus, node.cpus_alloc) == (int(raw["CPUTot"]), int(raw["CPUAlloc"]))
        [queued] = sf.parse_queue(slurm.run(sf.queue_command()).stdout)
        assert (queued.job_id, queued.memory) == (job_id, 300 << 20)
    finally:
        slurm.run(["scancel", job_id])
