"""A tiny forked watcher that stops the job if hostrun itself dies, even by SIGKILL.

hostrun keeps the write end of a pipe; the guardian blocks reading the other end. A clean finish
writes one byte; hostrun's death (any signal) closes the pipe, the read returns EOF, and the guardian
kills every process in the job's cgroup (setsid children included), removes the cgroup and releases
the booking. It runs in its own session, outside the job's cgroup, so killing hostrun's process group
or the job's cgroup does not take it down with them.
"""

from __future__ import annotations

import os
import signal

from dispatch.capping.base import JobCgroup


class Guardian:
    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._write_fd = write_fd

    @classmethod
    def start(cls, state_dir: str, booking_id: int, job: JobCgroup) -> Guardian:
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
                if not os.read(read_fd, 1):
                    _clean_up(state_dir, booking_id, job)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(read_fd)
        return cls(pid, write_fd)

    def dismiss(self) -> None:
        """hostrun finished its own clean-up: let the guardian exit without touching anything."""
        try:
            os.write(self._write_fd, b"x")
        except OSError:
            pass
        os.close(self._write_fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _clean_up(state_dir: str, booking_id: int, job: JobCgroup) -> None:
    from dispatch.ledger import Ledger

    job.kill_all()
    try:
        job.remove()
    except OSError:
        pass
    ledger = Ledger(state_dir)
    ledger.release(booking_id)
    ledger.close()
