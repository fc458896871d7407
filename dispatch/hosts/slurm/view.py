"""What the agent hooks' table and ``hostrun report`` say of a Slurm cluster: its nodes (memory
free to allocate is RealMemory less AllocMem) and its jobs, from its ``ClusterReport``."""

from __future__ import annotations

from dispatch.core import view
from dispatch.core.units import format_size
from dispatch.hosts.slurm.report import cluster_of

MYPY = False
if MYPY:
    from dispatch.core.reportshape import Report
    from dispatch.core.view import Block, Gauge


def summary(report: Report) -> str:
    """One line: nodes up, memory free to allocate, jobs, GPUs."""
    data = cluster_of(report)
    t = data["totals"]
    most = t.get("most_free_node")
    return (f"Slurm cluster, {t['nodes_up']} of {t['nodes']} nodes up, "
            f"{format_size(t['memory_free'])} free to allocate (most on one node "
            f"{format_size(most['memory'] if most else None)}), {len(data['running'])} running, "
            f"{data['queue_length']} pending, {t['gpus_total']} GPUs")


def describe(report: Report) -> list[Block]:
    """A heading line, the nodes' table (or that there are none), and the jobs by pending reason."""
    data = cluster_of(report)
    t = data["totals"]
    part = f", partition {data['partition']}" if data.get("partition") else ""
    heading = view.line(view.Span(data["host"], view.BOLD),
                        f": Slurm cluster {data.get('hostname') or '?'} "
                        f"(Slurm {data.get('slurm_version') or '?'}){part}: {t['nodes_up']} of "
                        f"{t['nodes']} nodes up; {format_size(t['memory_free'])} free to allocate of "
                        f"{format_size(t['memory_total'])} ({format_size(t['memory_allocated'])} allocated)")
    rows = []
    for n in data["nodes"]:
        mem, cpus, gpus = n["memory"], n["cpus"], n["gpus"]
        state = view.Span(n["state"], "" if n["usable"] else view.RED)
        gpu = "-" if not gpus["total"] else (
            f"{gpus['used']}/{gpus['total']} used" if gpus["used"] is not None else str(gpus["total"]))
        rows.append(view.row(n["name"], state, format_size(mem["total"]), format_size(mem["allocated"]),
                             format_size(mem["free"]), f"{cpus['allocated']}/{cpus['total']} allocated",
                             gpu, n["reason"] or ""))
    nodes = view.Grid(f"nodes of {data['host']}", ("node", "state", "memory", "allocated",
                                                    "free to allocate", "CPUs", "GPUs", "reason"),
                      tuple(rows), empty="nodes: none")
    pending: dict[str, int] = {}
    for job in data["queue"]:
        reason = str(job.get("reason") or "none")
        pending[reason] = pending.get(reason, 0) + 1
    why = ", ".join(f"{count} {reason}" for reason, count in sorted(pending.items()))
    jobs = view.line(f"jobs: {len(data['running'])} running, {data['queue_length']} pending"
                     + (f" ({why})" if why else ""))
    return [heading, nodes, jobs]


def gauges(report: Report) -> list[Gauge]:
    """Nodes up, memory allocated of all nodes' (and the most one node has free), CPUs allocated."""
    data = cluster_of(report)
    t = data["totals"]
    most = t.get("most_free_node")
    part = f", partition {data['partition']}" if data.get("partition") else ""
    return [
        view.Gauge("nodes", f"Slurm cluster {data.get('hostname') or '?'}{part}: {t['nodes_up']} of "
                            f"{t['nodes']} nodes up, {t['gpus_total']} GPUs"),
        view.Gauge("memory", f"{format_size(t['memory_free'])} free to allocate of "
                             f"{format_size(t['memory_total'])} (most on one node "
                             f"{format_size(most['memory'] if most else None)})",
                   t["memory_allocated"], 0, t["memory_total"]),
        view.Gauge("CPUs", f"{t['cpus_allocated']} of {t['cpus_total']} allocated",
                   t["cpus_allocated"], 0, t["cpus_total"]),
    ]
