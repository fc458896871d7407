"""Process identity that survives pid reuse: (pid, start time from /proc/PID/stat field 22)."""

from __future__ import annotations

import errno
import os

_GONE = (errno.ENOENT, errno.ESRCH)


class CannotTell(OSError):
    """/proc/PID/stat could not be read for a reason other than the pid being gone (EMFILE, EACCES…).

    Not proof of death: callers that reclaim or kill on "gone" must treat this as alive."""


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3 onwards of /proc/PID/stat (``[0]`` is the state), or None if the pid is gone.

    Only ENOENT/ESRCH mean gone; any other error raises CannotTell, so that an fd limit or a
    permission error never reads a live holder as dead.

    One unbuffered read: every admission try reads this for each booking on the host (is its holder
    alive, is a waiter stopped), so with a long queue it is most of the try's CPU."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)  # one line of ~52 numbers and a comm of at most 64 bytes
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise CannotTell(e.errno, f"cannot read /proc/{pid}/stat: {e.strerror}") from e
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    end = data.rfind(b")")
    return data[end + 2 :].split() if end >= 0 else None


def start_time(pid: int) -> int | None:
    """Field 22 (starttime, clock ticks since boot) of /proc/PID/stat, or None if the pid is gone.

    Raises CannotTell when it cannot be read: recording 0 would later read the live pid as dead."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # fields[0] is field 3: 22 is [19]


def is_alive(pid: int, started: int) -> bool:
    """True while the process that had ``started`` as its start time still holds ``pid``.

    True also when /proc cannot be read (CannotTell): "cannot tell" must never reclaim or kill."""
    if pid <= 0:
        return False
    try:
        fields = _stat_fields(pid)
    except CannotTell:
        return True
    if fields is None or int(fields[19]) != started:
        return False
    return fields[0] != b"Z"


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (Ctrl-Z, SIGSTOP: state T) or stopped by a tracer (t).

    False when it cannot be read: a stopped waiter's booking is released, so "cannot tell" keeps it."""
    try:
        fields = _stat_fields(pid)
    except CannotTell:
        return False
    return fields is not None and bool(fields) and fields[0] in (b"T", b"t")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def parent_of(pid: int) -> int | None:
    """Field 4 (ppid) of /proc/PID/stat, or None if it cannot be read."""
    try:
        fields = _stat_fields(pid)
    except CannotTell:
        return None
    return int(fields[1]) if fields is not None and len(fields) > 1 else None
