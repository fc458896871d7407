"""How a job is booked: kind, size and cgroup limit from its cap and its recorded peak.

- ``peak``: the label has a recorded peak, is not marked, and the peak is below the cap →
  booked at the peak; the cgroup limit stays the cap (or the slice). oom_score_adj 500.
- ``cap``: a cap is known (``--memory-cap``, else the host's ``default_cap``) → booked at the cap.
  oom_score_adj 0. A marked label is booked this way, at the whole slice when it has no cap.
- ``gamble``: no history and no cap → booked at ``gamble_size``, limited only by the slice.
  oom_score_adj 1000, so the kernel kills it first. A job that may be requeued (``--requeue``) and has
  no recorded peak here is a gamble even with a cap: booked at ``guess`` (what is known of it, else half
  its cap), limited by its cap; if the slice fills, the kernel kills it first, and it runs again at its
  cap. So a first pass packs the slice as well as a recorded one, and loses no job. An agent
  session (``hostrun session``, its label ``session:NAME``) with no recorded peak is a gamble so too,
  at ``[sessions] first_booking`` (the run sends it as its gamble size), limited by its cap.

A label is marked (in the peak table, per host) when it hit its own cap (250: for good, as its peak
says nothing about what it needs), or when it was killed because the slice filled (254: a peak or
gamble booking undercounted it; otherwise it would be booked the same way and killed again). The
254 mark clears after ``clear_mark_after`` clean runs in a row at its cap.
"""

from __future__ import annotations

from dispatch.core.errors import NeverFitsError
from dispatch.core.records import NamedTuple
from dispatch.core.request import default_label as default_label  # where the callers found it
from dispatch.core.settings import SESSION_LABEL_PREFIX
from dispatch.core.units import format_size

MYPY = False
if MYPY:
    from collections.abc import Sequence
    from typing import Optional

    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store.ledgerdb import Booking, PeakRecord

OOM_SCORE_ADJ = {"cap": 0, "peak": 500, "gamble": 1000}


class Plan(NamedTuple):
    kind: str
    size: int  # what the ledger books
    limit: int  # the job cgroup's memory limit
    oom_score_adj: int
    why: Optional[str] = None  # a gamble chosen from what is known: how its size was chosen


class Guess(NamedTuple):
    """A requeueable first run's booking: the size and how it was chosen (the queue log says it)."""

    size: int
    why: str


MIN_GUESS = 32 << 20  # a guess from a tiny recorded peak (``true``) books at least this


def guess(cap: int | None, limit: int, elsewhere: Sequence[tuple[str, int]], program: str,
          program_peaks: Sequence[int]) -> Guess | None:
    """What to book a job at that has no recorded peak here but may be requeued, never above its
    ``limit`` (its cap, or the slice), never below ``MIN_GUESS``: the label's highest peak on
    another host this ledger knows (a cluster's, say); else, with a cap, half of it (``hostrun
    capacity`` and the cluster kind suggest caps of twice the peak), or the highest recent peak of
    its program (``argv[0]``'s name) here when that is less (one program, as python, runs jobs of
    every size: its runs may lower the guess, never raise it above half the cap); without a cap,
    the program's highest recent peak; else None (``gamble_size`` then, as always)."""
    top = max(program_peaks) if program_peaks else None
    from_program = f"the highest peak of the last {len(program_peaks)} runs of {program} here"
    if elsewhere:
        where, peak = max(elsewhere, key=lambda hp: hp[1])
        size, why = peak, f"its recorded peak on {where}"
    elif cap is not None and (top is None or top >= cap // 2):
        size, why = cap // 2, "half its cap" + ("" if top is not None else
                                               ": no peak recorded for it or its program")
    elif top is not None:
        size, why = top, from_program
    else:
        return None
    return Guess(min(limit, max(size, MIN_GUESS)), why)


def gamble_line(label: str, booking_id: int, plan: Plan) -> str:
    """The queue log's line for a gamble whose size was chosen from what is known (``plan.why``)."""
    return (f"GAMBLE {label} (booking {booking_id}) at {format_size(plan.size)} of its "
            f"{format_size(plan.limit)} limit: {plan.why}")


