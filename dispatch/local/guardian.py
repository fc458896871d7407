"""A tiny forked watcher that stops the job if hostrun itself dies, even by SIGKILL.

hostrun keeps the write end of a pipe; the guardian blocks reading the other end. hostrun tells it the
booking id once it has one, and one byte ``x`` when it has cleaned up itself. hostrun's death (any
signal) closes the pipe instead: the read returns EOF, and the guardian kills every process in the
job's cgroup (setsid children included), removes the cgroup and releases the booking. It runs in its
own session, outside the job's cgroup, so neither killing hostrun's process group nor killing the
job's cgroup takes it down.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from dispatch.capping.base import JobCgroup


class Watcher:
    """The hostrun side of a forked watcher: a pipe to tell it things, ``x`` to dismiss it."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._write_fd = write_fd

    @staticmethod
    def fork(keep: list[int], act: Callable[[list[bytes]], None]) -> tuple[int, int]:
        """Fork the watcher (its pid and the pipe's write end, for the constructor): in its own
        session, signals ignored, stdio on /dev/null, holding nothing of hostrun's but the pipe and
        ``keep``; when hostrun dies it calls ``act`` with the lines hostrun told it (hostrun's
        ``dismiss`` ends it without acting)."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child; tested end to end
            status = 0
            try:
                os.close(write_fd)
                os.setsid()
                for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
                    signal.signal(sig, signal.SIG_IGN)
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                # Hold nothing of hostrun's but its pipe and the job's own descriptors: a copy of, say,
                # the write end of the pipe that feeds the job's stdin (the peer agent's --stdin)
                # would keep the job from ever seeing EOF, for as long as the guardian lives.
                _close_all_but([read_fd, *keep])
                lines = _until_hostrun_ends(read_fd)
                if lines is not None:
                    act(lines)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(read_fd)
        return pid, write_fd

    def tell(self, line: str) -> None:
        os.write(self._write_fd, line.encode() + b"\n")

    def dismiss(self) -> None:
        """hostrun finished its own clean-up: let the watcher exit without touching anything."""
        try:
            os.write(self._write_fd, b"x")
        except OSError:
            pass
        os.close(self._write_fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class Guardian(Watcher):
    @classmethod
    def start(cls, state_dir: str, job: JobCgroup) -> Guardian:
        return cls(*cls.fork(job.held_fds(), lambda lines: _clean_up(lines, state_dir, job)))

    def booked(self, booking_id: int) -> None:
        self.tell(f"B{booking_id}")

    def job_started(self, pid: int) -> None:
        """Backends that track the job by its process (no cgroup) need the pid to stop it."""
        self.tell(f"P{pid}")


def _close_all_but(keep: list[int]) -> None:  # pragma: no cover - child
    """Close every descriptor from 3 up except those in ``keep``."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))


def _until_hostrun_ends(read_fd: int) -> list[bytes] | None:  # pragma: no cover - child
    """The lines hostrun sent, once its end closes the pipe; None when it dismissed the watcher."""
    pending = b""
    while True:
        data = os.read(read_fd, 64)
        if not data:
            return [line for line in pending.split(b"\n") if line]
        pending += data
        if b"x" in pending:
            return None


def _clean_up(lines: list[bytes], state_dir: str, job: JobCgroup) -> None:  # pragma: no cover - child
    """hostrun is gone: kill every process in the job's cgroup, remove it, release the booking."""
    booking_id = None
    for line in lines:
        if line.startswith(b"B"):
            booking_id = int(line[1:])
        elif line.startswith(b"P"):
            job.started(int(line[1:]))
    job.kill_all()
    try:
        job.remove()
    except OSError:
        pass
    if booking_id is not None:
        from dispatch.local.ledger import Ledger

        ledger = Ledger(state_dir)
        ledger.release(booking_id)
        ledger.close()
