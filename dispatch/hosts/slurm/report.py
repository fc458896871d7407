"""A Slurm cluster's report and the dispatcher's judgement for it (docs/slurm.md, "Report and
placement").

The report is read from three bounded client commands (``scontrol -d show node -o``, ``squeue``,
``scontrol show config``; each within ``report_timeout``) and parsed by ``dispatch.hosts.slurm.facts``.
It keeps the keys other readers of a report use, with honest values for a cluster:

- ``slice.limit`` is the largest node's RealMemory (the most one job can ever get) and ``slice.free``
  the most memory free to allocate on one usable node: ``capacity`` and the hooks' table read those;
- ``running`` and ``queue`` are the cluster's jobs (``label`` is the job's name, which is hostrun's
  label for its own jobs), so a pending note is settled once its job shows in ``squeue``;
- ``label_peak`` is the label's record in THIS machine's ledger under the cluster's host name (the run
  path records a cluster's peaks there).

A cluster is judged per node, not by a slice: a job fits now when one usable node has its ``--mem``
free to allocate (RealMemory less AllocMem), less what is pending for the cluster.
"""

from __future__ import annotations

import os
import time

from dispatch.core.errors import PeerUnreachableError
from dispatch.core.units import format_size
from dispatch.hosts.judgement import Judgement
from dispatch.hosts.slurm import facts as sf

MYPY = False
if MYPY:
    from typing import Any, Protocol

    from dispatch.core.reportshape import QueuedJob, Report
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.hosts.judgement import HostPending, Job
    from dispatch.hosts.slurm.keys import SlurmOptions
    from dispatch.hosts.slurm.shape import ClusterJob, ClusterReport, DefaultMem, NamedSize, Node

    class SlurmHost(Protocol):
        """What this module asks of ``dispatch.hosts.slurm.kind.SlurmHost`` (which imports this module)."""

        settings: Settings
        table: HostSettings
        options: SlurmOptions

        @property
        def name(self) -> str: ...

        def commands(self) -> Any: ...


def read(host: SlurmHost, argv: list[str]) -> str:
    """One client command's output; its failure is "could not read" (246), with Slurm's own words."""
    done = host.commands().run(argv, timeout=host.settings.report_timeout)
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise PeerUnreachableError(f"{host.name}: {' '.join(argv[:2])} failed: {said}")
    return str(done.stdout)


def cluster_of(report: Report) -> ClusterReport:
    """A cluster's report as what it is: ``cluster_report`` built it."""
    return report  # type: ignore[return-value]  # a SlurmHost's reports are ClusterReports


def node_entry(node: sf.SlurmNode) -> Node:
    return {"name": node.name, "state": node.state, "usable": node.usable,
            "partitions": list(node.partitions),
            "memory": {"total": node.real_memory, "allocated": node.alloc_memory,
                       "free": max(0, node.real_memory - node.alloc_memory)},
            "cpus": {"total": node.cpus, "allocated": node.cpus_alloc},
            "gpus": {"total": node.gpus, "used": node.gpus_used}, "gres": node.gres,
            "reason": node.reason}


