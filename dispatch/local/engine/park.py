"""A waiting run parked: its process becomes a bare interpreter holding its engine connection,
until its turn is near.

Why: a waiting run holds what it has imported. A swarm of 1,000 waiting runs held 5.8 MiB PSS each
(bench/bench_swarm.py), the interpreter with hostrun's command line, settings and engine client;
parked, a waiting run is a ``python3 -I -S`` running ``parked.py``, which imports nothing and blocks
in a read.

How: when a run has waited ``HOSTRUN_PARK_AFTER`` seconds (``PARK_AFTER``) and the admission engine
last said it is not near the head of the queue (``holdings.NEAR`` waiters), the run tells the engine
(``park``; declined when its turn is near by then) and execs ``parked.py`` with its connection's
descriptor. A short wait stays whole: a burst whose runs start within seconds would otherwise start
an interpreter twice more for each run far back in it. The parked process prints the engine's
waiting lines. When the engine says its turn is near (``soon``) or that it is admitted, when the
engine has gone, when a signal ends the wait, or when the long-wait alert is due, it execs the run's
own command line again (``sys.orig_argv``) with ``HOSTRUN_RESUME`` naming the descriptor, the
booking, when the wait began and why it resumed; the run then carries on from there
(``enginebook.resume``). The pid, the connection and so the booking (which is the connection's)
stay the same throughout: nothing is released, the place in the queue is kept, and a parked run
killed with SIGKILL is released by its connection as any.

``HOSTRUN_PARK=0`` keeps a waiting run whole.
"""

from __future__ import annotations

import os
import sys

from dispatch.core.exitcodes import ExitCode

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable, Mapping
    from typing import Any
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

RESUME_ENV = "HOSTRUN_RESUME"  # "FD BOOKING STARTED WHY", set by the parked process for the run
PARK_ENV = "HOSTRUN_PARK"  # "0": a waiting run is never parked
PARK_AFTER = 3.0  # seconds a run waits far from its turn before it parks
PARK_AFTER_ENV = "HOSTRUN_PARK_AFTER"  # another PARK_AFTER (seconds, 0 or more; tests: 0)
# The signals that end a wait (as in the run: enginebook.WAIT_SIGNALS and SIGINT).
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

def park_after(environ: Mapping[str, str] | None = None) -> float:
    """Seconds a run waits far from its turn before it parks: ``HOSTRUN_PARK_AFTER``, else
    ``PARK_AFTER`` (also for a value that is not a number of seconds, 0 or more)."""
    text = (os.environ if environ is None else environ).get(PARK_AFTER_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return PARK_AFTER
    return value if 0 <= value < 1e9 else PARK_AFTER


def allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a waiting run may park here: not with ``HOSTRUN_PARK=0``, and only where the
    interpreter knows its own command line (Python 3.10+: ``sys.orig_argv``)."""
    env = os.environ if environ is None else environ
    return env.get(PARK_ENV, "") != "0" and bool(getattr(sys, "orig_argv", None))


class Resume:
    """What the parked process handed on (``HOSTRUN_RESUME``): the connection's descriptor, the
    booking, when the wait began (``time.monotonic``: one clock across exec) and why it resumed:
    ``soon``, ``admitted``, ``alert``, ``gone`` (the engine's connection ended) or ``signal:N``."""

    __slots__ = ("booking_id", "fd", "started", "why")

    def __init__(self, fd: int, booking_id: int, started: float, why: str) -> None:
        self.fd, self.booking_id, self.started, self.why = fd, booking_id, started, why

    @property
    def signum(self) -> int | None:
        return int(self.why.split(":", 1)[1]) if self.why.startswith("signal:") else None


def take_resume() -> Resume | None:
    """The run resumed by its parked process, if this is one: ``HOSTRUN_RESUME`` read and removed
    (the job, and a hostrun nested in it, never see it). A value that does not name an open
    socket of this process is ignored: the run books anew."""
    value = os.environ.pop(RESUME_ENV, None)
    if value is None:
        return None
    try:
        fd_text, booking_text, started_text, why = value.split(" ", 3)
        resume = Resume(int(fd_text), int(booking_text), float(started_text), why)
        import stat

        if resume.fd < 3 or not stat.S_ISSOCK(os.fstat(resume.fd).st_mode) or resume.booking_id <= 0:
            return None
        if resume.why.startswith("signal:"):
            resume.signum  # noqa: B018 (a number, or ValueError)
    except (ValueError, OSError):
        return None
    return resume


def park(sock_fd: int, booking_id: int, started: float, alert_in: float | None) -> None:
    """Exec the parked process (never returns but by an OSError). ``alert_in``: seconds until the
    long-wait alert is due (it resumes then), None when none will be."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if not argv:
        raise OSError("the interpreter does not know its command line")
    os.set_inheritable(sock_fd, True)
    alarm = 0 if alert_in is None else max(1, int(alert_in + 0.999))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parked.py")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING)  # until the parked process has its handlers
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", script, str(sock_fd), repr(started),
                                  str(alarm), str(booking_id), str(int(ExitCode.NOT_RUN)),
                                  sys.executable, *argv])
    finally:  # only when exec failed
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.set_inheritable(sock_fd, False)


def parker(link: Any, started: float, alert_in: Callable[[], float | None]) -> Callable[[], bool]:
    """``Link.wait``'s ``park``: ask the engine to mark the booking parked, then exec. Returns False
    when the run is not to park after all: admitted, or near, while it asked (the engine declines
    it, or that message is put back for the wait to read), or the exec failed."""

    def go() -> bool:
        booking_id = link.booking_id
        if booking_id is None or link.sock is None:
            return False
        try:
            if not link.park_request(booking_id):  # near by now, or admitted: carry on whole
                return False
        except (ConnectionError, OSError):
            return False
        try:
            park(link.sock.fileno(), booking_id, started, alert_in())
        except OSError:
            return False
        return False  # unreachable: exec replaced the process

    return go