def plan_of(row: Booking) -> Plan:
    """The plan a booking was made with, as its row keeps it (a booking found again, re-attached)."""
    return Plan(row.kind, row.size, row.cap, OOM_SCORE_ADJ.get(row.kind, OOM_SCORE_ADJ["gamble"]))


def as_admitted_kind(plan: Plan, kind: str | None) -> Plan:
    """The plan as admitted, from the kind the engine admitted the booking as: a job started on
    lent room (``dispatch.local.admission.lending``) was booked as a gamble, so the kernel kills it first if a
    projection was wrong (and it is requeued)."""
    if kind != "gamble" or plan.kind == "gamble":
        return plan
    return plan._replace(kind="gamble", oom_score_adj=OOM_SCORE_ADJ["gamble"])


def peer_cap(cap: int | None, default_cap: int | None, peer_memory_cap: int | None) -> int | None:
    """The cap a job sent to a peer runs under, the one rule the controller's check (249), the
    dispatcher and the peer's agent share: ``-m`` as given (the callers refuse it above
    ``peer_memory_cap``); else ``default_cap``, but never above ``peer_memory_cap`` (a default
    gives way to the peer's bound); else ``peer_memory_cap`` (an uncapped job runs under it)."""
    if cap is not None:
        return cap
    if peer_memory_cap is None:
        return default_cap
    return peer_memory_cap if default_cap is None else min(default_cap, peer_memory_cap)


def plan_booking(
    *, cap: int | None, peak: PeakRecord | None, slice_limit: int, gamble_size: int,
    first_guess: Guess | None = None,
) -> Plan:
    """The booking (module docstring). ``first_guess``: the job may be requeued and has no
    recorded peak here (``peak`` None): a gamble at that size, when below its limit."""
    if cap is not None and cap > slice_limit:
        raise NeverFitsError(
            f"cap {format_size(cap)} is larger than the whole slice ({format_size(slice_limit)}); "
            "it could never be admitted"
        )
    limit = cap if cap is not None else slice_limit
    marked = peak is not None and (peak.hit_ceiling or peak.slice_full_at is not None)
    if peak is None and first_guess is not None and first_guess.size < limit:
        return Plan("gamble", first_guess.size, limit, OOM_SCORE_ADJ["gamble"], first_guess.why)
    if peak is not None and not marked and peak.max_peak > 0 and peak.max_peak < limit:
        kind, size = "peak", peak.max_peak
    elif cap is not None:
        kind, size = "cap", cap
    elif marked:
        kind, size = "cap", slice_limit
    else:
        kind, size = "gamble", min(gamble_size, slice_limit)
    return Plan(kind=kind, size=size, limit=limit, oom_score_adj=OOM_SCORE_ADJ[kind])


def plan_for(ledger: Ledger, host: str, label: str, program: str, cap: int | None, slice_limit: int,
             gamble_size: int, requeue: bool) -> Plan:
    """The booking of a run of ``label`` on ``host`` from what ``ledger`` knows of it: its peak there
    and, for a job that may be requeued and has none, the guess (``guess``). The one rule for a run
    booked by the admission engine and one taking the ledger's lock itself."""
    peak = ledger.peak(label, host)
    first_guess = None
    if peak is None and label.startswith(SESSION_LABEL_PREFIX):  # an agent session's first: the run's guess
        first_guess = Guess(gamble_size, f"a session's first booking, {format_size(gamble_size)} "
                                         "([sessions] first_booking)")
    elif requeue and peak is None:
        elsewhere, program_peaks = ledger.guess_evidence(label, host, program)
        first_guess = guess(cap, cap if cap is not None else slice_limit, elsewhere, program,
                            program_peaks)
    return plan_booking(cap=cap, peak=peak, slice_limit=slice_limit, gamble_size=gamble_size,
                        first_guess=first_guess)


def _at(when: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def mark_reasons(peak: PeakRecord, clear_after: int) -> list[str]:
    """Why the label is booked at its cap (``hostrun ledger``); empty when it is not marked."""
    reasons = []
    if peak.hit_ceiling:
        reasons.append("hit its own cap" + (f" at {_at(peak.ceiling_at)}" if peak.ceiling_at else ""))
    if peak.slice_full_at is not None:
        reasons.append(f"killed when the slice filled at {_at(peak.slice_full_at)} "
                       f"({peak.clean_runs}/{clear_after} clean runs at its cap to clear)")
    return reasons
