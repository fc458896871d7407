"""A Slurm cluster's report and judgement without a cluster: the new parsers on outputs recorded from
the private cluster of tests/support/slurmcluster.py (a node with ``Gres=gpu:fake:2`` in partitions ``test``
and ``other``, one GPU job running; a queue with a pending job; ``scontrol show config``), the report
built from them (the client commands replaced by the recorded text, the ledger a real one), and
``judge_cluster`` on hand-built reports: partition, drained node, GPU gres, pending notes, defaults."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.config.model import validate_file
from dispatch.core.errors import PeerUnreachableError
from dispatch.hooks.table import host_line
from dispatch.hosts.judgement import HostPending, Job
from dispatch.hosts.kinds import host_for
from dispatch.hosts.slurm import facts as sf
from dispatch.hosts.slurm.commands import Done
from dispatch.hosts.slurm.kind import SlurmHost
from dispatch.hosts.slurm.report import cluster_report, judge_cluster, node_entry
from dispatch.local.admission.ledger import Ledger
from dispatch.local.capacity import half_rule_cap, host_capacity
from dispatch.placement.reports import HostReading

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "slurm"
MiB, GiB = 1 << 20, 1 << 30


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ parsers
def test_node_partitions_and_gpus() -> None:
    [node] = sf.parse_nodes(recorded("node_gres.txt"))
    assert (node.partitions, node.gres, node.gpus, node.gpus_used) == (("test", "other"), "gpu:fake:2", 2, 1)
    [plain] = sf.parse_nodes(recorded("node_idle.txt"))  # no -d: GresUsed is not printed
    assert (plain.partitions, plain.gpus, plain.gpus_used) == (("test",), 0, None)
    assert sf.node_details_command() == ["scontrol", "-d", "show", "node", "-o"]


@pytest.mark.parametrize(("gres", "count"), [
    ("(null)", 0), ("", 0), ("gpu:4", 4), ("gpu", 1), ("gpu:a100:4(S:0-1)", 4),
    ("gpu:a100:2(S:0,1),gpu:v100:2,mps:100", 4), ("gpu:fake:1(IDX:0)", 1), ("gpu:a100:0(IDX:N/A)", 0),
])
def test_gpu_count(gres: str, count: int) -> None:
    assert sf.gpu_count(gres) == count


def test_named_queue_has_name_times_and_partition() -> None:
    jobs = {j.job_id: j for j in sf.parse_queue(recorded("squeue_named.txt"))}
    wide, waits = jobs["2"], jobs["3"]
    assert (wide.state, wide.memory, wide.nodes, wide.partition, wide.name) == (
        "RUNNING", 20 * GiB, "vm", "other", "wide")
    assert wide.started == time.mktime(time.strptime("2026-11-30T19:08:46", "%Y-%m-%dT%H:%M:%S"))
    assert (waits.state, waits.reason, waits.started, waits.name) == ("PENDING", "Resources", None, "waits")
    assert waits.submitted is not None
    assert sf.queue_command(named=True)[3] == sf.NAMED_FORMAT
    [odd] = sf.parse_queue("9|RUNNING|None|1G|vm|N/A|N/A|test|a|b\n")  # a name may hold "|"
    assert odd.name == "a|b"


def test_config_default_mem_and_version() -> None:
    config = sf.parse_config(recorded("config.txt"))
    assert (config["SLURM_VERSION"], config["DefMemPerNode"]) == ("22.05.8", "256")
    assert sf.default_mem(config) == sf.DefaultMem(256 * MiB, None)
    per_cpu = {"DefMemPerNode": "UNLIMITED", "DefMemPerCPU": "2G"}
    assert sf.default_mem(per_cpu) == sf.DefaultMem(None, 2 * GiB)
    assert sf.default_mem({}) == sf.DefaultMem(None, None)
    assert sf.parse_version(recorded("version.txt")) == "22.05.8"


# ----------------------------------------------------------------- the report, from recordings
def cluster(tmp_path: Path, extra: str = "") -> SlurmHost:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\nenable_across_machines = true\n"
                   f"[hosts.local]\n[hosts.c]\nkind = 'slurm'\n{extra}")
    host = host_for(validate_file(str(cfg)), "c")
    assert isinstance(host, SlurmHost)
    return host


class Recorded:
    """The client commands, answering with what the private cluster printed."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[list[str], float]] = []

    def run(self, argv: list[str], timeout: float) -> Done:
        self.calls.append((list(argv), timeout))
        return Done(0, self.outputs[" ".join(argv[:3])], "")