def cluster_report(host: SlurmHost, label: str | None, peaks: bool) -> ClusterReport:
    """The cluster's report (the module's docstring says which keys mean what there)."""
    partition = host.options.partition
    conf = host.options.slurm_conf
    if conf and host.options.ssh is None and not os.path.isfile(conf):
        # Slurm's clients retry a missing file for 60 s: say it now
        raise PeerUnreachableError(f"{host.name}: slurm_conf {conf}: no such file")
    try:
        nodes = sf.parse_nodes(read(host, sf.node_details_command()))
        jobs = sf.parse_queue(read(host, sf.queue_command(named=True)))
        config = sf.parse_config(read(host, sf.config_command()))
    except ValueError as exc:  # output of a form the parsers do not know
        raise PeerUnreachableError(f"{host.name}: unexpected Slurm output: {exc}") from None
    partitions = sorted({p for n in nodes for p in n.partitions})
    if partition is not None:
        nodes = [n for n in nodes if partition in n.partitions]
        jobs = [j for j in jobs if j.partition is None or partition in j.partition.split(",")]
    entries = [node_entry(n) for n in nodes]
    usable = [e for e in entries if e["usable"]]
    largest = max(entries, key=lambda e: e["memory"]["total"], default=None)
    roomiest = max(usable, key=lambda e: e["memory"]["free"], default=None)
    default = sf.default_mem(config)
    now = time.time()
    running = [j for j in jobs if j.state in ("RUNNING", "COMPLETING", "CONFIGURING")]
    pending = [j for j in jobs if j.state == "PENDING"]
    running_jobs: list[ClusterJob] = [
        {"id": j.job_id, "label": j.name, "state": j.state, "booked": j.memory, "nodes": j.nodes,
         "age_s": _age(now, j.started)} for j in running]
    queue: list[QueuedJob] = [{"id": j.job_id, "label": j.name, "need": j.memory, "reason": j.reason,
                               "waited_s": _age(now, j.submitted)} for j in pending]
    data: ClusterReport = {
        "kind": "slurm",
        "host": host.name,
        "hostname": config.get("ClusterName"),
        "version": _version(),
        "slurm_version": config.get("SLURM_VERSION"),
        "time": now,
        "partition": partition,
        "partitions": partitions,
        "default_mem": {"per_node": default.per_node, "per_cpu": default.per_cpu},
        "nodes": entries,
        "totals": {
            "nodes": len(entries),
            "nodes_up": len(usable),
            "memory_total": sum(e["memory"]["total"] for e in usable),
            "memory_allocated": sum(e["memory"]["allocated"] for e in usable),
            "memory_free": sum(e["memory"]["free"] for e in usable),
            "cpus_total": sum(e["cpus"]["total"] for e in usable),
            "cpus_allocated": sum(e["cpus"]["allocated"] for e in usable),
            "gpus_total": sum(e["gpus"]["total"] for e in usable),
            "largest_node": _named_size(largest, "total"),
            "most_free_node": _named_size(roomiest, "free"),
        },
        # the room one job could have, as the shared rules read it (module docstring)
        "slice": {"limit": largest["memory"]["total"] if largest else 0,
                  "free": roomiest["memory"]["free"] if roomiest else 0},
        "settings": {"default_cap": host.table.default_cap, "gamble_size": None},
        "gpus": [],
        "running": running_jobs,
        "queue": queue,
        "queue_length": len(pending),
        "label_peak": None,
    }
    if label is not None or peaks:
        _add_peaks(data, host, label, peaks)
    return data


def _version() -> str:
    from dispatch import __version__

    return __version__


def _named_size(entry: Node | None, which: str) -> NamedSize | None:
    if entry is None:
        return None
    memory = entry["memory"]
    return {"name": entry["name"], "memory": memory["total"] if which == "total" else memory["free"]}


def _age(now: float, since: float | None) -> float | None:
    return None if since is None else round(max(0.0, now - since), 1)


def _add_peaks(data: ClusterReport, host: SlurmHost, label: str | None, peaks: bool) -> None:
    """The label's record (and with ``peaks`` the whole table) from this machine's ledger, where the
    run path records a cluster's peaks under the cluster's host name."""
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.report import peak_data

    ledger = Ledger(host.settings.state_dir)
    try:
        peak = ledger.peak(label, host.name) if label else None
        data["label_peak"] = peak_data(peak) if peak else None
        if peaks:
            from dispatch.local.capacity import peak_table

            data["peak_table"] = peak_table([p for p in ledger.peaks() if p.host == host.name],
                                            ledger.peak_runs(host.name))
    finally:
        ledger.close()


