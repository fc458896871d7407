"""What a session holds on this host, for the SessionStart hook (what a compaction summary loses):
its running and queued hostrun jobs (the ledger's bookings whose ``session`` is it), the workspace
locks it holds (``hostrun lock``), and the work directories it has claimed (``hostrun workdir claim``)
under the project.

Locks have no registry: each lives in its directory. They are found from the holders' side, the
``hostrun lock`` processes this user can see, by the lock file each keeps open
(``/proc/PID/fd``); the record beside it says which session holds it.
"""

from __future__ import annotations

import os
import time

MYPY = False
if MYPY:
    from dispatch.core.settings import Settings

CLAUDE_SESSION_PREFIX = "claude-"
LOCK_NAMES = (".hostrun-lock", "hostrun-lock")  # dispatch.guards.lock: LOCK_NAME, GIT_LOCK_NAME


def claude_session(session_id: object) -> str | None:
    """hostrun's session for a Claude Code session: ``claude-<session_id>`` (None without an id).
    Characters outside ``[A-Za-z0-9._-]`` become ``_`` so the name is safe in a shell line. Here, not
    in ``rewrite``, so that the PostToolUse and Stop hooks need no classifier import."""
    if not isinstance(session_id, str) or not session_id.strip():
        return None
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in session_id)
    return CLAUDE_SESSION_PREFIX + safe[:100]


def _age(since: float | None) -> str:
    from dispatch.core.units import format_duration

    return format_duration(max(0.0, time.time() - since)) if since else "?"


def jobs(settings: Settings, session: str) -> list[str]:
    """This session's bookings in this host's ledger, one line each (none when there is no ledger)."""
    from dispatch.local.admission.ledger import Ledger

    if not os.path.exists(os.path.join(settings.state_dir, "ledger.sqlite3")):
        return []
    from dispatch.core.procinfo import is_alive
    from dispatch.core.units import format_size

    ledger = Ledger(settings.state_dir)
    try:
        bookings = [b for b in ledger.bookings() if b.session == session]
    finally:
        ledger.close()
    lines = []
    for b in bookings:
        if not is_alive(b.pid, b.pid_start):
            continue  # its holder is gone: the next admission reclaims it
        if b.state == "running":
            lines.append(f"- running for {_age(b.since)} on {b.host}: {b.label} (pid {b.pid}, booked "
                         f"{format_size(b.size)}, cap {format_size(b.cap)}): {b.command}")
        else:
            lines.append(f"- queued for {_age(b.queued)} on {b.host}: {b.label} (pid {b.pid}, needs "
                         f"{format_size(b.size)}; {b.reason or 'waiting for room'}): {b.command}")
    return lines


def locks(session: str) -> list[str]:
    """The workspace locks held by ``hostrun lock`` processes of ``session``, one line each."""
    from dispatch.guards.lock import read_record

    found: dict[str, str] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if os.path.basename(target) not in LOCK_NAMES or target in found:
                continue
            holder = read_record(target + ".json")
            if holder is not None and holder.pid == pid and holder.session == session:
                found[target] = f"- holds the lock of {holder.dir} for {_age(holder.since)} " \
                                f"(pid {holder.pid}): {holder.command}"
    return [found[k] for k in sorted(found)]


def workdirs(session: str, root: str) -> list[str]:
    """The work directories under ``root`` claimed for ``session``, one line each."""
    from dispatch.guards.workdirs import find_claimed, read_owner

    try:
        claimed, _ = find_claimed(root)
    except Exception:  # an unreadable tree only means nothing to show
        return []
    lines = []
    for path in claimed:
        owner = read_owner(path)
        if owner is not None and owner.session == session:
            lines.append(f"- claimed {path} {_age(owner.created)} ago: {owner.purpose}")
    return lines
