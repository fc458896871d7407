"""Which running bookings are agent sessions (``hostrun session``), and which session each job was
started in, for the report (``hostrun report``, ``hostrun top``).

A session's cgroup lies in the sessions slice. A job's holder (the hostrun process that booked it,
the booking's ``pid``) stays in the cgroup of whoever ran it, while only its job's own processes
move to the job's cgroup: so a job started inside a session has its holder in that session's cgroup
(or one below it). One read of ``/proc/PID/cgroup`` per running job, none where no session runs:
the report is read often. Standard library only (a peer's agent builds its report with it).
"""

from __future__ import annotations

import os

from dispatch.core.settings import SESSION_LABEL_PREFIX

MYPY = False
if MYPY:
    from collections.abc import Sequence

    from dispatch.capping.base import CapBackend, JobCgroup
    from dispatch.local.store.ledgerdb import Booking


def is_session(backend: CapBackend, booking: Booking, job: JobCgroup | None) -> bool:
    """Whether a running booking is a session: its checked cgroup (``admission.booking_job``) is in
    the sessions slice, or, before its run named its cgroup, its label is a session's (a job may not
    take one). The cgroup decides where there is one: a row that says otherwise (written by hand, or
    by an older hostrun that let a job take such a label) is not a session."""
    sessions = backend.sessions_dir
    if not sessions:
        return False  # a backend that runs no sessions
    if job is not None:
        return os.path.dirname(os.path.normpath(job.path)) == os.path.normpath(sessions)
    return not booking.cgroup and booking.label.startswith(SESSION_LABEL_PREFIX)


def holder_cgroup(pid: int) -> str | None:
    """``pid``'s cgroup path in the memory hierarchy (cgroup v1's ``memory`` line, else v2's
    ``0::``), as ``/proc/PID/cgroup`` says it; None when it cannot be read (the holder is gone)."""
    from dispatch.capping.cgroupfs import parse_proc_cgroup

    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            found = parse_proc_cgroup(fh.read())
    except (OSError, ValueError):
        return None
    return found.get("memory") or found.get("")


def session_at(path: str, sessions: dict[str, tuple[int, str]]) -> int | None:
    """The id of the session whose cgroup ``path`` is or lies under. ``sessions``: each running
    session's directory name -> (booking id, its directory). ``path`` is relative to the hierarchy's
    root (a cgroup namespace's, maybe), so it matches where the session's directory ends with its
    part up to that name."""
    parts = [p for p in path.split("/") if p]
    for n, part in enumerate(parts):
        found = sessions.get(part)
        if found is not None and found[1].endswith("/" + "/".join(parts[:n + 1])):
            return found[0]
    return None


def ties(backend: CapBackend,
         running: Sequence[tuple[Booking, JobCgroup | None]]) -> tuple[set[int], dict[int, int]]:
    """The ids of the running sessions, and for each running job started inside one of them, that
    session's id."""
    sessions = {b.id for b, job in running if is_session(backend, b, job)}
    places = {os.path.basename(os.path.normpath(job.path)): (b.id, os.path.normpath(job.path))
              for b, job in running if b.id in sessions and job is not None}
    inside: dict[int, int] = {}
    if not places:
        return sessions, inside
    for b, _ in running:
        if b.id in sessions or b.pid <= 0:
            continue
        path = holder_cgroup(b.pid)
        found = None if path is None else session_at(path, places)
        if found is not None:
            inside[b.id] = found
    return sessions, inside
