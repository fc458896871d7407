"""The ``slurm`` kind: a Slurm cluster behind hostrun's command line, exit codes and peak history
(docs/slurm.md). Slurm caps (``srun --mem``, enforced by its cgroups) and places the job; hostrun sizes
``--mem`` from the label's recorded peak, tells why the job ended, and records its peak. Settings:
``dispatch.hosts.slurm.keys``; the job as srun sees it: ``dispatch.hosts.slurm.job``."""

from __future__ import annotations

from collections.abc import Callable

from dispatch.hosts.base import Host, RunExtras
from dispatch.hosts.slurm.keys import SLURM, SPEC, options_of

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.reportshape import Report
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.core.view import Block, Gauge
    from dispatch.hosts.diagnosis import HostDiagnosis
    from dispatch.hosts.judgement import HostPending, Job, Judgement
    from dispatch.hosts.slurm.commands import SlurmCommands

    class ClusterDiagnosis(HostDiagnosis, total=False):
        """A cluster's doctor entry: its partition, the Slurm version its commands answer with,
        its name and how many of its nodes take jobs."""

        kind: str
        partition: Optional[str]
        slurm_version: Optional[str]
        cluster: Optional[str]
        nodes: int
        nodes_up: int
    from dispatch.hosts.slurm.shape import ClusterReport


class SlurmHost(Host):
    kind = SLURM
    spec = SPEC

    def __init__(self, settings: Settings, table: HostSettings) -> None:
        super().__init__(settings, table)
        self.options = options_of(table)

    def commands(self) -> SlurmCommands:
        """Where its client commands run: here, or on its login node (``ssh`` set)."""
        if self.options.ssh:
            from dispatch.hosts.slurm.login import LoginCommands

            return LoginCommands(self.name, self.options, self.table, self.settings)
        from dispatch.hosts.slurm.commands import SlurmCommands

        return SlurmCommands(self.name, self.options)

    def report(self, label: str | None = None, peaks: bool = False) -> ClusterReport:
        from dispatch.hosts.slurm.report import cluster_report

        return cluster_report(self, label, peaks)

    def judge(self, job: Job, report: Report, waiting: HostPending | None) -> Judgement:
        from dispatch.hosts.slurm.report import cluster_of, judge_cluster

        return judge_cluster(self, job, cluster_of(report), waiting)

    def pending_estimate(self, cap: int | None) -> int:
        """What a job sent there will hold of a node: its ``--mem`` as far as known here (the
        cluster's own default is not: then nothing is counted)."""
        return cap if cap is not None else (self.table.default_cap or 0)

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        from dispatch.hosts.slurm.run import SlurmRun

        return SlurmRun(self, self.commands(), request, say, extras).run()

    def summary(self, report: Report) -> str:
        """A cluster has no load or slice of its own (``dispatch.hosts.slurm.report``): its nodes."""
        from dispatch.hosts.slurm.view import summary

        return summary(report)

    def describe(self, report: Report) -> list[Block]:
        from dispatch.hosts.slurm.view import describe

        return describe(report)

    def gauges(self, report: Report) -> list[Gauge]:
        from dispatch.hosts.slurm.view import gauges

        return gauges(report)

    def diagnose(self, reading: Any) -> ClusterDiagnosis | None:
        """Can its commands be read, which Slurm answers (``scontrol --version``), how many nodes
        take jobs; problems: none usable, or a ``partition`` the cluster does not have."""
        from dispatch.core.errors import HostrunError
        from dispatch.hosts.slurm import facts as sf

        part = f", partition {self.options.partition}" if self.options.partition else ""
        entry: ClusterDiagnosis = {"host": self.name, "kind": self.kind, "ok": reading.ok,
                                 "partition": self.options.partition, "problems": [],
                                 "title": f"cluster {self.name}{part}", "details": "",
                                 "unread": "could not read"}
        if reading.report is None:
            entry["problems"].append(f"could not read: {reading.error}")
            return entry
        report = reading.report
        try:
            done = self.commands().run(sf.version_command(), timeout=self.settings.report_timeout)
            entry["slurm_version"] = sf.parse_version(done.stdout) if done.returncode == 0 else None
            if done.returncode != 0:
                entry["problems"].append(f"scontrol --version failed: {' '.join(done.stderr.split())}")
        except HostrunError as exc:
            entry["slurm_version"] = None
            entry["problems"].append(str(exc))
        totals = report["totals"]
        entry["cluster"], entry["nodes"], entry["nodes_up"] = (report.get("hostname"), totals["nodes"],
                                                                totals["nodes_up"])
        entry["details"] = (f", Slurm {entry.get('slurm_version') or '?'}, {entry['nodes_up']} of "
                            f"{entry['nodes']} nodes usable")
        partition = self.options.partition
        if partition is not None and partition not in report.get("partitions", []):
            known = ", ".join(report.get("partitions") or []) or "none"
            entry["problems"].append(f"partition {partition} is unknown to the cluster (its "
                                     f"partitions: {known})")
        elif not totals["nodes_up"]:
            states = ", ".join(f"{n['name']} {n['state']}" for n in report["nodes"]) or "no nodes"
            entry["problems"].append(f"no usable node: jobs would wait ({states})")
        return entry


HOST = SlurmHost  # what dispatch.hosts.kinds registers
