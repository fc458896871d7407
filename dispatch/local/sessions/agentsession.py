"""An agent session under the machine's budget (``hostrun session -- CMD``, e.g. ``claude``).

The session itself, not only the commands it runs, is what takes machines down (a fan-out of
subagents grown to tens of GiB): so it runs as a run of its own, booked in the ledger like a job and
waiting its turn when the slice is full, in a cgroup of its own inside the *sessions slice* (a child
of hostrun's slice: the slice's limit is the machine's budget for jobs and sessions together, and
the sessions slice's limit, ``[sessions] share`` of it, keeps room for jobs). Its subagents, MCP
servers and tools run inside its cgroup; the jobs it starts through hostrun are runs of their own,
booked and capped in the slice beside it.

Its label is ``session:NAME`` (``--label NAME``, else the program's name: one label per kind of
session, whose recorded peaks size the next). Its cap: ``-m``, else the half rule of its worst
recorded peak (2 x, in 512 MiB steps: ``capacity.half_rule_cap``), else ``[sessions] cap``; never
more than the sessions slice. Its first run is booked at ``[sessions] first_booking``.
"""

from __future__ import annotations

import os

from dispatch.core.errors import BackendError, NeverFitsError, UsageError
from dispatch.core.settings import SESSION_LABEL_PREFIX
from dispatch.core.text import storable

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings
    from dispatch.local.hostslice import LocalSlice


def session_label(argv: list[str], label: str | None) -> str:
    """``session:NAME``: the label the session's peaks are kept under."""
    name = label if label else os.path.basename(argv[0]) if argv else ""
    name = storable(name).removeprefix(SESSION_LABEL_PREFIX)
    if not name:
        raise UsageError("a session needs a name: --label NAME or a command")
    return SESSION_LABEL_PREFIX + name


def session_cap(settings: Settings, here: LocalSlice, label: str, asked: int | None) -> tuple[int, str]:
    """The session's cap and where it came from (said in one line when it is not ``-m``'s): never
    more than the sessions slice, refused (243) when ``-m`` asks more."""
    from dispatch.core.units import format_size

    room = settings.sessions.limit(here.limit)
    if asked is not None:
        if asked > room:
            raise NeverFitsError(f"session cap {format_size(asked)} is larger than the sessions slice "
                                 f"({format_size(room)}: [sessions] share {settings.sessions.share:g} "
                                 f"of the {format_size(here.limit)} slice); it could never start")
        return asked, "-m"
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.capacity import half_rule_cap

    ledger = Ledger(settings.state_dir)
    try:
        peak = ledger.peak(label, here.host.name)
    finally:
        ledger.close()
    if peak is not None and peak.max_peak > 0:
        cap = half_rule_cap(peak.max_peak)
        why = f"2 x its worst recorded peak {format_size(peak.max_peak)}, in 512 MiB steps"
    else:
        cap, why = settings.sessions.cap, "[sessions] cap: no peak recorded yet"
    if cap > room:
        cap, why = room, f"{why}, held to the sessions slice"
    return cap, why


def run_session(settings: Settings, request: RunRequest, say: Callable[[str], None]) -> Outcome:
    """Book the session, wait for its turn, run it in its cgroup, record its peak: a ``run_local``
    with the session's label, cap and place. 250 when it was killed at its cap (its jobs and the
    other sessions go on), with an alert saying how to resume it."""
    from dispatch.core.units import format_size
    from dispatch.local.hostslice import LocalSlice
    from dispatch.local.run.localrun import run_local

    if not request.argv:
        raise UsageError("no command given (usage: hostrun session [OPTIONS] -- CMD [ARGS...])")
    here = LocalSlice(settings)
    if here.backend.session_form is None:
        raise BackendError(f"the {here.backend.name} memory-cap backend here runs no agent sessions "
                           "(docs/agents.md, 'Sessions under the budget': cgroup v1, v2 or systemd); "
                           "nothing ran")
    label = session_label(list(request.argv), request.label)
    cap, why = session_cap(settings, here, label, request.cap)
    if why != "-m":
        say(f"session {label}: cap {format_size(cap)} ({why})")
    request = request._replace(label=label, cap=cap, role="session", no_cap=False)
    return run_local(settings, request, say)