def recorded_cluster(host: SlurmHost, monkeypatch: pytest.MonkeyPatch, nodes: str) -> Recorded:
    commands = Recorded({"scontrol -d show": nodes,
                         "squeue --noheader --format": recorded("squeue_named.txt"),
                         "scontrol show config": recorded("config.txt")})
    monkeypatch.setattr(host, "commands", lambda: commands)
    return commands


def test_report_from_recorded_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = cluster(tmp_path, "default_cap = '1G'\n")
    commands = recorded_cluster(host, monkeypatch, recorded("node_gres.txt"))
    ledger = Ledger(str(tmp_path / "state"))
    ledger.record_peak("build", "c", 3 * GiB, False, 42.0, cap=8 * GiB)
    ledger.record_peak("build", "local", 9 * GiB, False, 1.0, cap=None)  # another host's: not read
    ledger.close()
    report = cluster_report(host, "build", peaks=True)
    assert [timeout for _, timeout in commands.calls] == [host.settings.report_timeout] * 3
    assert (report["kind"], report["hostname"], report["slurm_version"]) == ("slurm", "hr17555", "22.05.8")
    [node] = report["nodes"]
    assert node == {"name": "vm", "state": "ALLOCATED", "usable": True, "partitions": ["test", "other"],
                    "memory": {"total": 21695 * MiB, "allocated": 20780 * MiB, "free": 915 * MiB},
                    "cpus": {"total": 2, "allocated": 2}, "gpus": {"total": 2, "used": 1},
                    "gres": "gpu:fake:2", "reason": None}
    assert report["totals"]["most_free_node"] == {"name": "vm", "memory": 915 * MiB}
    assert report["slice"] == {"limit": 21695 * MiB, "free": 915 * MiB}
    assert [(j["id"], j["label"], j["booked"]) for j in report["running"]] == [
        ("2", "wide", 20 * GiB), ("1", "hold-gpu", 300 * MiB)]
    assert [(j["id"], j["label"], j["need"], j["reason"]) for j in report["queue"]] == [
        ("3", "waits", 10 * GiB, "Resources")]
    assert report["label_peak"]["max_peak"] == 3 * GiB and report["label_peak"]["host"] == "c"
    assert [(e["label"], e["host"]) for e in report["peak_table"]] == [("build", "c")]
    # capacity reads it as a host whose one job can have the largest node's memory
    capacity = host_capacity("c", report)
    assert (capacity.ok, capacity.slice_limit, capacity.default_cap) == (True, 21695 * MiB, GiB)
    assert [a.label for a in capacity.labels] == ["build"]
    line = host_line(host.settings, HostReading("c", report, None, 0.1))
    assert line == "- c: Slurm cluster, 1 of 1 nodes up, 915 MiB free to allocate (most on one node " \
                   "915 MiB), 2 running, 1 pending, 2 GPUs"


def test_partition_keeps_only_its_nodes_and_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = cluster(tmp_path, "partition = 'test'\n")
    gres = recorded("node_gres.txt")
    elsewhere = gres.replace("NodeName=vm ", "NodeName=vm2 ")
    elsewhere = elsewhere.replace("Partitions=test,other", "Partitions=other")
    recorded_cluster(host, monkeypatch, gres + elsewhere)
    report = cluster_report(host, None, peaks=False)
    assert [n["name"] for n in report["nodes"]] == ["vm"]
    assert report["partitions"] == ["other", "test"]
    assert [j["label"] for j in report["running"]] == ["hold-gpu"]  # "wide" ran in partition other
    assert report["label_peak"] is None and "peak_table" not in report


