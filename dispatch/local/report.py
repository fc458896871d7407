"""This host's resources at a moment, as a plain dict ready for JSON (docs/design.md, "Concepts").

Standard library only: the same code produces a peer's report when shipped there.
"""

from __future__ import annotations

import os
import time

from dispatch import __version__
from dispatch.core.hostfacts import cores, read_loadavg
from dispatch.core.settings import Settings
from dispatch.local.admission.ledger import Ledger
from dispatch.local.admission.rooms import booking_job, slice_room
from dispatch.local.hostslice import LocalSlice
from dispatch.local.sessions.sessionties import ties

MYPY = False
if MYPY:  # typing stays off the report path (a report is asked before every heavy command)
    from dispatch.core.reportshape import (
        AdmissionEngine,
        Gpu,
        MachineJob,
        MachineReport,
        PeakRecordData,
        SessionsNow,
    )
    from dispatch.local.store.ledgerdb import PeakRecord


def local_report(settings: Settings, label: str | None = None, peaks: bool = False) -> MachineReport:
    """This host's report; with ``label``, also that label's record in this host's peak table; with
    ``peaks``, this host's whole peak table and peak history (``peak_table``, for capacity planning)."""
    here = LocalSlice(settings)
    host, mem, backend, limit = here.host, here.mem, here.backend, here.limit
    usage = backend.slice_usage()
    ledger = Ledger(settings.state_dir, live_jobs=here.live_jobs)
    try:
        bookings = ledger.bookings(host.name)
        peak = ledger.peak(label, host.name) if label else None
        table = None
        if peaks:
            from dispatch.local.capacity import peak_table

            table = peak_table([p for p in ledger.peaks() if p.host == host.name],
                               ledger.peak_runs(host.name))
    finally:
        ledger.close()
    running = [b for b in bookings if b.state == "running"]
    waiting = [b for b in bookings if b.state == "waiting"]
    now = time.time()
    jobs: list[MachineJob] = []
    yet = 0
    found = [(b, booking_job(backend, b)) for b in running]
    sessions, inside = ties(backend, found)
    for b, job in found:
        in_use = job.in_use() if job is not None else 0
        yet += max(0, b.size - in_use)  # as admission.not_at_peak, with each job's use kept
        jobs.append({
            "id": b.id, "label": b.label, "pid": b.pid, "kind": b.kind, "booked": b.size,
            "cap": b.cap, "in_use": in_use, "age_s": round(now - (b.since or now), 1),
            "session": b.session, "command": b.command,
            "role": "session" if b.id in sessions else "job", "in_session": inside.get(b.id),
        })
    load = read_loadavg()
    gpus, gpu_error = _gpus()
    booked = sum(b.size for b in running)
    data: MachineReport = {
        "host": host.name,
        "hostname": os.uname().nodename,
        "version": __version__,
        "time": now,
        "backend": backend.name,
        "slice_path": backend.describe(),
        "memory": {"total": mem.total, "available": mem.available,
                   "available_for_jobs": max(0, mem.available - yet)},
        "slice": {
            "limit": limit,
            "used": usage.used,
            "usage_with_cache": usage.usage,
            "reclaimable": max(0, usage.usage - usage.held),
            "booked": booked,
            "booked_not_at_peak": yet,
            "queued": sum(b.size for b in waiting),
            "free": slice_room(limit, booked, usage.used),
        },
        "load": list(load),
        "cores": cores(),
        "heavy_threads": host.threads(),
        "threads_free": threads_free(host.threads(), load[0]),
        "gpus": gpus,
        "gpu_error": gpu_error,
        "running": jobs,
        "queue_length": len(waiting),
        "label_peak": peak_data(peak) if peak else None,
        "settings": {
            "slice_bytes": host.slice_bytes, "reserve_bytes": host.reserve_bytes,
            "default_cap": host.default_cap, "gamble_size": settings.gamble_size_for(host),
            # an ssh key: None for this machine (kept, the report's shape stays)
            "peer_memory_cap": host.options.get("peer_memory_cap"), "state_dir": settings.state_dir,
            "sessions": {"limit": settings.sessions.limit(limit), "share": settings.sessions.share,
                         "cap": settings.sessions.cap, "first_booking": settings.sessions.first_booking,
                         "high": settings.sessions.high},
        },
        "sessions": sessions_now(jobs, settings.sessions.limit(limit)),
        "queue": [
            {"id": b.id, "label": b.label, "pid": b.pid, "need": b.size, "reason": b.reason,
             "waited_s": round(now - b.queued, 1), "session": b.session}
            for b in waiting
        ],
    }
    if table is not None:
        data["peak_table"] = table
    return data


