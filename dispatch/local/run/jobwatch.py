"""A running job, watched until its main process exits: memory sampled, signals forwarded,
``--max-runtime`` enforced, the kernel log (and a ``--gpu-memory`` job's teed output) read, and the
terminal handed to the job and back (job control, as a shell does it).

What ``dispatch.local.run.runner`` does between the job's exec and its verdict, kept apart from the
booking and judging around it. On the path of every ``hostrun -- CMD``: standard library only, and
the types it names are imported for mypy alone.
"""

from __future__ import annotations

import os
import select
import time

from dispatch.local.run.guardian import DEADLINE_MARGIN

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable

    from dispatch.capping.base import JobCgroup
    from dispatch.core.settings import Settings
    from dispatch.local.gpus.kernlog import KernelWatch, OutputTee
    from dispatch.local.run.guardian import Guardian
    from dispatch.local.run.signals import ForwardedSignals
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

SAMPLE_INTERVAL = 0.05
FAST_SAMPLE_INTERVAL = 0.01  # short jobs are over before a 50 ms sample would see them
FAST_SAMPLING_FOR = 1.0
SESSION_SAMPLE_INTERVAL = 0.25  # an agent session's: it lasts hours
MAX_RISES = 4096  # (time, peak) pairs kept for the ramp profile before they are merged in twos


class Foreground:
    """Give the terminal to the job while it runs, so it can read from it and gets Ctrl-C directly.

    The job has its own process group; without this, a job reading the terminal would be stopped by
    SIGTTIN. Only when hostrun itself holds the terminal's foreground.
    """

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.fd = -1
        self._old_ttou: object = None

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def __enter__(self) -> Foreground:
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                # In the background we must still print (status lines) and take the terminal back,
                # even under ``stty tostop``.
                self._old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(0, self.pgid)
                self.fd = 0
        except OSError:
            self.fd = -1
        return self

    def follow_stop(self, pid: int) -> int | None:
        """Job control, as a shell does it: when the job is stopped (Ctrl-Z), take the terminal
        back and stop hostrun too, so the user's shell regains it; on ``fg`` (SIGCONT) hand the
        terminal to the job again and continue it. Returns the wait status if the job has exited."""
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:
            return None
        if reaped == 0:
            return None
        if not os.WIFSTOPPED(status):
            return status
        os.tcsetpgrp(self.fd, os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once our shell continues us
        try:
            os.tcsetpgrp(self.fd, self.pgid)
        except OSError:
            pass
        signal_group(self.pgid, signal.SIGCONT)
        return None

    def __exit__(self, *exc: object) -> None:
        if self.fd < 0:
            return
        try:
            os.tcsetpgrp(self.fd, os.getpgrp())
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, self._old_ttou)  # type: ignore[arg-type]


