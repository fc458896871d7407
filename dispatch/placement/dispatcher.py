"""Where a job fits (docs/design.md, "Placement: the dispatcher"): a pure decision over the hosts' reports.

Rules, in order:
0. a job recorded or declared longer than ``long_job_threshold`` that would use one host → refuse
   (244), unless it declares itself long with all three answers of ``dispatch.guards.longjob`` (sharded,
   resumable, multi-host), by ``--long-job`` or ``# long-job:`` header lines;
1. hosts: this machine (``local``) always; the others (peers) only when ``enable_across_machines``
   is on;
2. a host fits when its slice's free room, less queued jobs and less pending bookings younger than
   ``pending_window``, covers the job's booking there (at the cap it would run under there,
   ``Host.job_cap``); the host's kind may refuse the cap (``Host.cap_problem``: a peer's
   ``peer_memory_cap``); with ``--gpu-memory``, one of its GPUs must have that much free, less the
   VRAM pending on it;
3. prefer this machine when it fits; else a peer that fits; else queue here (or on the one host
   whose slice could ever hold the job). The decision carries its reasons.
"""

from __future__ import annotations

from dispatch.core.exitcodes import ExitCode
from dispatch.core.records import NamedTuple
from dispatch.core.settings import Settings
from dispatch.hosts.base import Host
from dispatch.hosts.judgement import HostPending
from dispatch.hosts.judgement import Job as Job
from dispatch.hosts.judgement import Judgement as Judgement
from dispatch.hosts.kinds import hosts_of
from dispatch.local.store.ledgerdb import PeakRecord
from dispatch.placement.longrule import long_job_rule
from dispatch.placement.reports import HostReading

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.reportshape import Report


RUN, QUEUE, REFUSE = "run", "queue", "refuse"


class Decision(NamedTuple):
    verdict: str  # RUN it now on ``host``, QUEUE it on ``host`` (it waits there), REFUSE it
    host: Optional[str]  # the host's name (None when refused)
    exit_code: int  # what --auto exits with when it cannot run the job (0 when it can)
    reasons: list[str]
    judgements: list[Judgement]
    here: bool = False  # ``host`` is this machine

    @property
    def action(self) -> str:
        """What ``hostrun dispatch`` says (``--json`` too): "local" (run here now), "queue" (wait
        here), "peer" (send it there: it runs, or waits in that host's queue), "refuse"."""
        if self.verdict == REFUSE:
            return "refuse"
        if not self.here:
            return "peer"
        return "local" if self.verdict == RUN else "queue"

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "host": self.host, "exit_code": self.exit_code,
                "reasons": self.reasons, "judgements": [j._asdict() for j in self.judgements]}


def _peak(report: Report) -> PeakRecord | None:
    record = report.get("label_peak")
    return PeakRecord(**record) if record else None


def judge(host: Host, job: Job, reading: HostReading, waiting: HostPending | None = None
          ) -> Judgement:
    """Whether ``job`` fits on ``host`` now (and could ever), from its ``reading`` and the bookings
    still ``waiting`` to show there."""
    if reading.report is None:
        return Judgement(reading.host, False, False, None, None, f"could not read: {reading.error}")
    return host.judge(job, reading.report, waiting)


def decide(settings: Settings, job: Job, readings: list[HostReading],
           pending: dict[str, HostPending]) -> Decision:
    reasons, refused = long_job_rule(
        settings, job, [(_peak(r.report), r.host) for r in readings if r.report is not None])
    if refused:
        return Decision(REFUSE, None, ExitCode.LONG_SINGLE_HOST, reasons, [])
    hosts = {h.name: h for h in hosts_of(settings)}
    across = settings.enable_across_machines
    considered = [r for r in readings if hosts[r.host].is_here or across]
    if not across and any(not h.is_here for h in hosts.values()):
        reasons.append("peers not considered: enable_across_machines is off")
    judgements = [judge(hosts[r.host], job, r, pending.get(r.host)) for r in considered]
    here = next((j for j in judgements if hosts[j.host].is_here), None)
    elsewhere = [j for j in judgements if not hosts[j.host].is_here]
    if here is not None and here.fits:
        return Decision(RUN, here.host, 0, [*reasons, f"{here.host} {here.reason}"], judgements, True)
    for j in elsewhere:
        if j.fits:
            return Decision(RUN, j.host, 0, [*reasons, f"local does not fit; {j.host} {j.reason}"],
                            judgements)
    if here is not None and here.could_ever_fit:
        return Decision(QUEUE, here.host, 0, [*reasons, "no host fits now: wait in the local queue"],
                        judgements, True)
    for j in elsewhere:
        if j.could_ever_fit:
            return Decision(QUEUE, j.host, 0, [*reasons, f"only {j.host} could ever hold it: "
                                               f"wait in its queue"], judgements)
    # 243 when this machine's slice is too small for it (docs/exit-codes.md), else 78.
    code = ExitCode.NEVER_FITS if here is not None and here.too_big else ExitCode.NOT_RUN
    return Decision(REFUSE, None, code, [*reasons, "no host could ever run it"], judgements)
