"""Admission's shared pieces: a slice's room (``room_function``, ``slice_room``), a GPU's
(``gpu_room_function``), the job cgroup a booking names (``booking_job``), and the waiting line and
reason that say what holds a booking up (``status_line``, ``wait_reason``). The admission engine
(``dispatch.local.engine.admitd``) tries its waiters with them (docs/design.md, "A local run";
docs/admission.md).

Room = slice limit - bookings of running jobs - cache-free usage above those bookings, or the
machine's available memory when less. A job with ``--gpu-memory`` also needs a GPU whose room (free
VRAM now, less what running GPU bookings on it have yet to allocate) covers its request.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from dispatch.capping.base import CapBackend, JobCgroup
from dispatch.core.hostfacts import MemInfo, read_meminfo
from dispatch.core.units import format_duration, format_size
from dispatch.local.admission.policy import Admission, Room
from dispatch.local.store.ledgerdb import Booking

MYPY = False
if MYPY:
    from dispatch.local.gpus.gpu import GpuSnapshot

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
        try:
            mem = meminfo()
        except OSError:
            return Room(in_slice)
        if mem.available - booked >= in_slice:
            # What running bookings have yet to use is at most what they booked, so the machine
            # holds the slice's room whatever they use: no job's memory need be read (a try of the
            # admission engine's, after every change, read every running job's cgroup).
            return Room(in_slice)
        yet = not_at_peak(backend, running)
        on_machine = mem.available - yet
        if on_machine >= in_slice:
            # A booking of N more leaves the slice exactly N less, and the machine at least N less
            # (what it has yet to use grows by at most N): the slice still holds the room.
            return Room(in_slice)
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
    holder = f"{booking.pid}-{booking.pid_start}"
    if os.path.basename(booking.cgroup.rstrip("/")) not in backend.names_of(holder):
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