def sessions_now(running: list[MachineJob], limit: int) -> SessionsNow:
    """The running sessions together, against the sessions slice's ``limit``: how many, what they
    booked and use, and how many jobs they started run now."""
    sessions = [j for j in running if j.get("role") == "session"]
    return {"count": len(sessions), "booked": sum(j["booked"] or 0 for j in sessions),
            "in_use": sum(j.get("in_use", 0) for j in sessions),
            "jobs": sum(1 for j in running if j.get("in_session") is not None), "limit": limit}


def admission_engine(settings: Settings) -> AdmissionEngine:
    """Where the admission engine of ``settings`` runs (``admitclient.where``: its socket and the
    pid its hello gives, or why none answers), asked within ``report_timeout``: an engine that
    is stopped or hung must not hold ``hostrun report`` or ``doctor`` with it.

    Asked by ``hostrun report`` for this host alone, never in ``local_report``: every reading of the
    report (``hostrun top``, the dispatcher, the agent's report daemon) would otherwise connect to
    the engine, and an engine leaves only after a while with no connection."""
    import threading

    from dispatch.local.engine.admitclient import where
    from dispatch.local.engine.reach import digest_of, socket_path

    found: list[AdmissionEngine] = []

    def ask() -> None:
        try:
            found.append(_shared_engine(settings) or where(settings))  # type: ignore[arg-type]
        except Exception as exc:  # said in the report, as a refusal to connect is
            found.append({"socket": None, "pid": None, "detail": f"cannot tell: {exc}"})

    thread = threading.Thread(target=ask, name="admission-engine", daemon=True)
    thread.start()
    thread.join(settings.report_timeout)
    if found:
        return found[0]
    return {"socket": socket_path(settings.state_dir, digest_of(settings)[0]), "pid": None,
            "detail": f"does not answer within {settings.report_timeout:g} s (stopped or hung?)"}


def _shared_engine(settings: Settings) -> AdmissionEngine | None:
    """The shared slice's engine, when this host's runs book there (``sharedlink.shared_here``)."""
    from dispatch.core.errors import HostrunError
    from dispatch.local.shared.sharedlink import shared_here

    try:
        here = shared_here(settings)
    except HostrunError as exc:  # a member whose shared slice does not answer
        return {"socket": None, "pid": None, "detail": str(exc)}
    if here is None:
        return None
    from dispatch.capping.shared import hello

    socket = here.backend.engine_socket
    assert socket is not None  # shared_here's slices have their own engine
    try:
        pid = hello(socket).get("pid")
    except HostrunError as exc:
        return {"socket": socket, "pid": None, "detail": str(exc)}
    return {"socket": socket, "pid": pid if isinstance(pid, int) else None,
            "detail": f"the shared slice's, running as root, pid {pid}"}


REPORT_LEFT_OUT = ("ramp", "min_duration")  # admission's own (``lending``): no placement reads them


def peak_data(peak: PeakRecord) -> PeakRecordData:
    """A peak record as a report carries it (less what only this host's admission reads)."""
    data = peak._asdict()
    for name in REPORT_LEFT_OUT:
        del data[name]
    return data  # type: ignore[return-value]  # its other fields are PeakRecordData's keys


def threads_free(heavy_threads: int, load1: float) -> int:
    """Heavy threads still free: the heavy-thread default less the 1-minute load average (rounded).
    The load counts every runnable thread on the host, hostrun's jobs or not, so it says what a new
    job would really compete with."""
    return max(0, heavy_threads - int(load1 + 0.5))


def _gpus() -> tuple[list[Gpu], str | None]:
    """Per device: index, uuid, name, total/used/free bytes; no nvidia-smi means no GPUs, not an
    error. A failing nvidia-smi is reported, and the rest of the report still stands."""
    from dispatch.core.errors import GpuError
    from dispatch.local.gpus.gpu import read_gpus

    try:
        return [g._asdict() for g in read_gpus()], None  # type: ignore[misc]  # Gpu's keys
    except GpuError as exc:
        return [], str(exc)
