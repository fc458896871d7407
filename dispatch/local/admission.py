"""Admission: wait in FIFO order until the slice has room for a booking (docs/design.md, "A local
run"; docs/admission.md).

Room = slice limit - bookings of running jobs - cache-free usage above those bookings. A waiter
blocks on its own doorbell FIFO (``dispatch.local.wakeup``): a release rings the head of the queue,
an admission rings the next waiter when one behind could fit the room left
(``admitpolicy.may_follow``), and a woken waiter that cannot get in rings the next only while
those behind it still could (it is held by a queue policy, or only VRAM blocks it, or, with
``queue_policy = "backfill"``, a later waiter with a recorded duration fits the room now and may jump
it); otherwise one that lacks memory stops the chain, as every later waiter reserves its memory
too. So a freed slot is taken at
once and a release wakes one or two waiters, not all. A rung waiter reads the ledger and takes the
write lock only if it could get in, or when the ring says a waiter ahead of it is dead (its FIFO had
no reader): that locked try reclaims the dead one's booking. A safety retry, locked, comes every
second for the head of the queue and less often further back (usage can fall without a release; a
releaser may die before it rings). Every ``status_interval`` a waiter prints one line naming who holds
the room. ``HOSTRUN_WAIT_RECHECK`` (seconds; a test hook) replaces the safety retry's period.

A job with ``--gpu-memory`` also needs a GPU whose room (free VRAM now, less what running GPU
bookings on it have yet to allocate) covers its request. nvidia-smi is read before each attempt,
never inside the ledger's write lock, and at most once a second (``dispatch.local.gpu.GpuSnapshot``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.core.hostfacts import MemInfo, read_meminfo
from dispatch.core.units import format_duration, format_size
from dispatch.local.admitpolicy import Admission, Room
from dispatch.local.ledger import Ledger
from dispatch.local.ledgerdb import Booking

MYPY = False
if MYPY:
    from dispatch.local.gpu import GpuSnapshot
    from dispatch.local.wakeup import Doorbell

RECHECK = 1.0
RECHECK_MAX = 10.0
RECHECK_ENV = "HOSTRUN_WAIT_RECHECK"  # test hook: the safety retry's period, to show the rings alone


USAGE_SLACK = 32 << 20


def room_function(backend: CapBackend, limit: int,
                  meminfo: Callable[[], MemInfo] = read_meminfo) -> Callable[[list[Booking]], Room]:
    """Room = the slice's room, or the machine's when that is less (``Room.note`` then says so).

    The slice's: limit - booked - usage above the bookings, ignoring the first ``USAGE_SLACK`` of it.
    The slack absorbs what is in the slice without being a running job's: each waiting job's forked,
    not yet exec'd process sits in its own cgroup (a few KiB to a few MiB), and kernel memory is
    charged in page-sized steps. Without it a booking as large as the slice could never start.

    The machine's: MemAvailable less what running bookings have yet to use (``not_at_peak``). The
    slice only bounds hostrun's jobs; memory used outside it (a desktop, a browser, a model server, a
    reserve set too small) can leave the machine short while the slice looks empty, and a job admitted
    then would start into a machine-wide OOM.
    """
    def room(running: list[Booking]) -> Room:
        booked = sum(b.size for b in running)
        used = backend.slice_usage().used
        in_slice = slice_room(limit, booked, used)
        plain = used <= booked + USAGE_SLACK  # nothing above the bookings counted (Room.plain)
        try:
            mem = meminfo()
        except OSError:
            return Room(in_slice, plain=plain)
        if mem.available - booked >= in_slice:
            # What running bookings have yet to use is at most what they booked, so the machine
            # holds the slice's room whatever they use: no job's memory need be read (a try of the
            # admission engine's, after every change, read every running job's cgroup).
            return Room(in_slice, plain=plain)
        yet = not_at_peak(backend, running)
        on_machine = mem.available - yet
        if on_machine >= in_slice:
            # A booking of N more leaves the slice exactly N less, and the machine at least N less
            # (what it has yet to use grows by at most N): the slice still holds the room.
            return Room(in_slice, plain=plain)
        return Room(on_machine, f"the machine has {format_size(max(0, on_machine))} available "
                                f"(MemAvailable {format_size(mem.available)} less {format_size(yet)} "
                                "booked by running jobs and not yet used): memory used outside the "
                                "slice holds it")

    return room


def booking_job(backend: CapBackend, booking: Booking) -> JobCgroup | None:
    """The job cgroup a ledger row names, if it is one of the slice's and the one the row's own
    holder made (its name carries the holder's pid and start time): a row, stale or written by
    someone else, pointing at another live job's cgroup must never get that job killed."""
    if not booking.cgroup:
        return None
    expected = backend.job_name(f"{booking.pid}-{booking.pid_start}")
    if os.path.basename(booking.cgroup.rstrip("/")) != expected:
        return None
    return backend.job_at(booking.cgroup)


def not_at_peak(backend: CapBackend, running: Sequence[Booking]) -> int:
    """What running bookings have yet to use: each booking less its job's memory in use now."""
    total = 0
    for b in running:
        job = booking_job(backend, b)
        total += max(0, b.size - (job.in_use() if job is not None else 0))
    return total


def slice_room(limit: int, booked: int, used: int) -> int:
    """The one definition of a slice's room, shared by admission, the report and so the dispatcher:
    limit - running bookings - cache-free usage above them beyond ``USAGE_SLACK``."""
    return limit - booked - max(0, used - booked - USAGE_SLACK)


def stop_reclaimed(backend: CapBackend, reclaimed: list[Booking]) -> None:
    """A dead holder's job may still run: stop its cgroup (nothing may run unbooked)."""
    for booking in reclaimed:
        job = booking_job(backend, booking)
        if job is not None:
            job.kill_all()
            try:
                job.remove()
            except OSError:
                pass


def gpu_room_function(backend: CapBackend, snapshot: GpuSnapshot
                      ) -> Callable[[list[Booking]], dict[int, int]]:
    """Room per GPU for the ledger: the snapshot's figures less running GPU bookings' unallocated part.

    A running job's processes (its cgroup's ``cgroup.procs``) are matched against nvidia-smi's
    per-process usage; where they cannot be, the whole booking is taken off.
    """
    def gpu_room(running: list[Booking]) -> dict[int, int]:
        held: list[tuple[int, int, Sequence[int]]] = []
        for b in running:
            if b.gpu_index is None or not b.gpu_bytes:
                continue
            job = booking_job(backend, b) if snapshot.apps else None
            held.append((b.gpu_index, b.gpu_bytes, job.pids() if job is not None else []))
        return snapshot.rooms(held)

    return gpu_room


def _holder(b: Booking, now: float) -> str:
    vram = f", {format_size(b.gpu_bytes)} VRAM on GPU {b.gpu_index}" if b.gpu_index is not None else ""
    return f"{b.label} (pid {b.pid}, {format_size(b.size)}{vram}, {format_duration(now - (b.since or now))})"


def status_line(adm: Admission, now: float | None = None, gpu_error: str | None = None) -> str:
    """One line: what the job waits for (memory, VRAM, a queue policy) and who holds it."""
    now = time.time() if now is None else now
    holders = list(adm.holders)
    if adm.policy is not None:  # --group / --when-idle: name the running jobs that hold it
        if adm.policy.startswith("group-cap"):
            group = adm.policy.split()[1]
            holders = [b for b in holders if b.grp == group]
        held = ", ".join(_holder(b, now) for b in holders)
        return f"waiting: {adm.policy}; held by {held or 'nobody'}"
    parts = []
    if adm.memory_ok and not adm.gpu_ok:  # only VRAM blocks: name the holders of that GPU (of any)
        holders = [b for b in holders if b.gpu_index is not None
                   and (adm.gpu_device is None or b.gpu_index == adm.gpu_device)]
    else:
        ahead = f", {format_size(adm.ahead)} queued ahead" if adm.ahead else ""
        parts.append(f"{format_size(adm.need)} needed, {format_size(max(0, adm.free))} free{ahead}")
        if adm.machine:
            parts.append(adm.machine)
        if adm.head:
            parts.append(adm.head)
    if not adm.gpu_ok:
        if gpu_error:
            parts.append(f"{format_size(adm.gpu_need)} VRAM needed; cannot read the GPUs: {gpu_error}")
        elif adm.gpu_device is None:
            parts.append(f"{format_size(adm.gpu_need)} VRAM needed, no GPU reports free memory")
        else:
            ahead = f", {format_size(adm.gpu_ahead)} VRAM queued ahead" if adm.gpu_ahead else ""
            parts.append(f"{format_size(adm.gpu_need)} VRAM needed, "
                         f"{format_size(max(0, adm.gpu_free or 0))} free on GPU {adm.gpu_device}{ahead}")
    key = (lambda b: -(b.gpu_bytes or 0)) if adm.memory_ok and not adm.gpu_ok else (lambda b: -b.size)
    held = ", ".join(_holder(b, now) for b in sorted(holders, key=key))
    return f"waiting: {'; '.join(parts)}; held by {held or 'nobody (usage outside bookings)'}"


def wait_reason(adm: Admission, gpu_error: str | None = None) -> str:
    """The short reason stored with the queue entry (``hostrun ledger`` shows it)."""
    if adm.policy is not None:
        return adm.policy
    reasons = []
    if not (adm.memory_ok and not adm.gpu_ok):  # memory is short (or all there is to wait for)
        reasons.append(f"memory: need {format_size(adm.need)}, free {format_size(max(0, adm.free))}")
        if adm.machine:
            reasons.append(adm.machine)
        if adm.head:
            reasons.append(adm.head)
    if not adm.gpu_ok:
        if gpu_error or adm.gpu_device is None:
            reasons.append(f"vram: need {format_size(adm.gpu_need)}, {gpu_error or 'no GPU room known'}")
        else:
            reasons.append(f"vram: need {format_size(adm.gpu_need)}, free "
                           f"{format_size(max(0, adm.gpu_free or 0))} on GPU {adm.gpu_device}")
    return "; ".join(reasons)


def wait_for_room(
    ledger: Ledger,
    backend: CapBackend,
    host: str,
    booking_id: int,
    limit: int,
    status_interval: float,
    say: Callable[[str], None],
    gpu: GpuSnapshot | None = None,
    on_wait: Callable[[Admission], None] | None = None,
    groups: Mapping[str, int] | None = None,
    backfill: bool = False,
    room: Callable[[list[Booking]], Room] | None = None,
) -> float:
    """Block until admitted; returns the seconds waited.

    With ``gpu`` (a ``--gpu-memory`` booking) a GPU must have room too; the device chosen is in the
    booking's ``gpu_index`` afterwards. ``on_wait`` gets each status line's figures (at once, then
    every ``status_interval``): the peer alert watch hooks in there. ``backfill``: queue_policy
    "backfill" (``Ledger.try_admit``). ``room``: instead of this host's slice and machine (a shared
    slice's daemon has admitted the job already: only this user's own rules are left to wait on).
    """
    base = float(os.environ.get(RECHECK_ENV) or RECHECK)
    if room is None:
        room = room_function(backend, limit)
    gpu_room = gpu_room_function(backend, gpu) if gpu is not None else None
    started = time.monotonic()
    last_locked = last_status = 0.0
    recheck = base
    bell: Doorbell | None = None  # made only once the job must wait: none on the path of most runs
    first = True  # the first try is under the lock (it reclaims stale bookings)
    rung = ""  # the rings that woke this pass ("R": a waiter ahead is dead, try under the lock)

    def why(adm: Admission) -> str:
        return wait_reason(adm, gpu.error if gpu is not None else None)

    try:
        while True:
            now = time.monotonic()
            due = first or "R" in rung or now - last_locked >= recheck
            if gpu is not None:  # outside the write lock; at most once a second
                gpu.refresh(lambda: any(b.gpu_index is not None for b in ledger.bookings(host)))
            if not due:  # a plain read; the write lock only if it could get in
                adm = ledger.peek(booking_id, host, room, gpu_room, groups, backfill)
                due = adm.admitted
            if due:
                last_locked = now
                adm = ledger.try_admit(booking_id, host, room, gpu_room, groups, why, backfill)
                stop_reclaimed(backend, adm.reclaimed)
                if adm.admitted:  # try_admit rang the next waiter, if one may follow
                    return time.monotonic() - started
            recheck = min(max(base, RECHECK_MAX), base * (1 + adm.position))
            if rung and (adm.policy is not None or adm.memory_ok or adm.pass_on):
                ledger.wake_next(host, booking_id)  # those behind may still fit: pass the ring on
            if last_status == 0.0 or now - last_status >= status_interval:
                say(status_line(adm, gpu_error=gpu.error if gpu is not None else None))
                last_status = now
                if on_wait is not None:
                    on_wait(adm)
            first = False
            if bell is None:  # then look once more: a ring before the bell existed went elsewhere
                from dispatch.local.wakeup import Doorbell

                bell = Doorbell(ledger.state_dir, booking_id)
                rung = ""
                continue
            wake_at = min(last_locked + recheck, last_status + status_interval)
            rung = bell.wait(wake_at - time.monotonic())
    finally:
        if bell is not None:
            bell.close()
