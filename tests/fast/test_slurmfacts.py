"""The Slurm fact parsers (dispatch/hosts/slurm/facts.py) on outputs recorded from Slurm 22.05 here.

The files in tests/recorded/slurm were captured from the private one-node cluster of
tests/support/slurmcluster.py (Slurm 22.05.8, node "vm", 2 CPUs, RealMemory 21695 MiB, no slurmdbd): an idle
node, one fully allocated, one drained while a job completed, one DOWN; a queue with running, pending
(Resources) and held jobs; job records of a running, a pending, a held, an OUT_OF_MEMORY and a TIMEOUT
job; and what sacct prints without accounting storage. Only the sacct-with-accounting sample is
written by hand (there is no slurmdbd here to record from), in sacct's ``-P -n`` format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.core.units import MiB
from dispatch.hosts.slurm import facts as sf

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "slurm"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(("text", "unit", "expected"), [
    ("50M", "M", 50 * MiB), ("15G", "M", 15 << 30), ("21695", "M", 21695 * MiB), ("0", "M", 0),
    ("1234K", "K", 1234 << 10), ("812", "K", 812 << 10), ("1.5G", "M", 3 << 29), ("4000Mc", "M", 4000 * MiB),
    ("4000Mn", "M", 4000 * MiB), ("", "M", None), ("N/A", "M", None), ("(null)", "M", None),
])
def test_sizes_to_bytes(text: str, unit: str, expected: int | None) -> None:
    assert sf.to_bytes(text, unit) == expected


def test_a_size_that_is_not_one_is_named() -> None:
    with pytest.raises(ValueError, match="not a Slurm size: 'lots'"):
        sf.to_bytes("lots")


def test_idle_node() -> None:
    [node] = sf.parse_nodes(recorded("node_idle.txt"))
    assert node == sf.SlurmNode(name="vm", state="IDLE", real_memory=21695 * MiB, alloc_memory=0,
                                free_memory=node.free_memory, cpus=2, cpus_alloc=0, gres=None, reason=None,
                                partitions=("test",))
    assert node.free_memory is not None and node.free_memory > 0
    assert node.usable


def test_allocated_node_counts_every_job_memory() -> None:
    [node] = sf.parse_nodes(recorded("node_alloc.txt"))
    # the 15G batch job + the 256 MiB default of the srun sleeping beside it
    assert (node.state, node.alloc_memory, node.cpus_alloc) == ("ALLOCATED", (15 * 1024 + 256) * MiB, 2)
    assert node.usable


def test_drained_node_keeps_its_reason_with_spaces() -> None:
    [node] = sf.parse_nodes(recorded("node_drain.txt"))
    assert node.state == "MIXED+COMPLETING+DRAIN" and node.base_state == "MIXED"
    assert node.reason is not None and node.reason.startswith("disk check [root@")
    assert not node.usable


def test_down_node() -> None:
    [node] = sf.parse_nodes(recorded("node_down.txt"))
    assert node.state == "DOWN+DRAIN" and not node.usable
    assert node.reason is not None and node.reason.startswith("not responding")


def test_values_with_spaces_do_not_make_keys() -> None:
    kv = sf.parse_key_values(recorded("node_idle.txt"))
    assert kv["OS"].startswith("Linux ") and "#1" in kv["OS"]
    assert "SMP" not in kv and kv["RealMemory"] == "21695"


def test_queue_running_pending_held() -> None:
    jobs = {job.job_id: job for job in sf.parse_queue(recorded("squeue_mixed.txt"))}
    assert jobs["4"] == sf.QueuedJob("4", "RUNNING", None, 15 << 30, "vm")
    assert jobs["5"] == sf.QueuedJob("5", "PENDING", "Resources", 15 << 30, None)
    assert jobs["6"] == sf.QueuedJob("6", "PENDING", "JobHeldUser", 100 * MiB, None)


def test_queue_of_ended_jobs_and_empty_queue() -> None:
    states = {job.job_id: (job.state, job.reason) for job in sf.parse_queue(recorded("squeue_all.txt"))}
    assert states["2"] == ("OUT_OF_MEMORY", "OutOfMemory")
    assert states["3"] == ("NODE_FAIL", "NodeDown")
    assert states["1"] == ("COMPLETED", None)
    assert sf.parse_queue(recorded("squeue_after_down.txt")) == []


def test_queue_line_of_another_format_is_refused() -> None:
    with pytest.raises(ValueError, match="not 5"):
        sf.parse_queue("12 RUNNING vm\n")


def test_queue_command_uses_the_parsed_format() -> None:
    argv = sf.queue_command("alice")
    assert argv == ["squeue", "--noheader", "--format", "%i|%T|%r|%m|%N", "--user", "alice"]


def test_out_of_memory_job() -> None:
    job = sf.parse_job(recorded("job_oom.txt"))
    assert job == sf.JobRecord("2", "oom", "OUT_OF_MEMORY", "OutOfMemory", 0, 125, 50 * MiB, "vm", 0.0)


def test_timeout_job() -> None:
    job = sf.parse_job(recorded("job_timeout.txt"))
    assert job is not None
    assert (job.state, job.reason, job.memory, job.run_time) == ("TIMEOUT", "TimeLimit", 256 * MiB, 85.0)


def test_pending_and_held_jobs_have_their_reason() -> None:
    pending = sf.parse_job(recorded("job_pending.txt"))
    held = sf.parse_job(recorded("job_held.txt"))
    assert pending is not None and held is not None
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "Resources", None)
    assert pending.memory == 15 << 30
    assert (held.state, held.reason) == ("PENDING", "JobHeldUser")
    running = sf.parse_job(recorded("job_running.txt"))
    assert running is not None and (running.state, running.reason, running.nodes) == ("RUNNING", None, "vm")


def test_unknown_job_is_none() -> None:
    assert sf.parse_job("slurm_load_jobs error: Invalid job id specified\n") is None


def test_sacct_without_accounting_is_recognised() -> None:
    assert sf.accounting_disabled(recorded("sacct_no_accounting.txt"))
    assert not sf.accounting_disabled("")


SACCT_WITH_ACCOUNTING = """\
41|oom|OUT_OF_MEMORY|0:125||50M
41.extern|extern|COMPLETED|0:0|0|
41.0|python3|OUT_OF_MEMORY|0:125|51196K|
42|tmo|TIMEOUT|0:0||256M
42.0|sleep|CANCELLED by 0|0:15|812K|
"""


def test_sacct_steps_with_peak() -> None:
    steps = {s.job_id: s for s in sf.parse_accounting(SACCT_WITH_ACCOUNTING)}
    assert steps["41.0"] == sf.StepAccounting("41.0", "python3", "OUT_OF_MEMORY", 0, 125, 51196 << 10, None)
    assert steps["41"].max_rss is None and steps["41"].req_mem == 50 * MiB
    assert (steps["42.0"].state, steps["42.0"].exit_signal) == ("CANCELLED", 15)
    argv = sf.accounting_command("42")
    assert argv == ["sacct", "-P", "-n", "--format=JobID,JobName,State,ExitCode,MaxRSS,ReqMem", "-j", "42"]


def test_sacct_line_of_another_format_is_refused() -> None:
    with pytest.raises(ValueError, match="not 6"):
        sf.parse_accounting("41|oom|FAILED\n")
