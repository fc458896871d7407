"""A ``hostrun`` inside a hostrun job (``$HOSTRUN_JOB`` names the cgroup this process runs in).

The enclosing job already booked this memory and caps it: booking again would count the same memory
twice, and a job cgroup of its own would escape the enclosing cap. So the inner command runs inside
the enclosing job; when nothing is left to do after it (no result file, no preflight to record),
hostrun becomes the command (exec), leaving the process tree as it would be without hostrun.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from dispatch.core.exitcodes import exec_failure, from_wait_status
from dispatch.core.outcome import Outcome
from dispatch.core.settings import LOCAL, Settings
from dispatch.local.admission.booking import default_label

MYPY = False
if MYPY:
    from collections.abc import Sequence

    from dispatch.core.request import RunRequest


def declares_preflight(argv: Sequence[str]) -> bool:
    """Whether the script ``argv`` runs declares preflight conditions (reads its first bytes only); a
    malformed declaration raises UsageError (2) here, before anything runs."""
    from dispatch.guards.headers import declares_preflight as has_header

    if not has_header(argv):
        return False
    from dispatch.local.run.preflight import declared

    return declared(argv) is not None


def run_inside(request: RunRequest, enclosing: str, keep_outcome: bool,
               settings: Callable[[], Settings], say: Callable[[str], None]) -> Outcome:
    """Run ``request`` inside the enclosing job ``enclosing``. ``keep_outcome``: the caller needs the
    outcome afterwards (a result file); else, with no preflight declared, this process becomes the
    command and returns only if it cannot be run. ``settings`` is called only for a preflight."""
    preflight = declares_preflight(request.argv)
    if not keep_outcome and not preflight:
        return become(request)
    if not preflight:
        return run_nested(request, enclosing)
    from dispatch.local.run.localrun import with_preflight

    return with_preflight(settings(), request, say, lambda: run_nested(request, enclosing))


def become(request: RunRequest) -> Outcome:
    """Exec the command in this process; the outcome returned is why it could not be run (127/126)."""
    try:
        os.execvp(request.argv[0], list(request.argv))
    except (OSError, ValueError) as exc:  # ValueError: an empty command name
        return _not_run(request, exc)


def run_nested(request: RunRequest, enclosing: str) -> Outcome:
    """Run and wait, within the enclosing job. Like ``system(3)``, ignore Ctrl-C while the command (in
    our process group) gets it."""
    env = dict(os.environ if request.env is None else request.env)
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    started = time.monotonic()
    try:
        pid = os.posix_spawnp(request.argv[0], list(request.argv), env,
                              setsigdef=(signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE))
        _, status = os.waitpid(pid, 0)
    except (OSError, ValueError) as exc:  # ValueError: an empty command name
        return _not_run(request, exc)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    code, how = from_wait_status(status)
    return Outcome(
        exit_code=code, outcome=how, host=LOCAL,
        label=request.label or default_label(request.argv), argv=list(request.argv),
        duration_s=round(time.monotonic() - started, 3), cgroup=enclosing,
        message=f"ran inside the enclosing hostrun job {enclosing}, booked and capped there",
    )


def _not_run(request: RunRequest, exc: OSError | ValueError) -> Outcome:
    code, reason = exec_failure(exc)
    return Outcome(exit_code=code, outcome="exit", host=LOCAL,
                   label=request.label or default_label(request.argv), argv=list(request.argv),
                   message=f"cannot run {request.argv[0]!r}: {reason}")
