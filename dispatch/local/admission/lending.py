"""Lending (docs/admission.md, "Lending"): room booked by running jobs that have not grown into it
yet, lent to a short waiter that may be requeued.

A booking is a job's peak, but a job reaches its peak some way into its run (its ramp profile,
``dispatch.local.store.ramp``). When FIFO and backfill hold a waiter for memory alone, it may still start
if, at every moment until its estimated end, what the running jobs are projected to use, plus its
own projection, stays within the room. Pure functions of rows and recorded profiles (standard
library only: the ledger calls them inside its admission transaction).

Projections are upper bounds: a job's phase is taken from its fastest recorded run (the profile is
a cumulative maximum, so an earlier phase never uses more), its profile is the pointwise maximum
over its runs, and a job with no profile, or past its estimated end (``backfill.estimate`` of its
longest run), counts at its whole booking (and at least its peak) until it releases it: no job is
assumed to have ended. A borrower is booked as a ``gamble`` (oom_score_adj 1000): if a projection
was wrong and the slice fills, the kernel kills it first, and it is requeued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatch.core.records import NamedTuple
from dispatch.core.units import format_size
from dispatch.local.admission.backfill import estimate
from dispatch.local.store import ramp
from dispatch.local.store.ledgerdb import Booking

MYPY = False
if MYPY:
    from typing import Optional


class Ramp(NamedTuple):
    """What lending knows of a label on a host: its profile, fastest and longest recorded runs."""

    points: tuple[int, ...]
    fastest: float
    longest: float


class Loan(NamedTuple):
    """A waiter's projection: whether it fits at every step; the worst step (``at`` seconds from
    now) with what is projected then and the room."""

    fits: bool
    at: float
    projected: int
    room: int


def usage(b: Booking, known: Optional[Ramp], t: float) -> int:
    """What running booking ``b`` is projected to hold at time ``t`` (an upper bound)."""
    if known is None or b.since is None:
        return b.size
    if t > b.since + estimate(known.longest):  # overdue: it may hold all it booked, until it ends
        return max(b.size, known.points[-1])
    return ramp.at_phase(known.points, (t - b.since) / known.fastest)


def project(me: Ramp, running: Sequence[Booking], ramps: Mapping[str, Ramp], room: int,
            now: float) -> Loan:
    """Would a waiter with profile ``me``, starting ``now``, keep every step within ``room`` (the
    whole room for running jobs: the room left now plus what they booked) until its estimated end?
    The steps: now, each tenth of each profiled job's fastest run, each estimated end."""
    horizon = now + estimate(me.longest)
    steps = {now}
    steps.update(now + me.fastest * k / ramp.POINTS for k in range(1, ramp.POINTS + 1))
    for b in running:
        known = ramps.get(b.label)
        if known is not None and b.since is not None:
            steps.update(b.since + known.fastest * k / ramp.POINTS for k in range(1, ramp.POINTS + 1))
            steps.add(b.since + estimate(known.longest) + 1e-6)  # just past it: the overdue rule
    worst = Loan(True, 0.0, -1, room)
    for t in sorted(s for s in steps if now <= s <= horizon):
        total = ramp.at_phase(me.points, (t - now) / me.fastest)
        total += sum(usage(b, ramps.get(b.label), t) for b in running)
        if total > worst.projected:
            worst = Loan(total <= room, t - now, total, room)
    return worst


def lend(me: Booking, running: Sequence[Booking], ramps: Mapping[str, Ramp], free: int, now: float,
         head: Optional[Booking] = None, shadow_at: Optional[float] = None) -> Optional[str]:
    """The ``LEND`` queue-log line when waiter ``me`` (held for memory alone; it may be requeued)
    may start on loan, else None. ``free``: the room now (the slice's or the machine's, as ``Room``
    says); ``head``: a memory-blocked waiter ahead of it, which it must not delay: then it must end,
    by its estimate, by the head's ``shadow_at`` (``backfill.shadow``; None: no loan)."""
    known = ramps.get(me.label)
    if not me.requeue or me.gpu_bytes or known is None or known.fastest <= 0:
        return None
    if head is not None and (shadow_at is None or now + estimate(known.longest) > shadow_at):
        return None
    room = free + sum(b.size for b in running)
    loan = project(known, running, ramps, room, now)
    if not loan.fits:
        return None
    return (f"LEND {me.label} (booking {me.id}, need {format_size(me.size)}, est "
            f"{estimate(known.longest):.0f}s, {format_size(max(0, free))} free): the running jobs' "
            f"ramps and its own project at most {format_size(loan.projected)} of "
            f"{format_size(room)} (at +{loan.at:.1f}s); booked as a gamble")
