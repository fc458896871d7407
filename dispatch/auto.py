"""``hostrun dispatch`` and ``hostrun --auto``: read the hosts, decide, and (for --auto) act.

hostrun never moves a job by itself between machines on a guess: the decision is computed from
reports read now, printed with its reasons, and a peer decision is recorded as a pending booking so a
second dispatch a second later sees that room as taken.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from dispatch.booking import default_label
from dispatch.dispatcher import Decision, Job, decide
from dispatch.headers import read_headers
from dispatch.pending import Pending
from dispatch.reports import read_reports
from dispatch.settings import LOCAL, Settings


def make_job(argv: Sequence[str], *, label: str | None, cap: int | None, gpu_memory: int | None,
             expect_duration: float | None, long_job: bool) -> Job:
    declared_long = long_job or any(key == "long-job" for key, _ in read_headers(argv))
    return Job(label=label or default_label(argv), cap=cap, gpu_memory=gpu_memory,
               expect_duration=expect_duration, long_job=declared_long)


def consider(settings: Settings, job: Job) -> Decision:
    """Read local (and, when enabled, the peers) within the deadlines, then decide."""
    names = [LOCAL] + ([n for n in settings.hosts if n != LOCAL] if settings.enable_across_machines else [])
    readings = read_reports(settings, names, job.label)
    pending = Pending(settings.state_dir)
    try:
        active = pending.active(settings.pending_window)
    finally:
        pending.close()
    return decide(settings, job, readings, active)


def note_sent(settings: Settings, decision: Decision, job: Job) -> None:
    """Record a pending booking for a job sent to a peer."""
    need = next((j.need for j in decision.judgements if j.host == decision.host), None)
    if decision.host is None or need is None:
        return
    pending = Pending(settings.state_dir)
    try:
        pending.add(decision.host, job.label, need)
    finally:
        pending.close()


def peer_command(options: Sequence[str], host: str, command: Sequence[str]) -> str:
    """The exact command that runs the same job on ``host``."""
    kept = [o for o in options if o != "--auto"]
    return shlex.join(["hostrun", *kept, f"--peer={host}", "--", *command])
