"""A local run booked by the admission engine before anything else of it is made or loaded.

Why: in a swarm, what a waiting run has imported is what it holds while it waits (bench_swarm.py:
1,000 waiters). So a run asks the engine right after its command line and settings are read: the
engine checks its cap against the slice (243, 78 as the run would say them), plans its booking from
the ledger (``booking.plan_for``) and queues it; the run waits blocked in a read and loads the
runner, the cap backend and the ledger only once admitted (``dispatch.local.run.runner.run_booked``).

A signal that ends the wait (SIGINT, SIGTERM, SIGHUP, SIGQUIT) releases the booking: ``Interrupted``.
"""

from __future__ import annotations

import os
import time

from dispatch.core.procinfo import start_time
from dispatch.core.records import NamedTuple
from dispatch.local.engine.admitclient import Link

MYPY = False
if MYPY:
    import signal
    from collections.abc import Callable
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings
    from dispatch.local.engine.park import Resume
    from dispatch.local.engine.waitwatch import WaitWatch
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal

# They end a wait for room, as SIGINT does (KeyboardInterrupt).
WAIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(Exception):
    """A signal arrived while the job was still waiting for room (nothing ran; booking released)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def give_back(link: Link, mask: Any = None) -> None:
    """A run that will not run (a signal, an error): its booking released, its connection closed;
    ``mask``: the signal mask it had before it was booked, set again."""
    try:
        link.release()
    finally:
        link.close()
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _alert_in(watch: WaitWatch | None) -> float | None:
    """Seconds until a parked run's long-wait alert is due (it resumes whole then)."""
    if watch is None or watch.alert_after <= 0 or watch.alert is not None:
        return None
    return max(0.0, watch.alert_after - (time.monotonic() - watch.started))


def interrupted_outcome(settings: Settings, request: RunRequest, label: str, signum: int) -> Outcome:
    """A signal ended the wait: nothing ran, the booking is released."""
    from dispatch.core.exitcodes import SIGNAL_BASE
    from dispatch.core.outcome import Outcome

    return Outcome(exit_code=SIGNAL_BASE + signum, outcome="signal", host=settings.local.name,
                   label=label, argv=list(request.argv),
                   message="interrupted while waiting for room; nothing ran")


def raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


class Booked(NamedTuple):
    """An admitted booking the engine planned: its connection (the booking is the connection's),
    id, plan (``booking.Plan``'s fields), the kind it was admitted as (a lent start is a gamble),
    the seconds it waited and, for a ``--gpu-memory`` run, the GPU it was admitted on."""

    link: Link
    booking_id: int
    plan: list[Any]
    admitted_kind: Optional[str]
    waited: float
    gpu_index: Optional[int] = None  # a --gpu-memory run's GPU
    # The signal mask to set once the run's own handlers are in place: until then SIGTERM, SIGHUP
    # and SIGQUIT stay held back (``runner._run``; ``give_back`` and the run's release set it too).
    mask: Any = None


def book(settings: Settings, request: RunRequest, label: str, requeue: bool, place: int | None,
         say: Callable[[str], None], watch: WaitWatch | None, park: bool = False,
         link: Link | None = None, gpu: list[Any] | None = None,
         ready: Callable[[], None] | None = None) -> Booked:
    """Book the run through the engine and wait until it is admitted. ``place``: the booking id a
    requeued job keeps. ``park``: a run far from its turn may wait parked (``dispatch.local.engine.park``:
    this process is replaced, and the run carries on in ``resume``). Raises ``Interrupted`` when a
    signal ended the wait, the run's refusal (243, 78) as the engine found it, or ``EngineError``
    (78) when no engine could book it. ``link``: the engine to book on (the shared slice's), else this
    state dir's. ``gpu``: a ``--gpu-memory`` run's want (``gpu_want``). ``ready``: called once when
    the run's turn is near (``Link.wait``)."""
    from dispatch.core.text import storable
    from dispatch.guards.trust import private_dir

    private_dir(settings.state_dir, fix="set state_dir to a directory of your own")
    # From the moment the booking exists, a SIGTERM/SIGHUP/SIGQUIT must end the wait cleanly
    # (release it, say "nothing ran"): held back until the handlers are in place.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
    link = Link(settings, say) if link is None else link
    link.gpu = gpu
    try:
        link.connect()  # 78 when it cannot start
        me = os.getpid()
        argv = request.argv
        answer = link.plan(dict(
            host=settings.local.name, label=label, pid=me, pid_start=start_time(me) or 0,
            cap=request.cap if request.cap is not None else settings.local.default_cap,
            no_cap=request.no_cap, program=storable(os.path.basename(argv[0])),
            command=" ".join(argv), session=request.session, group=request.group,
            when_idle=request.when_idle, booking_id=place, requeue=requeue,
            gamble=(settings.sessions.first_booking if request.role == "session"
                    else settings.gamble_size_for(settings.local)), gpu=gpu))
        waited = _wait(link, say, watch, park, time.monotonic(), ready)
    except BaseException:
        give_back(link)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise
    return Booked(link, int(answer["id"]), list(answer["plan"]), link.admitted_kind, waited,
                  link.gpu_index, old_mask)


