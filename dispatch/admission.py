"""Admission: wait in FIFO order until the slice has room for a booking (DESIGN.md, "Admission").

Room = slice limit - bookings of running jobs - cache-free usage above those bookings. Waiters watch
the ledger's tick file (a stat every 20 ms) and retry as soon as anything is released, plus once a
second regardless (usage can fall without a release). Only a waiter that could get in takes the write
lock; the others just read. The periodic locked retry, which also reclaims stale bookings, comes every
second for the head of the queue and less often further back, so a long queue does not keep the lock
busy. Every ``status_interval`` a waiter prints one
line naming who holds the room.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dispatch.capping.base import CapBackend
from dispatch.ledger import Admission, Booking, Ledger
from dispatch.units import format_duration, format_size

POLL = 0.02
RECHECK = 1.0
RECHECK_MAX = 10.0


def room_function(backend: CapBackend, limit: int) -> Callable[[int], int]:
    def room(booked: int) -> int:
        used = backend.slice_usage().used
        return limit - booked - max(0, used - booked)

    return room


def stop_reclaimed(backend: CapBackend, reclaimed: list[Booking]) -> None:
    """A dead holder's job may still run: stop its cgroup (nothing may run unbooked)."""
    for booking in reclaimed:
        if booking.cgroup:
            job = backend.job_at(booking.cgroup)
            if job is not None:
                job.kill_all()
                try:
                    job.remove()
                except OSError:
                    pass


def status_line(adm: Admission, now: float | None = None) -> str:
    now = time.time() if now is None else now
    holders = ", ".join(
        f"{b.label} (pid {b.pid}, {format_size(b.size)}, {format_duration(now - (b.since or now))})"
        for b in sorted(adm.holders, key=lambda b: -b.size)
    ) or "nobody (usage outside bookings)"
    ahead = f", {format_size(adm.ahead)} queued ahead" if adm.ahead else ""
    return (f"waiting: {format_size(adm.need)} needed, {format_size(max(0, adm.free))} free{ahead}; "
            f"held by {holders}")


def wait_for_room(
    ledger: Ledger,
    backend: CapBackend,
    host: str,
    booking_id: int,
    limit: int,
    status_interval: float,
    say: Callable[[str], None],
) -> float:
    """Block until admitted; returns the seconds waited."""
    room = room_function(backend, limit)
    started = time.monotonic()
    last_tick: tuple[int, int, int] | None = None
    last_locked = last_status = 0.0
    last_reason = ""
    recheck = RECHECK
    while True:
        tick = ledger.tick()
        now = time.monotonic()
        due = now - last_locked >= recheck
        if tick != last_tick or due:
            last_tick = tick
            adm = ledger.peek(booking_id, host, room)
            recheck = min(RECHECK_MAX, RECHECK * (1 + adm.position))
            if adm.admitted or due:
                last_locked = now
                adm = ledger.try_admit(booking_id, host, room)
                stop_reclaimed(backend, adm.reclaimed)
                if adm.admitted:
                    return time.monotonic() - started
                reason = f"memory: need {format_size(adm.need)}, free {format_size(max(0, adm.free))}"
                if reason != last_reason:  # a write: only on the once-a-second path
                    ledger.set_reason(booking_id, reason)
                    last_reason = reason
            if last_status == 0.0 or now - last_status >= status_interval:
                say(status_line(adm))
                last_status = now
        time.sleep(POLL)