def test_a_failing_command_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = cluster(tmp_path)
    failing = Recorded({})
    failing.run = lambda argv, timeout: Done(  # type: ignore[method-assign]
        1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)\n")
    monkeypatch.setattr(host, "commands", lambda: failing)
    with pytest.raises(PeerUnreachableError) as caught:
        cluster_report(host, None, peaks=False)
    assert str(caught.value) == ("c: scontrol -d failed: slurm_load_node error: Unable to contact slurm "
                                 "controller (connect failure)")


def test_a_missing_slurm_conf_is_said_at_once(tmp_path: Path) -> None:
    host = cluster(tmp_path, f"slurm_conf = '{tmp_path}/nope.conf'\n")
    with pytest.raises(PeerUnreachableError, match=r"^c: slurm_conf .*/nope.conf: no such file$"):
        cluster_report(host, None, peaks=False)


# -------------------------------------------------------------------- judge_cluster, by hand
def node(name: str, total: int, allocated: int = 0, state: str = "IDLE", gres: str | None = None,
         gres_used: str | None = None, partitions: tuple[str, ...] = ("main",), cpus: int = 8,
         cpus_alloc: int = 0) -> dict[str, Any]:
    return node_entry(sf.SlurmNode(
        name, state, total, allocated, None, cpus, cpus_alloc, gres, None, partitions,
        sf.gpu_count(gres or ""), None if gres_used is None else sf.gpu_count(gres_used)))


def report(*nodes: dict[str, Any], partition: str | None = None, per_node: int | None = 256 * MiB,
           peak: int | None = None) -> dict[str, Any]:
    return {"kind": "slurm", "partition": partition, "nodes": list(nodes),
            "default_mem": {"per_node": per_node, "per_cpu": None},
            "label_peak": {"max_peak": peak} if peak else None}


def judge(tmp_path: Path, data: dict[str, Any], cap: int | None = None, gpu: int | None = None,
          pending: int = 0, extra: str = "", threads: int | None = None
          ) -> tuple[bool, bool, int | None, int | None, str]:
    waiting = HostPending(pending, {}, ()) if pending else None
    j = judge_cluster(cluster(tmp_path, extra), Job("build", cap=cap, gpu_memory=gpu, threads=threads),
                      data, waiting)
    return j.fits, j.could_ever_fit, j.need, j.free, j.reason


def test_fits_on_the_node_with_most_free(tmp_path: Path) -> None:
    data = report(node("a", 16 * GiB, 14 * GiB), node("b", 32 * GiB, 20 * GiB))
    assert judge(tmp_path, data, cap=4 * GiB) == (
        True, True, 4 * GiB, 12 * GiB, "fits: node b has 12.0 GiB free to allocate for --mem 4.0 GiB")


def test_a_drained_node_takes_nothing_now(tmp_path: Path) -> None:
    data = report(node("a", 16 * GiB, 14 * GiB), node("b", 64 * GiB, state="IDLE+DRAIN"))
    assert judge(tmp_path, data, cap=4 * GiB) == (
        False, True, 4 * GiB, 2 * GiB,
        "would queue: needs --mem 4.0 GiB, most free to allocate on a usable node 2.0 GiB")
    assert judge(tmp_path, data, cap=32 * GiB)[:2] == (False, True)  # b could hold it once resumed
    only_drained = report(node("b", 64 * GiB, state="DOWN+DRAIN"))
    assert judge(tmp_path, only_drained, cap=GiB)[4] == "would queue: needs --mem 1.0 GiB, no usable node"


def test_pending_notes_count_against_each_node(tmp_path: Path) -> None:
    data = report(node("a", 32 * GiB, 20 * GiB))
    assert judge(tmp_path, data, cap=4 * GiB, pending=6 * GiB) == (
        True, True, 4 * GiB, 6 * GiB,
        "fits: node a has 6.0 GiB free to allocate for --mem 4.0 GiB (after 6.0 GiB pending)")
    assert judge(tmp_path, data, cap=4 * GiB, pending=10 * GiB) == (
        False, True, 4 * GiB, 2 * GiB, "would queue: needs --mem 4.0 GiB, most free to allocate on a "
                                       "usable node 2.0 GiB (after 10.0 GiB pending)")


