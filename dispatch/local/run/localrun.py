"""A local run's front door: the script's preflight declaration, then the booking through the
admission engine, before the rest of a run is loaded.

A run that waits holds what it has imported (a swarm of 1,000 waiters: bench/bench_swarm.py), so
this module and what it imports are the little a run needs to be booked and to wait: the command
line, the settings, the engine's connection (``dispatch.local.engine.enginebook``). The runner and the cap
backend are loaded when the engine says its turn is near (``soon``, off the slot hand-off's path),
else once it is admitted (``dispatch.local.run.runner.run_booked``). On a
shared slice every run books through that slice's engine (``sharedlink.shared_here``), and a
``--gpu-memory`` run there is refused: that engine books no GPUs.
"""

from __future__ import annotations

import os

from dispatch.core.errors import HostrunError, UsageError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.outcome import Outcome
from dispatch.core.request import RunRequest, default_label
from dispatch.core.settings import Settings

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.core.alertshape import WaitFigures
    from dispatch.local.admission.policy import Admission
    from dispatch.local.hostslice import LocalSlice


def run_local(settings: Settings, request: RunRequest, say: Callable[[str], None],
              on_wait: Callable[[Admission], None] | None = None, alerts: bool = True,
              wait_alert: Callable[[WaitFigures], None] | None = None, park: bool = False) -> Outcome:
    """Book, wait, run and judge one job on this host; the Outcome carries the exit code.

    A script declaring preflight conditions is checked first (``with_preflight``). With ``alerts``
    (a run for a controller on this host; a peer's agent passes False, its controller alerts from the
    outcome), a long wait, an own-cap kill (250) and a slice-full kill (254) are alerted
    (``dispatch.local.alertlog``). ``wait_alert``: a peer's agent gets a long wait's figures there,
    for its controller to alert. ``park``: the run is this process's own command line
    (``hostrun -- CMD``), so while it waits far from its turn it may wait parked
    (``dispatch.local.engine.park``); not a run whose script holds a preflight lock.
    """
    from dispatch.guards.headers import declares_preflight

    declares = declares_preflight(request.argv)  # the script's headers read once
    park = park and not on_wait and not declares
    return with_preflight(settings, request, say,
                          lambda: _booked_run(settings, request, say, on_wait, alerts, wait_alert, park),
                          declares=declares)


def with_preflight(settings: Settings, request: RunRequest, say: Callable[[str], None],
                   run: Callable[[], Outcome], elsewhere: str | None = None,
                   declares: bool | None = None) -> Outcome:
    """``run()``, unless the script ``request.argv`` runs declares preflight conditions
    (``# admission:``, ``# run-condition:``; ``dispatch.local.run.preflight``) that are unmet: then print each
    unmet one and return exit 78 with nothing created, booked or run. A single-instance lock is held
    for the whole run; the inputs' fingerprint is recorded only when the job exited 0.

    ``elsewhere`` names a host whose node the job will run on, out of reach until it starts (a
    cluster): the admission and the single-instance lock are this tree's and are checked here; a
    condition about the machine (command, device, min-free) cannot be, and refuses the run (78).
    ``declares``: whether it declares any, when the caller has read that already.
    """
    from dispatch.guards.headers import declares_preflight

    if not (declares_preflight(request.argv) if declares is None else declares):
        return run()
    from dispatch.local.run.preflight import check, declared

    script = declared(request.argv)  # malformed: UsageError (2)
    if script is None:
        return run()
    host = elsewhere or settings.local.name
    label = request.label or default_label(request.argv)
    if elsewhere is not None:
        machine = [c for c in script.conditions if c.kind in ("command", "device", "min-free")]
        if machine:
            first = machine[0]
            return Outcome.of(ExitCode.NOT_RUN, host=host, label=label, argv=list(request.argv),
                              message=f"{script.path}:{first.line}: run-condition {first.kind} is "
                                      f"about the machine the job runs on, a node of {elsewhere} that "
                                      "cannot be checked before the job starts; nothing ran")
    environ = os.environ if request.env is None else request.env
    verdict, guard = check(settings, script, environ, force=request.force, hold=True)
    if guard is None:
        for line in [] if verdict.nothing_to_do else verdict.unmet_lines():
            say(line)  # a skip (inputs unchanged) is said in one line: the summary
        return Outcome.of(ExitCode.NOT_RUN, host=host, label=label, argv=list(request.argv),
                          message=verdict.summary())
    if verdict.unmet:  # only the admission, overridden by --force
        say(verdict.summary())
    try:
        outcome = run()
        if outcome.exit_code == 0 and outcome.outcome == "exit":
            try:
                guard.succeeded()
            except OSError as exc:
                say(f"warning: the job succeeded, but its inputs could not be recorded: {exc}")
        return outcome
    finally:
        guard.release()


def _booked_run(settings: Settings, request: RunRequest, say: Callable[[str], None],
                on_wait: Callable[[Admission], None] | None, alerts: bool,
                wait_alert: Callable[[WaitFigures], None] | None, park: bool) -> Outcome:
    """Booked by the engine and waited for here, then run by the runner. A run its parked process
    handed back carries on where it was."""
    if not request.argv:
        raise UsageError("no command given (usage: hostrun [OPTIONS] -- CMD [ARGS...])")
    from dispatch.core.text import storable
    from dispatch.local.engine import enginebook
    from dispatch.local.engine.park import allowed, take_resume
    from dispatch.local.engine.waitwatch import watch_for
    from dispatch.local.shared.sharedlink import engine_link, shared_here

    resumed = take_resume()  # always taken from the environment: the job never inherits it
    if resumed is not None and not park:  # not this process's own run: its connection is not ours
        os.close(resumed.fd)
        resumed = None
    here = shared_here(settings)
    if here is not None and request.gpu_memory is not None:
        from dispatch.core.errors import NotRunError

        raise NotRunError("--gpu-memory: the shared slice's engine books memory only, so a GPU booking "
                          "there could be overbooked by another user's; nothing ran")
    label = storable(request.label or default_label(request.argv))
    requeue = settings.may_requeue(label, request.group, request.requeue)
    watch = watch_for(settings, settings.local.name, label, request, say, on_wait, alerts, wait_alert,
                      resumed.started if resumed is not None else None)
    park = park and allowed()
    made: list[LocalSlice] = []

    def ready() -> None:
        """Its turn is near: the runner is loaded and the slice found now, off the hand-off's path
        (a slice that cannot be made is refused once admitted, as without this)."""
        import dispatch.local.run.runner  # noqa: F401  # what run_booked takes, loaded now
        from dispatch.local.hostslice import LocalSlice

        try:
            made.append(LocalSlice(settings))
        except (HostrunError, OSError):
            pass

    try:
        link = engine_link(settings, say, here)
        gpu = enginebook.gpu_want(request)
        get_ready = ready if here is None else None
        if resumed is not None:
            booked = enginebook.resume(settings, resumed, say, watch, park, link, gpu, get_ready)
        else:
            booked = enginebook.book(settings, request, label, requeue, None, say, watch, park, link, gpu,
                                     get_ready)
    except enginebook.Interrupted as exc:
        return enginebook.interrupted_outcome(settings, request, label, exc.signum)
    from dispatch.local.run.runner import run_booked

    return run_booked(settings, request, say, on_wait, alerts, wait_alert, booked,
                      here if here is not None or not made else made[0])
