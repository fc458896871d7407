"""Admission policy: whether a waiting booking may start now, why not, and on which GPU
(docs/admission.md).

Pure functions of the host's bookings and the room figures its caller reads (standard library only,
no SQLite), so the rules can be tested without a store: the ledger (``dispatch.local.admission.ledger``) reads
the rows inside its admission transaction, asks here, and stores the verdict. FIFO: a waiter gets in
only when the room left after every earlier waiter's need covers its own; a waiter held by a queue
policy (``--group``, ``--when-idle``) or stopped reserves nothing; with ``queue_policy = "backfill"``
a waiter may still jump a memory-blocked head (``dispatch.local.admission.backfill``); a waiter that may be
requeued may start on room the running jobs have not grown into yet (``dispatch.local.admission.lending``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dispatch.core.records import NamedTuple
from dispatch.core.settings import SESSION_LABEL_PREFIX
from dispatch.core.units import format_size
from dispatch.local.store.ledgerdb import Booking

MYPY = False
if MYPY:
    from typing import Any, Optional

    GpuRoom = Callable[[list[Booking]], dict[int, int]]  # running bookings -> room per GPU index
    RoomFunction = Callable[[list[Booking]], "Room"]  # running bookings -> room for a new booking
    Durations = Callable[[], Mapping[str, float]]  # the recorded longest run per label, read on demand
    from dispatch.local.admission.lending import Ramp
    Ramps = Callable[[], Mapping[str, Ramp]]  # the recorded ramp profiles per label, read on demand


def choose_gpu(rooms: dict[int, int], earlier: list[int], need: int
               ) -> tuple[int | None, int | None, int, bool]:
    """Pick a device for ``need`` bytes of VRAM, keeping FIFO among GPU waiters.

    ``rooms``: room per device index after running bookings; ``earlier``: the VRAM asked for by
    earlier GPU waiters, in queue order. Each earlier waiter is first set against the device with the
    most room (as it would choose), whether or not it fits there, so a later job can only take room
    an earlier one would not have taken. Then the device with the most room left that fits ``need``
    is chosen (lowest index on a tie). Returns (device, room on the best device before the earlier
    waiters, VRAM asked for by them, fits).
    """
    if not rooms:
        return None, None, sum(earlier), False
    best = max(rooms, key=lambda i: (rooms[i], -i))
    left = dict(rooms)
    for size in earlier:
        first = max(left, key=lambda i: (left[i], -i))
        left[first] -= size
    device = max(left, key=lambda i: (left[i], -i))
    fits = left[device] >= need
    return (device if fits else best), rooms[best], sum(earlier), fits


class Room(NamedTuple):
    """Room for a new booking on a host now: the slice's room, or less when the machine's available
    memory is shorter (``note`` then says so, for the status line and the queue reason)."""

    free: int
    note: Optional[str] = None


class Admission(NamedTuple):
    """One admission attempt: whether it got in, and the figures a status line needs."""

    admitted: bool
    need: int
    free: int
    ahead: int  # bytes asked for by earlier waiters
    position: int  # how many earlier waiters there are
    holders: list[Booking]
    reclaimed: list[Booking]
    # With --gpu-memory: VRAM asked for; the device chosen (admitted) or with the most room (not yet);
    # the room on that device before earlier GPU waiters; VRAM asked for by those; what blocks.
    gpu_need: int = 0
    gpu_device: Optional[int] = None
    gpu_free: Optional[int] = None
    gpu_ahead: int = 0
    memory_ok: bool = True
    gpu_ok: bool = True
    policy: Optional[str] = None  # a queue policy holding it: "group-cap build 2/2", "when-idle ..."
    # Backfill (queue_policy "backfill"): what holds it behind a memory-blocked head that it would
    # fit in front of ("waiting for head ..."); the BACKFILL line when it jumped the head; whether a
    # waiter behind it might jump now (a woken waiter then passes the ring on).
    head: Optional[str] = None
    backfill: Optional[str] = None
    pass_on: bool = False
    machine: Optional[str] = None  # the machine's available memory, when it is what holds the room
    lend: Optional[str] = None  # the LEND line when it starts on room lent by slow-growing jobs


def policy_block(b: Booking, running: Sequence[Booking], groups: Mapping[str, int] | None,
                 sessions: int | None = None) -> str | None:
    """Why a queue policy holds waiting booking ``b`` now, or None.

    ``--when-idle``: only when no other hostrun job runs on the host. ``--group NAME``: at most
    ``groups.NAME.max_running`` jobs of that group at once (groups not configured have no cap).
    ``sessions``: the sessions slice's limit: an agent session (label ``session:NAME``) starts only
    while the sessions' bookings leave room for its own in it (they run confined there).
    """
    others = [r for r in running if r.id != b.id]
    if b.when_idle and others:
        return f"when-idle {b.label} — {len(others)} running"
    if sessions is not None and b.label.startswith(SESSION_LABEL_PREFIX):
        mine = [r for r in others if r.label.startswith(SESSION_LABEL_PREFIX)]
        held = sum(r.size for r in mine)
        if held + b.size > sessions:
            return (f"sessions slice {format_size(held)} of {format_size(sessions)} booked by "
                    f"{len(mine)} session{'s' if len(mine) != 1 else ''}")
    limit = (groups or {}).get(b.grp) if b.grp else None
    if limit is not None:
        count = sum(1 for r in others if r.grp == b.grp)
        if count >= limit:
            return f"group-cap {b.grp} {count}/{limit}"
    return None


def _never_stopped(b: Booking) -> bool:
    return False


def evaluate(booking_id: int, rows: Sequence[Booking], room: RoomFunction,
             gpu_room: GpuRoom | None = None, groups: Mapping[str, int] | None = None, *,
             stopped: Callable[[Booking], bool] = _never_stopped, durations: Durations | None = None,
             now: float = 0.0, ramps: Ramps | None = None,
             later_rows: Callable[[], Sequence[Booking]] | None = None,
             sessions: int | None = None) -> Admission:
    """Would booking ``booking_id`` get in now? ``rows``: every booking of its host, in id order.

    ``room`` gets the running bookings and returns the room for a new one; ``gpu_room`` the VRAM
    room per device (``choose_gpu``). ``stopped``: whether a waiter is stopped (Ctrl-Z, SIGSTOP):
    it cannot take its turn, so it holds nobody up until resumed. ``durations`` (queue_policy
    "backfill"; read only when FIFO holds the booking): the labels' recorded longest runs, for a
    jump ahead of a blocked head at time ``now``. ``ramps`` (read only when memory holds a waiter
    that may be requeued): the labels' ramp profiles, for a loan (``lending.lend``). Raises
    LookupError when the booking is gone. ``later_rows``: the waiters behind it, when ``rows``
    holds only the running bookings and the waiters up to it (read only when a jump or a loan
    needs them: a long queue's head is tried without reading the whole queue).
    """

    def later_waiting() -> list[Booking]:
        behind = later_rows() if later_rows is not None else rows
        return [b for b in behind if b.state == "waiting" and b.id > booking_id]

    running = [b for b in rows if b.state == "running"]
    me = next((b for b in rows if b.id == booking_id), None)
    if me is None:
        raise LookupError(f"booking {booking_id} vanished from the ledger")
    earlier = [b for b in rows if b.state == "waiting" and b.id < booking_id]
    # A waiter held by a queue policy (its group's cap, --when-idle) reserves no memory: the jobs
    # of other groups behind it may start. Within a group FIFO holds, as the cap holds them all.
    held = {b.id for b in earlier if policy_block(b, running, groups, sessions) is not None}
    held |= {b.id for b in earlier if stopped(b)}
    ahead = sum(b.size for b in earlier if b.id not in held)
    got = room(running)
    free, machine = got.free, got.note
    if me.state == "running":
        return Admission(True, me.size, free, ahead, len(earlier), running, [],
                         gpu_need=me.gpu_bytes or 0, gpu_device=me.gpu_index)
    policy = policy_block(me, running, groups, sessions)
    memory_ok = free - ahead >= me.size
    extra: dict[str, Any] = {"machine": machine}
    if durations is not None and not memory_ok:  # FIFO would hold it: may it jump a blocked head?
        later = [b for b in later_waiting() if policy_block(b, running, groups, sessions) is None]
        memory_ok, jumped = easy(me, [b for b in earlier if b.id not in held], later, running, free,
                                 durations(), now)
        extra.update(jumped)
    if ramps is not None and not memory_ok and policy is None:
        waiting = [b for b in earlier if b.id not in held]
        extra["lend"] = _loan(me, waiting, running, free, ramps, durations, now)
        memory_ok = extra["lend"] is not None
        extra["pass_on"] = extra.get("pass_on", False) or any(
            b.requeue for b in later_waiting())
    if not me.gpu_bytes:
        return Admission(memory_ok and policy is None, me.size, free, ahead, len(earlier), running,
                         [], memory_ok=memory_ok, policy=policy, **extra)
    rooms = gpu_room(running) if gpu_room is not None else {}
    device, gpu_free, gpu_ahead, gpu_ok = choose_gpu(rooms, [b.gpu_bytes for b in earlier
                                                             if b.gpu_bytes], me.gpu_bytes)
    return Admission(memory_ok and gpu_ok and policy is None, me.size, free, ahead, len(earlier),
                     running, [], gpu_need=me.gpu_bytes, gpu_device=device, gpu_free=gpu_free,
                     gpu_ahead=gpu_ahead, memory_ok=memory_ok, gpu_ok=gpu_ok, policy=policy, **extra)


def _loan(me: Booking, waiting: list[Booking], running: list[Booking], free: int, ramps: Ramps,
          durations: Durations | None, now: float) -> str | None:
    """The LEND line when ``me`` may start on loan: it may be requeued, and it delays no head (none
    waits ahead of it, or with backfill it ends by the head's shadow)."""
    if not me.requeue or me.gpu_bytes:
        return None
    from dispatch.local.admission import backfill, lending

    head_at: tuple[Booking | None, float | None] = (None, None)
    if waiting:
        if durations is None:
            return None
        verdict = backfill.decide(me, waiting, running, free, durations(), now)
        if verdict.head is None or verdict.shadow is None:
            return None
        head_at = verdict.head, verdict.shadow.at
    return lending.lend(me, running, ramps(), free, now, *head_at)


def easy(me: Booking, earlier: list[Booking], later: list[Booking], running: list[Booking],
         free: int, durations: Mapping[str, float], now: float) -> tuple[bool, dict[str, Any]]:
    """The backfill verdict (``dispatch.local.admission.backfill.decide``): whether ``me`` gets in, and its
    ``Admission`` fields (``pass_on``, and the ``backfill`` or ``head`` line that says why)."""
    from dispatch.local.admission import backfill

    verdict = backfill.decide(me, earlier, running, free, durations, now)
    pass_on = not verdict.admit and any(
        not b.gpu_bytes and b.label in durations and b.size <= free for b in later)
    out: dict[str, Any] = {"pass_on": pass_on}
    head, sh = verdict.head, verdict.shadow
    if head is None or sh is None:
        return verdict.admit, out
    start = "never by the estimates" if sh.at == backfill.INF else f"in ~{max(0.0, sh.at - now):.0f}s"
    named = f"head {head.label} (booking {head.id}, need {format_size(head.size)}, room {start})"
    duration = durations.get(me.label)
    if verdict.admit and duration is not None:
        rule = ("ends before it" if verdict.how == "ends"
                else f"fits the {format_size(sh.extra)} left beside it")
        out["backfill"] = (f"BACKFILL {me.label} (booking {me.id}, need {format_size(me.size)}, "
                           f"est {backfill.estimate(duration):.0f}s) ahead of {named}: {rule}")
    elif me.size <= verdict.room:  # it would fit now: only the head's reservation holds it
        if me.gpu_bytes:
            why = "a GPU job does not jump"
        elif duration is None:
            why = "no recorded duration"
        else:
            why = (f"est {backfill.estimate(duration):.0f}s outlasts it and "
                   f"{format_size(sh.extra)} is left beside it")
        out["head"] = f"waiting for {named}: {why}"
    return verdict.admit, out


def passed_over(booking_id: int, earlier: Sequence[Booking], adm: Admission,
                groups: Mapping[str, int] | None, sessions: int | None = None) -> list[str]:
    """The queue log's ``SKIP`` lines for the earlier waiters admission ``adm`` of ``booking_id``
    passes over, each with its reason (a queue policy, else memory)."""
    lines = []
    for b in earlier:
        why = policy_block(b, adm.holders, groups, sessions)
        if why is None:
            why = f"memory {b.label} need {format_size(b.size)} free {format_size(max(0, adm.free))}"
        lines.append(f"SKIP {why} (booking {b.id}, passed by booking {booking_id})")
    return lines