def test_never_names_the_mem_and_the_largest_node(tmp_path: Path) -> None:
    data = report(node("a", 16 * GiB), node("big", 48 * GiB, state="DOWN"), partition="main")
    assert judge(tmp_path, data, cap=64 * GiB) == (
        False, False, 64 * GiB, 16 * GiB,
        "--mem 64.0 GiB is larger than any node of partition main (largest: big, RealMemory 48.0 GiB)")
    assert judge(tmp_path, report(partition="gone"), cap=GiB) == (
        False, False, GiB, None, "no node in partition gone")


def test_gpu_jobs_need_a_gpu_in_the_gres(tmp_path: Path) -> None:
    data = report(node("cpu", 64 * GiB),
                  node("g", 32 * GiB, gres="gpu:a100:2", gres_used="gpu:a100:1(IDX:0)"))
    assert judge(tmp_path, data, cap=4 * GiB, gpu=10 * GiB)[4] == \
        "fits: node g has 32.0 GiB free to allocate and a free GPU for --mem 4.0 GiB"
    busy = report(node("cpu", 64 * GiB), node("g", 32 * GiB, gres="gpu:a100:2",
                                              gres_used="gpu:a100:2(IDX:0-1)"))
    assert judge(tmp_path, busy, cap=4 * GiB, gpu=10 * GiB)[:2] == (False, True)
    assert judge(tmp_path, busy, cap=4 * GiB, gpu=10 * GiB)[4] == \
        "would queue: needs --mem 4.0 GiB, no GPU free on a node with room"
    assert judge(tmp_path, busy, cap=4 * GiB)[4].startswith("fits: node cpu ")  # no GPU asked
    assert judge(tmp_path, data, cap=40 * GiB, gpu=GiB)[:2] == (False, False)
    assert judge(tmp_path, data, cap=40 * GiB, gpu=GiB)[4] == \
        "no node of the cluster big enough for --mem 40.0 GiB has a GPU in its Gres"


def test_without_mem_the_peak_then_default_cap_then_the_clusters_default(tmp_path: Path) -> None:
    data = report(node("a", 16 * GiB, 15 * GiB), peak=300 * MiB)
    assert judge(tmp_path, data)[2] == half_rule_cap(300 * MiB)  # the half rule on the recorded peak
    assert judge(tmp_path, report(node("a", 16 * GiB)), extra="default_cap = '2G'\n")[2] == 2 * GiB
    assert judge(tmp_path, report(node("a", 16 * GiB)))[2:] == (
        256 * MiB, 16 * GiB, "fits: node a has 16.0 GiB free to allocate for the cluster's DefMemPerNode "
                             "256 MiB")
    # no DefMemPerNode/DefMemPerCPU: Slurm gives the job a whole node, so only an empty node fits now
    whole = report(node("a", 16 * GiB, 1 * GiB), node("b", 8 * GiB), per_node=None)
    assert judge(tmp_path, whole)[:3] == (True, True, None)
    assert judge(tmp_path, whole)[4].startswith("fits: node b ")
    busy = report(node("a", 16 * GiB, 1 * GiB), per_node=None)
    assert judge(tmp_path, busy)[:2] == (False, True)
    assert judge(tmp_path, busy)[4].startswith(
        "would queue: needs a whole node (no --mem and no DefMemPerNode)")


def test_cpus_are_judged_like_memory(tmp_path: Path) -> None:
    """More threads than any node has CPUs can never start; a node whose CPUs are all allocated
    does not fit now; ``heavy_threads`` counts when --threads is not given."""
    data = report(node("a", 16 * GiB, cpus=2), node("b", 16 * GiB, cpus=4, cpus_alloc=4))
    assert judge(tmp_path, data, cap=GiB, threads=3)[:2] == (False, True)
    assert "no usable node has 3 CPUs free" in judge(tmp_path, data, cap=GiB, threads=3)[4]
    assert judge(tmp_path, data, cap=GiB, threads=2)[:2] == (True, True)
    fits, ever, _, _, why = judge(tmp_path, data, cap=GiB, threads=5)
    assert (fits, ever, why) == (False, False, "5 threads: no node of the cluster has more than 4 CPUs")
    assert judge(tmp_path, data, cap=GiB, extra="heavy_threads = 5\n")[:2] == (False, False)
