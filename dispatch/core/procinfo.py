"""Process identity that survives pid reuse: (pid, start time from /proc/PID/stat field 22)."""

from __future__ import annotations


def start_time(pid: int) -> int | None:
    """Field 22 (starttime, clock ticks since boot) of /proc/PID/stat, or None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])  # rest[0] is field 3, so field 22 is rest[19]


def is_alive(pid: int, started: int) -> bool:
    """True while the process that had ``started`` as its start time still holds ``pid``."""
    if pid <= 0:
        return False
    current = start_time(pid)
    if current is None or current != started:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (Ctrl-Z, SIGSTOP: state T) or stopped by a tracer (t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