# ----------------------------------------------------------------------------------- judgement
def judge_cluster(host: SlurmHost, job: Job, report: ClusterReport, waiting: HostPending | None
                  ) -> Judgement:
    """Fits now: a usable node has the job's ``--mem`` free to allocate (less what is pending for the
    cluster) and, with ``--gpu-memory``, a GPU not in use; would queue: some node of the partition
    (any state) is big enough and has a GPU if asked; else it can never fit.

    Without a ``--mem`` (no ``-m``, no recorded peak, no ``default_cap``) the job gets the cluster's
    own default: DefMemPerNode, or DefMemPerCPU for its one CPU at least, or (neither set) a whole
    node, which fits only on a node with nothing allocated. CPUs are judged alike: the job's
    threads (``--threads``, else ``heavy_threads``, else 1) free on the node to fit now, that many
    CPUs on some node at all, else it can never start (Slurm would keep it pending for good).
    """
    from dispatch.hosts.slurm.job import job_mem

    peak = report.get("label_peak")
    mem, _ = job_mem(job.cap, peak["max_peak"] if peak else None, host.table.default_cap)
    need, what = _need(mem, report["default_mem"])
    pending = waiting.memory if waiting is not None else 0
    nodes = report["nodes"]
    where = f"partition {report['partition']}" if report.get("partition") else "the cluster"
    if not nodes:
        return Judgement(host.name, False, False, need, None, f"no node in {where}")
    gpu = bool(job.gpu_memory)
    usable = [n for n in nodes if n["usable"]]

    def free(node: Node) -> int:
        return int(node["memory"]["free"]) - pending

    threads = job.threads or host.table.heavy_threads or 1

    def room(node: Node) -> bool:
        cpus = int(node["cpus"]["total"]) - int(node["cpus"]["allocated"]) >= threads
        if need is None:  # a whole node
            return int(node["memory"]["allocated"]) == 0 and pending == 0
        return free(node) >= need and cpus

    def gpu_free(node: Node) -> bool:
        gpus = node["gpus"]
        return int(gpus["total"] or 0) > int(gpus["used"] or 0)

    best = max((free(n) for n in usable), default=None)
    pend = f" (after {format_size(pending)} pending)" if pending else ""
    fitting = [n for n in usable if room(n) and (not gpu or gpu_free(n))]
    if fitting:
        node = max(fitting, key=free)
        on_gpu = " and a free GPU" if gpu else ""
        return Judgement(host.name, True, True, need, free(node),
                         f"fits: node {node['name']} has {format_size(free(node))} free to "
                         f"allocate{on_gpu} for {what}{pend}")
    big = [n for n in nodes if need is None or int(n["memory"]["total"]) >= need]
    largest = max(nodes, key=lambda n: int(n["memory"]["total"]))
    most = max(int(n["cpus"]["total"]) for n in nodes)
    if threads > most:
        return Judgement(host.name, False, False, need, best,
                         f"{threads} threads: no node of {where} has more than {most} CPUs",
                         too_big=True)
    if gpu and not any(int(n["gpus"]["total"] or 0) for n in big):
        return Judgement(host.name, False, False, need, best,
                         f"no node of {where} big enough for {what} has a GPU in its Gres")
    if big:
        why = ("no usable node" if not usable else
               f"most free to allocate on a usable node {format_size(max(0, best or 0))}{pend}")
        if gpu and any(room(n) for n in usable):
            why = "no GPU free on a node with room"
        elif any(free(n) >= (need or 0) for n in usable) and not any(room(n) for n in usable):
            why = f"no usable node has {threads} CPUs free"
        return Judgement(host.name, False, True, need, best, f"would queue: needs {what}, {why}")
    return Judgement(host.name, False, False, need, best,
                     f"{what} is larger than any node of {where} (largest: {largest['name']}, "
                     f"RealMemory {format_size(int(largest['memory']['total']))})", too_big=True)


def _need(mem: int | None, default: DefaultMem) -> tuple[int | None, str]:
    """The memory a job takes on a node, and how to say it; None: a whole node."""
    if mem is not None:
        return mem, f"--mem {format_size(mem)}"
    per_node, per_cpu = default.get("per_node"), default.get("per_cpu")
    if per_node:
        return per_node, f"the cluster's DefMemPerNode {format_size(per_node)}"
    if per_cpu:
        return per_cpu, f"the cluster's DefMemPerCPU {format_size(per_cpu)}"
    return None, "a whole node (no --mem and no DefMemPerNode)"
