"""``hostrun report``, ``dispatch``, ``--auto`` and ``doctor`` with a Slurm cluster host, against the
private one-node cluster of tests/support/slurmcluster.py (real slurmctld/slurmd; the figures are checked
against scontrol's own while an sbatch job holds node memory)."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from dispatch.core.units import MiB
from dispatch.hosts.slurm import facts as sf
from tests.conftest import Hostrun
from tests.support.slurmcluster import SlurmCluster


def use_cluster(hostrun: Hostrun, cluster: SlurmCluster, extra: str = "", conf: str | None = None) -> None:
    """This machine with a small slice (64M: a job of -m 200M never fits here) and the cluster ``c``."""
    hostrun.configure(slice="64M", top='enable_across_machines = true\nreport_timeout = "5s"',
                      peers=f'[hosts.c]\nkind = "slurm"\nslurm_conf = "{conf or cluster.conf}"\n{extra}')


def hold(cluster: SlurmCluster, mem: str, name: str = "hold") -> str:
    """An sbatch job holding ``mem`` of the node, placed (bounded wait); returns its id."""
    done = cluster.run(["sbatch", "--parsable", f"--mem={mem}", "-J", name, "--wrap", "sleep 60"])
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip() == "RUNNING":
            return job_id
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} was not placed within 30 s")


def report_of(hostrun: Hostrun, host: str = "c") -> dict[str, Any]:
    done = hostrun.run("report", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    [entry] = [h for h in json.loads(done.stdout)["hosts"] if h["host"] == host]
    assert entry["ok"], entry["error"]
    return entry["report"]  # type: ignore[no-any-return]


def dispatch(hostrun: Hostrun, *args: str) -> tuple[int, dict[str, Any]]:
    done = hostrun.run("dispatch", "--json", *args, "--", "true")
    return done.returncode, json.loads(done.stdout)


def judged(decision: dict[str, Any], host: str = "c") -> dict[str, Any]:
    [j] = [j for j in decision["judgements"] if j["host"] == host]
    return j  # type: ignore[no-any-return]


def test_report_figures_are_scontrols_own(hostrun: Hostrun, slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    job_id = hold(slurm, "300M")
    report = report_of(hostrun)
    raw = sf.parse_key_values(slurm.run(sf.node_command()).stdout)
    [node] = report["nodes"]
    assert (report["kind"], node["name"], node["state"], node["usable"]) == (
        "slurm", slurm.node, "MIXED", True)
    assert node["memory"] == {"total": int(raw["RealMemory"]) * MiB, "allocated": 300 * MiB,
                              "free": (int(raw["RealMemory"]) - int(raw["AllocMem"])) * MiB}
    assert int(raw["AllocMem"]) == 300
    assert node["cpus"] == {"total": int(raw["CPUTot"]), "allocated": int(raw["CPUAlloc"])}
    totals = report["totals"]
    assert (totals["nodes"], totals["nodes_up"], totals["memory_allocated"]) == (1, 1, 300 * MiB)
    assert totals["largest_node"] == {"name": slurm.node, "memory": int(raw["RealMemory"]) * MiB}
    assert report["slice"]["limit"] == int(raw["RealMemory"]) * MiB  # the most one job can get
    assert [(j["id"], j["label"], j["booked"]) for j in report["running"]] == [(job_id, "hold", 300 * MiB)]
    assert (report["queue_length"], report["default_mem"]) == (0, {"per_node": 256 * MiB, "per_cpu": None})
    text = hostrun.run("report")
    assert text.returncode == 0, text.stderr
    assert "nodes of c" in text.stdout and slurm.node in text.stdout
    assert "1 of 1 nodes up" in text.stdout and "1 running, 0 pending" in text.stdout
    assert "host local" in text.stdout  # this machine is still shown


def test_a_pending_job_is_in_the_queue_with_its_reason(hostrun: Hostrun, slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    real = int(sf.parse_key_values(slurm.run(sf.node_command()).stdout)["RealMemory"])
    hold(slurm, f"{real - 100}M")
    waits = slurm.run(["sbatch", "--parsable", "--mem=200M", "-J", "waits", "--wrap", "sleep 60"])
    assert waits.returncode == 0, waits.stderr
    deadline = time.monotonic() + 30
    while True:  # the scheduler gives a reason on its next pass
        queue = report_of(hostrun)["queue"]
        if (queue and queue[0]["reason"] not in (None, "None")) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(j["id"], j["label"], j["need"], j["reason"]) for j in queue] == [
        (waits.stdout.strip(), "waits", 200 * MiB, "Resources")]


def test_an_unreadable_cluster_is_one_line_and_local_is_still_shown(hostrun: Hostrun,
                                                                    slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm, conf=str(slurm.root / "missing.conf"))
    done = hostrun.run("report")
    assert done.returncode == 246, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("c:")]
    assert line == f"c: could not read: c: slurm_conf {slurm.root}/missing.conf: no such file"
    assert "host local" in done.stdout
    doctor = hostrun.run("doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr
    [entry] = json.loads(doctor.stdout)["peers"]
    assert (entry["ok"], entry["problems"]) == (False, [line.removeprefix("c: ")])
    shown = hostrun.run("doctor").stdout
    assert "cluster c: could not read\n  problem: could not read: c: slurm_conf" in shown
    # a stopped controller: each command bounded by report_timeout, then the same one line
    use_cluster(hostrun, slurm)
    slurm.procs["slurmctld"].send_signal(signal.SIGTERM)
    slurm.procs["slurmctld"].wait(timeout=15)
    done = hostrun.run("report")
    assert done.returncode == 246, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("c:")]
    assert line.startswith("c: could not read: c: ") and "host local" in done.stdout
    code, decision = dispatch(hostrun, "-m", "200M")
    assert code == 243 and judged(decision)["reason"].startswith("could not read: ")


def test_dispatch_fits_now_on_a_node_with_room(hostrun: Hostrun, slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    code, decision = dispatch(hostrun, "-m", "200M")
    assert (code, decision["action"], decision["host"]) == (0, "peer", "c")
    j = judged(decision)
    assert (j["fits"], j["could_ever_fit"], j["need"]) == (True, True, 200 * MiB)
    assert j["reason"].startswith(f"fits: node {slurm.node} has ") and "for --mem 200 MiB" in j["reason"]


def test_dispatch_would_queue_while_node_memory_is_held(hostrun: Hostrun, slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    real = int(sf.parse_key_values(slurm.run(sf.node_command()).stdout)["RealMemory"])
    hold(slurm, f"{real - 100}M")
    code, decision = dispatch(hostrun, "-m", "200M")
    assert (code, decision["action"], decision["host"]) == (0, "peer", "c")
    assert "wait in its queue" in decision["reasons"][-1]
    j = judged(decision)
    assert (j["fits"], j["could_ever_fit"], j["free"]) == (False, True, 100 * MiB)
    assert j["reason"] == "would queue: needs --mem 200 MiB, most free to allocate on a usable node 100 MiB"


def test_dispatch_and_auto_refuse_a_job_larger_than_any_node_243(hostrun: Hostrun,
                                                                 slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    real = int(sf.parse_key_values(slurm.run(sf.node_command()).stdout)["RealMemory"])
    code, decision = dispatch(hostrun, "-m", f"{real + 1024}M")
    assert (code, decision["action"]) == (243, "refuse")
    j = judged(decision)
    assert not j["fits"] and not j["could_ever_fit"]
    assert j["reason"].startswith(f"--mem {(real + 1024) / 1024:.1f} GiB is larger than any node of the "
                                  f"cluster (largest: {slurm.node}, RealMemory ")
    done = hostrun.run("--auto", "-m", f"{real + 1024}M", "--", "sh", "-c", "echo ran")
    assert done.returncode == 243, done.stderr
    assert "ran" not in done.stdout and "no host could ever run it" in done.stderr
    assert slurm.run(["squeue", "-h", "-t", "all"]).stdout.strip() == ""  # nothing was submitted


def test_doctor_reads_the_cluster_and_names_its_problems(hostrun: Hostrun, slurm: SlurmCluster) -> None:
    use_cluster(hostrun, slurm)
    done = hostrun.run("doctor", "--json")
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)["peers"]
    version = slurm.run(["scontrol", "--version"]).stdout.split()[-1]
    assert (entry["host"], entry["kind"], entry["ok"], entry["slurm_version"]) == (
        "c", "slurm", True, version)
    assert (entry["nodes"], entry["nodes_up"], entry["problems"]) == (1, 1, [])
    text = hostrun.run("doctor").stdout
    assert f"cluster c: ok, Slurm {version}, 1 of 1 nodes usable" in text
    # a partition the cluster does not have
    use_cluster(hostrun, slurm, extra='partition = "nope"')
    [entry] = json.loads(hostrun.run("doctor", "--json").stdout)["peers"]
    assert entry["problems"] == ["partition nope is unknown to the cluster (its partitions: test)"]
    code, decision = dispatch(hostrun, "-m", "200M")
    assert (code, judged(decision)["reason"]) == (243, "no node in partition nope")
    # a drained node: no usable node, a job would queue there
    use_cluster(hostrun, slurm, extra='partition = "test"')
    drained = slurm.run(["scontrol", "update", f"nodename={slurm.node}", "state=drain", "reason=checking"])
    assert drained.returncode == 0, drained.stderr
    [entry] = json.loads(hostrun.run("doctor", "--json").stdout)["peers"]
    assert entry["nodes_up"] == 0
    assert entry["problems"] == [f"no usable node: jobs would wait ({slurm.node} IDLE+DRAIN)"]
    assert "problem: no usable node" in hostrun.run("doctor").stdout
    code, decision = dispatch(hostrun, "-m", "200M")
    assert (code, decision["action"], judged(decision)["reason"]) == (
        0, "peer", "would queue: needs --mem 200 MiB, no usable node")
