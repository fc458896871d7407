"""``hostrun doctor``: which memory-cap backend is active, where the slice is, what the others lack."""

from __future__ import annotations

import os
import sys

from dispatch import __version__
from dispatch.capping import probe_all, select_backend
from dispatch.core.errors import BackendError
from dispatch.core.hostfacts import read_meminfo
from dispatch.core.settings import Settings

MYPY = False
if MYPY:
    from typing import Any


def diagnose(settings: Settings) -> dict[str, Any]:
    host = settings.local
    mem = read_meminfo()
    problems: list[str] = []
    try:
        backend = select_backend(host, mem.total)
        active, slice_path = backend.name, backend.describe()
    except BackendError as exc:
        active, slice_path = "none", ""
        problems.append(str(exc))
    if active == "none" and host.backend == "none":
        problems.append("backend forced to none by the configuration: jobs run only with --no-cap")
    elif active == "none":
        problems.append("no memory-cap backend works here: jobs run only with --no-cap")
    from dispatch.local.recovery import inspect

    ledger_ok, ledger_check = inspect(settings.state_dir)
    if not ledger_ok:
        problems.append(ledger_check)
    kernel_log = _kernel_log_check()
    if kernel_log is not None and not kernel_log["ok"]:
        problems.append(f"this host has NVIDIA GPUs, but {kernel_log['detail']}: jobs are not watched "
                        "for NV_ERR_NO_MEMORY (245 then comes only from a --gpu-memory job's output)")
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "config": settings.source,
        "state_dir": settings.state_dir,
        "ledger": os.path.join(settings.state_dir, "ledger.sqlite3"),
        "ledger_check": {"ok": ledger_ok, "detail": ledger_check},
        "backend": active,
        "forced_backend": host.backend,
        "slice": slice_path,
        "slice_limit": host.slice_limit(mem.total),
        "memory_total": mem.total,
        "heavy_threads": host.threads(),
        "probes": [{"backend": name, "ok": p.ok, "detail": p.detail} for name, p in probe_all(host)],
        "gpu_kernel_log": kernel_log,
        "problems": problems,
    }


def _kernel_log_check() -> dict[str, Any] | None:
    """On a host with NVIDIA GPUs, whether the kernel log can be watched; jobs do not say so each time
    (every job would repeat it), so this is where an unreadable one is told. None without GPUs."""
    from dispatch.core.hostfacts import has_nvidia_gpus

    if not has_nvidia_gpus():
        return None
    from dispatch.local.kernlog import KernelLog

    log = KernelLog()
    log.close()
    return {"ok": log.error is None, "detail": log.error or log.path}


SLOW_ROUND_TRIP = 0.08  # a no-op through a warm ControlMaster costs ~16 ms on these machines


def diagnose_peers(settings: Settings) -> list[dict[str, Any]]:
    """Each peer: can it be read, how long a no-op takes through the warm connection (a login shell
    that loads e.g. pyenv adds that to every command), and where its config and ours disagree."""
    import statistics

    from dispatch.core.errors import HostrunError
    from dispatch.hosts.transport import SshTransport
    from dispatch.placement.reports import read_reports

    results = []
    for name, host in settings.hosts.items():
        if host.is_local:
            continue
        entry: dict[str, Any] = {"host": name, "ssh": host.ssh, "problems": []}
        (reading,) = read_reports(settings, [name])
        entry["ok"] = reading.ok
        if reading.report is None:
            entry["problems"].append(f"could not read: {reading.error}")
            results.append(entry)
            continue
        report = reading.report
        entry.update(agent_version=report.get("agent_version"), python=report.get("python"),
                     backend=report.get("backend"), config=report.get("config"))
        if report.get("config_error"):
            entry["problems"].append(f"its config could not be read: {report['config_error']}")
        for d in report.get("disagreements", []):
            entry["problems"].append(f"{d['key']}: the peer's own config says {d['peer']}, ours says "
                                     f"{d['controller']} (the peer's value is used)")
        if report.get("backend") == "none":
            entry["problems"].append("no memory-cap backend works there: jobs would run uncapped")
        peer = SshTransport(host, settings.state_dir, settings.report_timeout, settings.control_persist)
        try:
            times = [peer.run(["true"], timeout=settings.report_timeout).elapsed for _ in range(3)]
        except HostrunError as exc:
            entry["problems"].append(str(exc))
            results.append(entry)
            continue
        entry["round_trip_ms"] = round(statistics.median(times) * 1000, 1)
        if statistics.median(times) > SLOW_ROUND_TRIP:
            entry["problems"].append(
                f"every command there takes ~{entry['round_trip_ms']:.0f} ms through a warm connection "
                "(~16 ms is normal): its login shell probably does slow work on start (e.g. a "
                ".bashrc that loads pyenv); keep such set-up out of non-interactive shells")
        results.append(entry)
    return results
