"""A finished run's record: its row in the run history (``RunRecord``), what it does to its
label's mark (the events), and ``record_outcome``, which writes both through the admission engine's
connection or a ledger (standard library only).

Apart from ``dispatch.local.store.ledgerdb`` (the store's schema and row readers, which re-exports these)
because every run writes a record and a run the engine booked opens no ledger: it need not load the
schema.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import Settings

# What a run says about its label's mark (``mark_event``), in ``ledgerdb.record_fold`` and in the
# peak journal: killed with 254; OOM-killed otherwise; a clean run at its cap; failed otherwise
# (a non-zero exit or a signal: it may raise the booking peak, never set it); nothing of that.
SLICE_FULL, OOM_KILLED, CLEAN, FAILED, NO_EVENT = "s", "o", "c", "f", "-"
UNFINISHED = (SLICE_FULL, OOM_KILLED, FAILED)  # runs whose peak says "at least", not "this much"


class RunRecord(NamedTuple):
    """One finished run in the history. ``cap``: the job cgroup's limit (the slice's when it had no
    cap of its own); ``peak`` None: nothing was measured (the command could not be started)."""

    started: float
    ended: float
    duration: Optional[float]
    waited: Optional[float]
    host: str
    label: str
    session: Optional[str]
    command: str
    cap: Optional[int]
    kind: Optional[str]  # the booking kind: cap, peak or gamble
    booked: Optional[int]
    peak: Optional[int]
    exit_code: int
    outcome: str  # "exit", "signal" or an exit-code name ("own-cap", "max-runtime", ...)
    hit_ceiling: bool
    id: Optional[int] = None  # set when read back


def run_row(outcome: Outcome, session: str | None, argv: Sequence[str]) -> RunRecord:
    """The run's row in the run history, ending now (text made storable: SQLite keeps only valid
    UTF-8). Its start is the end less the job's own run time. Here, not in ``history``: every run
    writes one, and ``history`` (queries, ``--since``) stays off that path."""
    import time

    from dispatch.core.text import storable

    ended = time.time()
    return RunRecord(
        started=ended - (outcome.duration_s or 0.0), ended=ended, duration=outcome.duration_s,
        waited=outcome.waited_s, host=storable(outcome.host), label=storable(outcome.label),
        session=None if session is None else storable(session), command=storable(" ".join(argv)),
        cap=outcome.cap_bytes, kind=outcome.booking_kind, booked=outcome.booked_bytes,
        peak=outcome.peak_bytes, exit_code=outcome.exit_code, outcome=storable(outcome.outcome),
        hit_ceiling=bool(outcome.hit_ceiling),
    )


def record_outcome(settings: Settings, ledger: Any, outcome: Outcome, request: RunRequest,
            cap: int | None, kind: str, say: Callable[[str], None]) -> None:
    """The run's peak (when one was measured), its mark event and its history row, in one
    transaction. The job has run: a ledger failure now must not change its exit status, so it is
    one warning."""
    from dispatch.core.errors import LedgerError

    run = run_row(outcome, request.session, request.argv)
    try:
        if outcome.peak_bytes is None:  # the command could not be started: nothing measured
            ledger.record_run(run, settings.history_keep)
        else:
            event = mark_event(outcome, kind)
            ledger.record_peak(outcome.label, outcome.host, outcome.peak_bytes, outcome.hit_ceiling,
                               outcome.duration_s, cap=cap, event=event,
                               clear_after=settings.clear_mark_after, run=run,
                               keep=settings.history_keep, vram=outcome.vram_peak_bytes,
                               ramp=outcome.ramp)
    except LedgerError as exc:
        say(unrecorded_line(exc))


def unrecorded_line(why: object) -> str:
    """The warning for a finished run whose record the ledger refused (its exit status stands)."""
    return f"warning: the peak and history row of this run were not recorded: {why}"


def mark_event(outcome: Outcome, kind: str | None) -> str:
    """What a finished run does to its label's mark (``ledgerdb.record_fold``): hostrun's 254 verdict
    marks it (a job's own ``exit 254`` does not); any other OOM kill sets its clean count back to 0;
    exit 0 booked at its cap (``kind`` "cap") with nothing OOM-killed counts as clean. A run that
    failed otherwise (FAILED) says nothing of the mark, and its peak may only raise the booking
    peak."""
    from dispatch.core.exitcodes import ExitCode

    if outcome.is_verdict(ExitCode.SLICE_FULL):
        return SLICE_FULL
    if outcome.counters.get("oom_kill", 0) > 0:
        return OOM_KILLED
    if outcome.exit_code == 0 and kind == "cap":
        return CLEAN
    return NO_EVENT if outcome.exit_code == 0 else FAILED
