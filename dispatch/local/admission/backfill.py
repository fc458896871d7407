"""EASY backfilling (docs/admission.md, "Backfill"): may a waiter start ahead of a memory-blocked head?

Pure functions on bookings and recorded durations (standard library only; the ledger calls them
inside its admission transaction). Strict FIFO leaves room unused while a big job at the head of the
queue waits for it; here a later job may use that room when, by its label's recorded duration, it
cannot delay the head beyond the head's reserved start (its *shadow* time), as Slurm's EASY backfill.

Estimates are upper bounds: a recorded duration (the label's longest) times ``MARGIN_FACTOR`` plus
``MARGIN_SECONDS``. A running job with no estimate (no recorded duration, or one already past its
estimate) may end at any moment, so its room may be the head's now: for the "ends before the shadow"
rule it counts as ending now, and the leftover rule trusts no room it may free (see ``shadow``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatch.core.records import NamedTuple
from dispatch.local.store.ledgerdb import Booking

MYPY = False
if MYPY:
    from typing import Optional

MARGIN_FACTOR = 1.25  # a backfilled job's recorded duration is stretched by this ...
MARGIN_SECONDS = 1.0  # ... plus this, for start-up and a slower run than any recorded
INF = float("inf")


def estimate(duration: float) -> float:
    """The upper bound on a run of a label whose longest recorded run took ``duration`` seconds."""
    return duration * MARGIN_FACTOR + MARGIN_SECONDS


class Shadow(NamedTuple):
    """The head's reservation: ``at``, the earliest time it may get its room (``now`` when jobs
    without an estimate could free it at once; INF when nothing known frees it); ``extra``, the room
    surely left at its start after its own size (what a job that outlasts ``at`` may take)."""

    at: float
    extra: int


def expected_end(since: float | None, duration: float | None, now: float) -> float | None:
    """A running job's estimated end; None when unknown (no recorded duration, or overdue)."""
    if duration is None or since is None:
        return None
    end = since + estimate(duration)
    return end if end > now else None


def shadow(head: int, free: int, running: Sequence[tuple[int, float | None]], now: float) -> Shadow:
    """The head's shadow, given the room ``free`` now and the running jobs as (size, expected end or
    None when unknown).

    ``at``: walking the known ends in order, with every unknown job's room counted as free now (it
    may end at any moment), the first time the room covers ``head``. ``extra``: the room at the
    shadow the known ends alone give, less ``head``; 0 when unknown jobs could make the head fit
    sooner (the head may then start with no room to spare).
    """
    known = sorted((end, size) for size, end in running if end is not None)
    unknown = sum(size for size, end in running if end is None)
    at = _first_fit(head, free + unknown, known, now)
    late = _first_fit(head, free, known, now)
    if late == INF:
        return Shadow(at, 0)
    freed = sum(size for end, size in known if end <= late)
    if unknown and free + unknown + sum(size for end, size in known if end < late) >= head:
        return Shadow(at, 0)
    return Shadow(at, free + freed - head)


def _first_fit(head: int, room: int, known: Sequence[tuple[float, int]], now: float) -> float:
    if room >= head:
        return now
    for end, size in known:
        room += size
        if room >= head:
            return end
    return INF


def jump(size: int, duration: float | None, room: int, sh: Shadow, now: float) -> str | None:
    """How a waiter may start ahead of the head: "ends" (its estimate ends by the shadow),
    "leftover" (it fits in the room left at the shadow), or None (no duration, no room, neither)."""
    if duration is None or size > room:
        return None
    if now + estimate(duration) <= sh.at:
        return "ends"
    if size <= sh.extra:
        return "leftover"
    return None


class Decision(NamedTuple):
    """The EASY scan's verdict for one waiter: admitted or not; the head it waits behind (None when
    none blocks, or it is the head); how it jumps ("ends"/"leftover"); the head's shadow; the room
    now after the waiters ahead of it that start (or jump) first."""

    admit: bool
    head: Optional[Booking] = None
    how: Optional[str] = None
    shadow: Optional[Shadow] = None
    room: int = 0


def decide(me: Booking, earlier: Sequence[Booking], running: Sequence[Booking], free: int,
           durations: Mapping[str, float], now: float) -> Decision:
    """Scan the queue in order (``earlier``: the waiters ahead of ``me`` not held by a queue policy):
    those that fit take their room; the first that does not is the head; behind it, each waiter that
    may jump (``jump``) takes its room (and the leftover, if that is how it fits). GPU jobs never jump
    (their VRAM is kept FIFO). ``durations``: the recorded longest run per label."""
    room = free
    head: Booking | None = None
    sh: Shadow | None = None
    ends = [(r.size, expected_end(r.since, durations.get(r.label), now)) for r in running]
    for b in [*earlier, me]:
        if head is None or sh is None:
            if b.size <= room:
                if b is me:
                    return Decision(True, room=room)
                room -= b.size
                ends.append((b.size, _end_from_now(durations.get(b.label), now)))
                continue
            if b is me:
                return Decision(False, room=room)
            head = b
            sh = shadow(b.size, room, ends, now)
            continue
        how = jump(b.size, None if b.gpu_bytes else durations.get(b.label), room, sh, now)
        if b is me:
            return Decision(how is not None, head, how, sh, room)
        if how is not None:
            room -= b.size
            if how == "leftover":
                sh = sh._replace(extra=sh.extra - b.size)
    raise AssertionError("unreachable: me is last")


def _end_from_now(duration: float | None, now: float) -> float | None:
    return None if duration is None else now + estimate(duration)
