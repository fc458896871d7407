"""A tiny forked watcher that stops the job if hostrun itself dies, even by SIGKILL.

hostrun keeps the write end of a pipe; the guardian blocks reading the other end. hostrun tells it the
job's pid, and one byte ``x`` when it has cleaned up itself. hostrun's death (any signal) closes the
pipe instead: the read returns EOF, and the guardian kills every process in the job's cgroup (setsid
children included) and removes the cgroup (the booking ended with hostrun's connection to the
admission engine). It runs in its
own session, outside the job's cgroup, so neither killing hostrun's process group nor killing the
job's cgroup takes it down.
"""

from __future__ import annotations

import os

from dispatch.capping.base import JobCgroup

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal


class Watcher:
    """The hostrun side of a forked watcher: a pipe to tell it things, ``x`` to dismiss it."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._write_fd = write_fd

    @staticmethod
    def fork(keep: list[int], act: Callable[[list[bytes]], None],
             on_deadline: Callable[[int, list[bytes]], None] | None = None) -> tuple[int, int]:
        """Fork the watcher (its pid and the pipe's write end, for the constructor): in its own
        session, signals ignored, stdio on /dev/null, holding nothing of hostrun's but the pipe and
        ``keep``; when hostrun dies it calls ``act`` with the lines hostrun told it (hostrun's
        ``dismiss`` ends it without acting). ``on_deadline(stage, lines)``: called at a deadline
        hostrun told it (``D<at> <grace>``, stage 1) and ``grace`` seconds later (stage 2), unless
        hostrun said it is stopping the job itself (``T``)."""
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
                lines = _until_hostrun_ends(read_fd, on_deadline)
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


DEADLINE_MARGIN = 2.0  # the guardian keeps a max runtime this long after hostrun would have


class Guardian(Watcher):
    @classmethod
    def start(cls, state_dir: str, job: JobCgroup) -> Guardian:
        return cls(*cls.fork(job.held_fds(), lambda lines: _clean_up(lines, state_dir, job),
                             lambda stage, lines: _deadline(stage, lines, job)))

    def deadline(self, at: float, grace: float) -> None:
        """``--max-runtime``: the monotonic time the job must stop by. hostrun stops it then; should
        hostrun not run then (stopped), the guardian does, ``DEADLINE_MARGIN`` later."""
        self.tell(f"D{at + DEADLINE_MARGIN} {grace}")

    def stopping(self) -> None:
        """hostrun is stopping the job for its max runtime itself: the guardian stands down."""
        self.tell("T")

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


def _until_hostrun_ends(read_fd: int, on_deadline: Callable[[int, list[bytes]], None] | None = None
                        ) -> list[bytes] | None:  # pragma: no cover - child
    """The lines hostrun sent, once its end closes the pipe; None when it dismissed the watcher.
    Meanwhile, a deadline hostrun told (``D<monotonic at> <grace>``) is kept even while hostrun
    itself cannot run (stopped by Ctrl-Z or SIGSTOP: this process is in a session of its own)."""
    import select
    import time

    pending = b""
    stage_at: float | None = None  # when the next deadline stage is due
    stage, grace = 0, 0.0
    while True:
        timeout = None if stage_at is None else max(0.0, stage_at - time.monotonic())
        ready, _, _ = select.select([read_fd], [], [], timeout)
        if not ready:  # the deadline (or its grace) passed and hostrun did not say it acted
            stage += 1
            lines = [line for line in pending.split(b"\n") if line]
            if on_deadline is not None:
                on_deadline(stage, lines)
            stage_at = time.monotonic() + grace if stage == 1 else None
            continue
        data = os.read(read_fd, 64)
        if not data:
            return [line for line in pending.split(b"\n") if line]
        pending += data
        if b"x" in pending:
            return None
        for line in pending.split(b"\n")[:-1]:
            if line.startswith(b"D") and stage == 0:
                at, _, rest = line[1:].partition(b" ")
                stage_at, grace = float(at), float(rest or 10)
            elif line == b"T":  # hostrun stops the job itself: stand down
                stage_at = None


def _clean_up(lines: list[bytes], state_dir: str, job: JobCgroup) -> None:  # pragma: no cover - child
    """hostrun is gone: kill every process in the job's cgroup and remove it (its booking ended with
    hostrun's connection to the admission engine)."""
    for line in lines:
        if line.startswith(b"P"):
            job.started(int(line[1:]))
    job.kill_all()
    try:
        job.remove()
    except OSError:
        pass


def _deadline(stage: int, lines: list[bytes], job: JobCgroup) -> None:  # pragma: no cover - child
    """The job's max runtime passed while hostrun could not act: SIGTERM to the job's process group
    and cgroup (stage 1), then kill the cgroup (stage 2). hostrun, once it runs again, sees the time
    and says 253."""
    pid = next((int(line[1:]) for line in lines if line.startswith(b"P")), 0)
    if stage == 1:
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
        job.signal_all(signal.SIGTERM)
    else:
        job.kill_all()