class JobWatch:
    """The wait for one job's main process. An object so that the loop's state (when the job is to
    be killed, whether its max runtime passed, the peak so far) is named once and each thing the
    loop reacts to (a sample, a forwarded signal, the deadline) is a method of its own.

    With ``watch``, the kernel log is scanned each sample and a ``--gpu-memory`` job's teed output
    is forwarded as it comes.
    """

    def __init__(
        self, settings: Settings, job: JobCgroup, pid: int, max_runtime: float | None,
        signals: ForwardedSignals, say: Callable[[str], None], foreground: Foreground | None = None,
        watch: KernelWatch | None = None, guardian: Guardian | None = None, whole: bool = False,
    ) -> None:
        """``whole``: an agent session, ended whole once the kernel killed one of its processes at
        its own cap (cgroup v2 and systemd do so themselves, ``memory.oom.group``; v1 kills only the
        largest process, and an agent left without the tool it ran goes on unbooked for it), and
        sampled less often: it runs for hours."""
        self.settings, self.job, self.pid, self.max_runtime = settings, job, pid, max_runtime
        self.signals, self.say, self.foreground, self.watch = signals, say, foreground, watch
        self.guardian = guardian
        self.whole = whole
        self.deadline: float | None = None
        self.kill_at: float | None = None
        self.timed_out = False
        self.peak = 0
        self.rises: list[tuple[float, int]] = []  # (seconds since start, new peak): the ramp profile

    def _rose(self, at: float, used: int) -> None:
        """Keep a new running maximum. Past ``MAX_RISES`` pairs are merged, each at its earlier time
        with its later (higher) value: the profile may then show growth early, never late."""
        self.peak = used
        self.rises.append((at, used))
        if len(self.rises) > MAX_RISES:
            self.rises = [(self.rises[i][0], self.rises[min(i + 1, len(self.rises) - 1)][1])
                          for i in range(0, len(self.rises), 2)]

    def wait(self) -> tuple[int, int, bool]:
        """(raw wait status, peak bytes sampled, whether max runtime stopped it)."""
        pidfd = os.pidfd_open(self.pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        tee = self.watch.tee if self.watch is not None else None
        if tee is not None:
            tee.register(poller)
        begun = time.monotonic()
        if self.max_runtime is not None:
            self.deadline = begun + self.max_runtime
            if self.guardian is not None:  # kept even while this process is stopped
                self.guardian.deadline(self.deadline, self.settings.kill_grace)
        try:
            status = self._loop(poller, pidfd, tee, begun)
            if status is None:
                _, status = os.waitpid(self.pid, 0)
        finally:
            os.close(pidfd)
        if (self.deadline is not None and not self.timed_out and self.guardian is not None
                and time.monotonic() >= self.deadline + DEADLINE_MARGIN):
            self.timed_out = True  # it ended while this process was stopped: the guardian stopped it
            self.say(self._stopped_by_guardian())
        return status, self.peak, self.timed_out

    def _loop(self, poller: select.poll, pidfd: int, tee: OutputTee | None, begun: float) -> int | None:
        """Poll until the main process exits: None, for the caller to reap it; its wait status when
        checking for a stop reaped it."""
        last = begun
        while True:
            interval = FAST_SAMPLE_INTERVAL if last - begun < FAST_SAMPLING_FOR else SAMPLE_INTERVAL
            if self.whole:
                interval = SESSION_SAMPLE_INTERVAL
            events = poller.poll(max(0.0, last + interval - time.monotonic()) * 1000)
            if events:
                if any(fd == pidfd for fd, _ in events):
                    return None
                for fd, mask in events:
                    if tee is not None:
                        tee.handle(poller, fd, mask)
                if time.monotonic() - last < interval:
                    continue  # only output to forward: not yet time to sample
            last = time.monotonic()
            if self.foreground is not None and self.foreground.active:
                status = self.foreground.follow_stop(self.pid)
                if status is not None:
                    return status  # reaped while checking for a stop: it has exited
            used = self.job.sample()
            if used > self.peak:
                self._rose(last - begun, used)
            if self.watch is not None:
                self.watch.tick()
            now = time.monotonic()
            if self.signals.pending:
                self._forward(self.signals.pending.pop(0), now)
            if self.deadline is not None and now >= self.deadline and not self.timed_out:
                self._stop_at_deadline(now, self.deadline)
            if self.kill_at is not None and now >= self.kill_at:
                self.job.kill_all()
                self.kill_at = now + 3600
            if self.whole and self.kill_at is None and self.job.oom_evidence().own:
                self.job.kill_all()  # killed at its own cap: the whole session ends (250)
                self.kill_at = now + 3600

    def _forward(self, sig: int, now: float) -> None:
        """A signal to hostrun: to the job's process group, the whole cgroup killed ``kill_grace``
        later; a second one kills at once."""
        if self.kill_at is not None:
            self.job.kill_all()
        else:
            signal_group(self.pid, sig)
            self.kill_at = now + self.settings.kill_grace

    def _stop_at_deadline(self, now: float, deadline: float) -> None:
        self.timed_out = True
        if now >= deadline + DEADLINE_MARGIN and self.guardian is not None:
            # This process was not running at the deadline (stopped): the guardian kept it.
            self.say(self._stopped_by_guardian())
        else:
            if self.guardian is not None:
                self.guardian.stopping()
            self.say(f"max runtime reached; stopping the job (SIGTERM, SIGKILL after "
                     f"{self.settings.kill_grace:g} s)")
            signal_group(self.pid, signal.SIGTERM)
            self.job.signal_all(signal.SIGTERM)
        self.kill_at = now + self.settings.kill_grace

    def _stopped_by_guardian(self) -> str:
        return (f"max runtime ({self.max_runtime:g} s) passed while hostrun was stopped; its guardian "
                "stopped the job")


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
