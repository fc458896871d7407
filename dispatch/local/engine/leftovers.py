"""What a run that died while it held a running booking leaves behind, cleared by the engine: its
job (a holder's guardian may have died with it: a session's whole cgroup killed takes the holders
and guardians of the jobs the session started, and a job left running would run on unbooked) and
its job cgroup, but only ever that holder's own (``admission.booking_job``: a row naming another's
cgroup gets nothing removed)."""

from __future__ import annotations

import os

from dispatch.core.errors import HostrunError

MYPY = False
if MYPY:
    from dispatch.capping.base import CapBackend
    from dispatch.local.store.ledgerdb import Booking


def end_job(backend: CapBackend, row: Booking) -> None:
    """The job of ``row`` ended and its cgroup removed, as its guardian would; then any empty
    cgroup its holder made."""
    from dispatch.local.admission.rooms import booking_job

    try:
        job = booking_job(backend, row)
        if job is not None:
            job.kill_all()
            job.remove()
    except (OSError, HostrunError):
        pass  # gone already (its guardian was quicker), or not this slice's
    remove_if_empty(backend, row)


def remove_if_empty(backend: CapBackend, row: Booking) -> None:
    """The job cgroup of ``row``'s holder, removed when empty: the one the row names, or, when the
    run died before it could say (its ``cgroup`` is sent without waiting), the one its holder makes
    by name (``create_job("<pid>-<start>")``, or its session's)."""
    from dispatch.local.admission.rooms import booking_job

    rows = [row]
    if not row.cgroup and backend.slice_dir:  # a job's name in the slice, a session's in its own
        holder = f"{row.pid}-{row.pid_start}"
        rows = [row._replace(cgroup=os.path.join(backend.slice_dir, backend.job_name(holder)))]
        if backend.sessions_dir:
            rows.append(row._replace(cgroup=os.path.join(backend.sessions_dir, backend.session_name(holder))))
    for named in rows:
        try:
            job = booking_job(backend, named)
            if job is not None and not job.pids():
                job.remove()
        except (OSError, HostrunError):
            pass  # not empty after all, or already gone
