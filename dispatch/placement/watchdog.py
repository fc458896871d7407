"""``hostrun watch``: follow the alert file and hand each new alert on, for setups without hooks.

One instance per state directory: the watchdog holds an exclusive ``flock`` on ``<state_dir>/watch.pid``
(created 0600, its pid written in it) for as long as it runs; a second one is refused with exit 78
(``NotRunError``: nothing was started), naming the pid that holds it. The lock goes with the process,
so a killed watchdog never leaves a stale one.

Each alert is printed (``describe``, or its JSON) or given to ``--exec CMD``: CMD is split with
``shlex`` and run as an argv (never through a shell unless CMD says ``sh -c ...``) with the alert's
JSON on its stdin, one alert at a time, in order. A CMD that fails or cannot start is one warning line;
the watchdog goes on. SIGTERM and SIGINT end it cleanly (exit 0) once the alert in hand is handed on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from dispatch.core.errors import NotRunError, UsageError
from dispatch.placement import alerts

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence

    from dispatch.core.alertshape import Alert
    from dispatch.core.settings import Settings

PID_FILE = "watch.pid"


def hold_instance_lock(state_dir: str) -> int:
    """The pid file, locked for this process; NotRunError (78) while another watchdog holds it."""
    from dispatch.core.flocking import try_flock
    from dispatch.guards.trust import private_dir

    path = os.path.join(private_dir(state_dir), PID_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise UsageError(f"refusing {path}: not a private file of yours (mode "
                         f"{st.st_mode & 0o7777:04o}); remove it")
    if not try_flock(fd):
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise NotRunError(f"another 'hostrun watch' (pid {holder}) already watches {state_dir}; "
                          "one per state directory")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def parse_exec(text: str | None) -> list[str] | None:
    """``--exec CMD`` as an argv (``shlex.split``): UsageError when empty or not balanced."""
    if text is None:
        return None
    import shlex

    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--exec {text!r}: {exc}") from None
    if not argv:
        raise UsageError("--exec: empty command")
    return argv


def hand_on(item: Alert, argv: Sequence[str], say: Callable[[str], None]) -> None:
    """Run ``argv`` with the alert's JSON on stdin; its failure is one warning line."""
    data = (json.dumps(item, sort_keys=True) + "\n").encode()
    try:
        proc = subprocess.run(list(argv), input=data, check=False)
    except OSError as exc:
        say(f"warning: --exec {argv[0]}: cannot run it: {exc.strerror or exc}")
        return
    if proc.returncode != 0:
        say(f"warning: --exec {argv[0]} exited {proc.returncode} for the {item.get('kind')} alert "
            f"about {item.get('label')}")


def watch(settings: Settings, exec_argv: Sequence[str] | None, session: str | None,
          json_out: bool, say: Callable[[str], None], emit: Callable[[str], None],
          poll: float = 0.2) -> int:
    """Follow ``settings.alerts_path`` from its end until SIGTERM/SIGINT; returns the exit code (0)."""
    lock = hold_instance_lock(settings.state_dir)
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        start = alerts.end_of(settings.alerts_path)  # what is appended after this line is handed on
        say(f"watching {settings.alerts_path}" + (f" for session {session}" if session else ""))
        for item in alerts.follow(settings.alerts_path, poll=poll, stop=lambda: bool(stopping),
                                  offset=start):
            if not alerts.addressed_to(item, session):
                continue
            if exec_argv is not None:
                hand_on(item, exec_argv, say)
            elif json_out:
                emit(json.dumps(item, sort_keys=True))
            else:
                emit(alerts.describe(item))
        return 0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        os.close(lock)