def resume(settings: Settings, resumed: Resume, say: Callable[[str], None], watch: WaitWatch | None,
           park: bool = False, link: Link | None = None, gpu: list[Any] | None = None,
           ready: Callable[[], None] | None = None) -> Booked:
    """The run its parked process handed back (``park.take_resume``): on the same connection, its
    booking as the engine has it now (admitted, or still waiting: waited for whole, unless it
    resumed only to have the engine replaced, when it may park again); through the next engine when
    that one went; ``Interrupted`` (its booking released) when a signal ended the wait."""
    # The parked process held these back across the exec; they act once the wait's handlers are set.
    old_mask = set(signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)) - {signal.SIGINT, *WAIT_SIGNALS}
    link = (Link(settings, say) if link is None else link).adopt(resumed.fd, resumed.booking_id)
    link.gpu = gpu
    try:
        if resumed.signum is not None:
            raise Interrupted(resumed.signum)
        try:
            if resumed.why == "gone":
                raise ConnectionError("the admission engine closed the connection")
            answer = link.attach()
        except (ConnectionError, OSError):  # the engine went: the next one, the booking re-attached
            answer = link.reattached()
        plan = answer.get("plan")
        if answer.get("state") not in ("waiting", "running") or not isinstance(plan, list):
            from dispatch.core.errors import EngineError

            raise EngineError(f"booking {resumed.booking_id} was lost while this run waited parked; "
                              "nothing ran")
        if answer["state"] == "running":
            link.admitted_kind = str(plan[0])
            waited = time.monotonic() - resumed.started
        else:
            if resumed.why == "soon" and ready is not None:  # resumed because its turn is near
                ready()
                ready = None
            waited = _wait(link, say, watch, park and resumed.why == "gone", resumed.started, ready)
    except BaseException:
        give_back(link)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise
    return Booked(link, resumed.booking_id, list(plan), link.admitted_kind, waited, link.gpu_index,
                  old_mask)


def gpu_want(request: RunRequest) -> list[Any] | None:
    """A ``--gpu-memory`` run's want as the engine books it: ``[VRAM, the devices it may have]``,
    once ``gpu.preflight`` found it could ever run here (else 78, 243, before anything is booked);
    None for a run without ``--gpu-memory``."""
    if request.gpu_memory is None:
        return None
    from dispatch.local.gpus.gpu import preflight

    candidates = preflight(request.gpu_memory, os.environ if request.env is None else request.env)
    return [request.gpu_memory, [g.index for g in candidates]]


def _wait(link: Link, say: Callable[[str], None], watch: WaitWatch | None, park: bool,
          started: float, ready: Callable[[], None] | None) -> float:
    old = {sig: signal.signal(sig, raise_interrupted) for sig in WAIT_SIGNALS}
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, *WAIT_SIGNALS))  # held back: now
        parker = None
        after = 0.0
        if park and (watch is None or watch.then is None):  # a peer watch needs the run whole
            from dispatch.local.engine.park import park_after
            from dispatch.local.engine.park import parker as make_parker

            parker = make_parker(link, started, lambda: _alert_in(watch))
            after = park_after()
        return link.wait(say, watch, watch.due if watch is not None else None, parker, started, after,
                         ready)
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    finally:
        # Held back again before the wait's handlers go: admitted, the run keeps them held back
        # until its own are in place (``runner._run``), so a SIGTERM then ends the job it starts, not
        # hostrun halfway through setting it up (its job cgroup left behind).
        signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
        for sig, handler in old.items():
            signal.signal(sig, handler)
