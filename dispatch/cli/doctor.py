"""``hostrun doctor``: which memory-cap backend is active, where the slice is, what the others lack."""

from __future__ import annotations

import os
import sys

from dispatch import __version__
from dispatch.capping import probe_all, select_backend
from dispatch.core import BackendError, HostSettings, Settings, read_meminfo

MYPY = False
if MYPY:
    from typing import NotRequired, Optional, TypedDict

    from dispatch.core import AdmissionEngine
    from dispatch.hosts import HostDiagnosis

    class Check(TypedDict):
        ok: bool
        detail: Optional[str]

    class ProbeLine(TypedDict):
        backend: str
        ok: bool
        detail: str

    class Diagnosis(TypedDict):
        """``hostrun doctor``'s answer for this machine (``--json`` prints it), and ``peers``: each
        other host's entry, as its kind diagnoses it."""

        version: str
        python: str
        config: Optional[str]
        state_dir: str
        ledger: str
        ledger_check: Check
        admission_engine: AdmissionEngine
        backend: str
        forced_backend: Optional[str]
        slice: str
        slice_limit: Optional[int]
        slice_from: str
        memory_total: int
        heavy_threads: int
        probes: list[ProbeLine]
        gpu_kernel_log: Optional[Check]
        problems: list[str]
        peers: NotRequired[list[HostDiagnosis]]


def diagnose(settings: Settings) -> Diagnosis:
    host = settings.local
    mem = read_meminfo()
    problems: list[str] = []
    fixed: int | None = None
    try:
        backend = select_backend(host, mem.total)
        active, slice_path, fixed = backend.name, backend.describe(), backend.fixed_limit
    except BackendError as exc:
        active, slice_path = "none", ""
        problems.append(str(exc))
    if active == "none" and host.backend == "none":
        problems.append("backend forced to none by the configuration: jobs run only with --no-cap")
    elif active == "none":
        problems.append("no memory-cap backend works here: jobs run only with --no-cap")
    from dispatch.local import inspect

    ledger_ok, ledger_check = inspect(settings.state_dir)
    if not ledger_ok:
        problems.append(ledger_check)
    kernel_log = _kernel_log_check()
    if kernel_log is not None and not kernel_log["ok"]:
        problems.append(f"this host has NVIDIA GPUs, but {kernel_log['detail']}: jobs are not watched "
                        "for NV_ERR_NO_MEMORY (245 then comes only from a --gpu-memory job's output)")
    from dispatch.core import NoSliceError, sliceadvice

    config = sliceadvice.config_file(settings.source)
    try:
        slice_limit: int | None = fixed if fixed is not None else host.slice_limit(mem.total,
                                                                                   settings.source)
    except NoSliceError as exc:  # the default reserve leaves no slice on this machine
        slice_limit = None
        problems.append(str(exc))
    over = None if fixed is not None or host.slice_bytes is None else sliceadvice.over_ram(
        host.name, host.slice_bytes, mem.total, config)
    if over is not None:
        problems.append(over)
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "config": settings.source,
        "state_dir": settings.state_dir,
        "ledger": os.path.join(settings.state_dir, "ledger.sqlite3"),
        "ledger_check": {"ok": ledger_ok, "detail": ledger_check},
        "admission_engine": _engine(settings),
        "backend": active,
        "forced_backend": host.backend,
        "slice": slice_path,
        "slice_limit": slice_limit,
        "slice_from": _slice_from(host, mem.total, fixed, slice_limit, config),
        "memory_total": mem.total,
        "heavy_threads": host.threads(),
        "probes": [{"backend": name, "ok": p.ok, "detail": p.detail} for name, p in probe_all(host)],
        "gpu_kernel_log": kernel_log,
        "problems": problems,
    }


def _slice_from(host: HostSettings, mem_total: int, fixed: int | None, limit: int | None,
                config: str) -> str:
    """Where the slice's size comes from, in words: what took the rest of the RAM."""
    from dispatch.core import DEFAULT_RESERVE_TEXT, default_reserve, format_size

    if fixed is not None:
        return "the backend's own slice"
    if host.slice_bytes is not None:
        return f"hosts.{host.name}.slice in {config}"
    if host.reserve_bytes is not None:
        return f"RAM less hosts.{host.name}.reserve {format_size(host.reserve_bytes)}"
    reserve = f"the default reserve {DEFAULT_RESERVE_TEXT} = {format_size(default_reserve(mem_total))}"
    return f"none: {reserve} leaves none" if limit is None else f"RAM less {reserve}"


def _engine(settings: Settings) -> AdmissionEngine:
    from dispatch.local import admission_engine

    return admission_engine(settings)  # admitclient.where, within report_timeout


def _kernel_log_check() -> Check | None:
    """On a host with NVIDIA GPUs, whether the kernel log can be watched; jobs do not say so each time
    (every job would repeat it), so this is where an unreadable one is told. None without GPUs."""
    from dispatch.core import has_nvidia_gpus

    if not has_nvidia_gpus():
        return None
    from dispatch.local import KernelLog

    log = KernelLog()
    log.close()
    return {"ok": log.error is None, "detail": log.error or log.path}


def diagnose_peers(settings: Settings) -> list[HostDiagnosis]:
    """Each host that is not this machine, as its kind diagnoses it (``Host.diagnose``) from its
    report read now: for a peer, whether it can be read, its round trip and where its config and
    ours disagree."""
    from dispatch.hosts import hosts_of
    from dispatch.placement import read_reports

    results = []
    for host in hosts_of(settings):
        if host.is_here:
            continue  # diagnose() above
        (reading,) = read_reports(settings, [host.name])
        entry = host.diagnose(reading)
        if entry is not None:
            results.append(entry)
    return results
