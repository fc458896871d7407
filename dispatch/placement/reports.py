"""Read every host's report in parallel, each within ``report_timeout``, all within
``report_deadline``. A host that cannot be read is reported honestly as "could not read: why", and
the others are still shown: the command never hangs past the deadline."""

from __future__ import annotations

import threading
import time

from dispatch.core.errors import HostrunError
from dispatch.core.records import NamedTuple
from dispatch.core.settings import Settings

MYPY = False
if MYPY:
    from typing import Any, Optional


class HostReading(NamedTuple):
    host: str
    report: Optional[dict[str, Any]]
    error: Optional[str]
    elapsed: float

    @property
    def ok(self) -> bool:
        return self.report is not None


def _read(settings: Settings, name: str, label: str | None, peaks: bool) -> dict[str, Any]:
    host = settings.hosts[name]
    if host.is_local:
        from dispatch.local.report import local_report

        return local_report(settings, label, peaks)
    from dispatch.hosts.peer import PeerClient

    return PeerClient(settings, host).report(label, timeout=settings.report_timeout, peaks=peaks)


def _timed(settings: Settings, name: str, label: str | None, peaks: bool) -> HostReading:
    started = time.monotonic()
    try:
        report = _read(settings, name, label, peaks)
        return HostReading(name, report, None, time.monotonic() - started)
    except HostrunError as exc:
        why = str(exc)
    except OSError as exc:
        why = f"{exc.strerror or exc}"
    return HostReading(name, None, why, time.monotonic() - started)


def read_reports(settings: Settings, names: list[str] | None = None, label: str | None = None,
                 peaks: bool = False) -> list[HostReading]:
    """Reports of ``names`` (default: every configured host), in the configured order; ``peaks``:
    each with its host's own peak table and history (``peak_table``).

    Peers are read in threads (each ssh call bounded by ``report_timeout``), this host in the
    calling thread meanwhile; whatever has not answered by ``report_deadline`` is reported so.
    """
    chosen = list(settings.hosts) if names is None else names
    if any(not settings.hosts[name].is_local for name in chosen):
        # Refuse an untrusted ControlMaster directory once, up front, before any ssh (exit 2).
        from dispatch.hosts.transport import control_dir, ensure_control_dir

        ensure_control_dir(control_dir(settings.state_dir))
    started = time.monotonic()
    results: dict[str, HostReading] = {}
    threads = []
    for name in chosen:
        if settings.hosts[name].is_local:
            continue

        def work(name: str = name) -> None:
            results[name] = _timed(settings, name, label, peaks)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        threads.append(thread)
    for name in chosen:
        if settings.hosts[name].is_local:
            results[name] = _timed(settings, name, label, peaks)
    for thread in threads:
        thread.join(max(0.0, settings.report_deadline - (time.monotonic() - started)))
    return [results.get(name) or HostReading(
        name, None, f"no answer within the {settings.report_deadline:g} s deadline",
        settings.report_deadline) for name in chosen]
