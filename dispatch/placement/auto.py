"""``hostrun dispatch`` and ``hostrun --auto``: read the hosts, decide, and (for --auto) act.

hostrun never moves a job by itself between machines on a guess: the decision is computed from
reports read now, printed with its reasons, and every run sent to a host (``--auto``, ``--peer``) is
recorded as a pending booking so a second dispatch a second later sees that room as taken.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Sequence

from dispatch.core.settings import Settings
from dispatch.core.units import format_size
from dispatch.hosts.judgement import HostPending
from dispatch.hosts.kinds import host_for, hosts_of
from dispatch.placement import alerts
from dispatch.placement.dispatcher import Decision, Job, Judgement, decide, judge
from dispatch.placement.pending import Pending
from dispatch.placement.reports import HostReading, read_reports
from dispatch.placement.sent import Placement as Placement
from dispatch.placement.sent import forget_sent as forget_sent
from dispatch.placement.sent import note_sent
from dispatch.placement.sent import place_on_peer as place_on_peer

MYPY = False
if MYPY:
    from typing import Any


def consider(settings: Settings, job: Job) -> Decision:
    """Read this machine (and, when enabled, the peers) within the deadlines, then decide."""
    hosts = hosts_of(settings)
    names = [h.name for h in hosts if h.is_here] + (
        [h.name for h in hosts if not h.is_here] if settings.enable_across_machines else [])
    readings = read_reports(settings, names, job.label)
    return decide(settings, job, readings, pending_after(settings, readings))


def place(settings: Settings, job: Job) -> Placement:
    """``--auto``: the dispatcher's decision (``consider``) as a place to run, noted as pending until
    its booking shows or the run ends."""
    decision = consider(settings, job)
    reasons = tuple(decision.reasons)
    if decision.host is None:
        return Placement(refused=decision.exit_code, reasons=reasons)
    note = note_decision(settings, decision, job)
    return Placement(host=host_for(settings, decision.host), note=note, reasons=reasons)


def pending_after(settings: Settings, readings: Sequence[HostReading]) -> dict[str, HostPending]:
    """The pending bookings still to count: not older than ``pending_window``, and not already shown
    as a booking in the reports just read."""
    pending = Pending(settings.state_dir)
    try:
        pending.settle((r.host, r.report) for r in readings)
        return pending.active(settings.pending_window)
    finally:
        pending.close()


def note_decision(settings: Settings, decision: Decision, job: Job) -> int | None:
    """``note_sent`` for the host a decision chose, with the booking and GPU it judged there."""
    judged = next((j for j in decision.judgements if j.host == decision.host), None)
    if decision.host is None or judged is None or judged.need is None:
        return None
    return note_sent(settings, decision.host, job.label, judged.need, job.gpu_memory,
                     judged.gpu_index)


def peer_command(options: Sequence[str], host: str, command: Sequence[str]) -> str:
    """The exact command that runs the same job on ``host``."""
    kept = [o for o in options if o != "--auto"]
    return shlex.join(["hostrun", *kept, f"--peer={host}", "--", *command])


class PeerWatch:
    """While a job waits here: if a peer's report shows it could take the job now, raise one alert.

    Reads the peers in a background thread (ssh must not stall the wait loop), at most one reading at
    a time, and alerts once per wait. hostrun never moves the job itself: the alert and the printed
    line give the exact command, and the main session decides.
    """

    def __init__(self, settings: Settings, job: Job, options: Sequence[str], command: Sequence[str],
                 say: Callable[[str], None], session: str | None = None) -> None:
        self.settings = settings
        self.session = session  # the waiting job's: the alert is addressed to it
        self.job = job
        self.options = list(options)
        self.command = list(command)
        self.say = say
        self.alerted = False
        self._busy = threading.Lock()

    @property
    def peers(self) -> list[str]:
        """The hosts that could take the job instead of this machine."""
        if not self.settings.enable_across_machines:
            return []
        return [h.name for h in hosts_of(self.settings) if not h.is_here]

    def __call__(self, adm: Any) -> None:
        if self.alerted or not self.peers or not self._busy.acquire(blocking=False):
            return
        threading.Thread(target=self._check, daemon=True).start()

    def _check(self) -> None:
        try:
            readings = read_reports(self.settings, self.peers, self.job.label)
            active = pending_after(self.settings, readings)
            for reading in readings:
                verdict = judge(host_for(self.settings, reading.host), self.job, reading,
                                active.get(reading.host))
                if verdict.fits and not self.alerted:
                    self.alerted = True
                    self._alert(reading.host, verdict)
                    return
        finally:
            self._busy.release()

    def _alert(self, host: str, verdict: Judgement) -> None:
        move = peer_command(self.options, host, self.command)
        message = (f"job {self.job.label} waits on local; {host} could take it now "
                   f"(free {format_size(verdict.free)}, need {format_size(verdict.need)}): {move}")
        self.say(f"alert: {message}")
        alerts.write(self.settings.alerts_path, alerts.record(
            alerts.PEER_COULD_TAKE, host=self.settings.local.name, label=self.job.label, session=self.session,
            command=shlex.join(self.command), action=move, message=message, peer=host,
            waiting_on=self.settings.local.name, free=verdict.free, need=verdict.need,
        ), self.say)
