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
    from typing import Optional

    from dispatch.core.reportshape import Report
    from dispatch.hosts.base import Host


class HostReading(NamedTuple):
    """One host's report, or why it could not be read; ``source`` is the ``Host`` it was read from
    (what the renderer and the hooks' table ask how to say it), None for a host not asked."""

    host: str
    report: Optional[Report]
    error: Optional[str]
    elapsed: float
    source: Optional[Host] = None

    @property
    def ok(self) -> bool:
        return self.report is not None


def _timed(host: Host, label: str | None, peaks: bool) -> HostReading:
    started = time.monotonic()
    try:
        report = host.report(label, peaks)
        return HostReading(host.name, report, None, time.monotonic() - started, host)
    except HostrunError as exc:
        why = str(exc)
    except OSError as exc:
        why = f"{exc.strerror or exc}"
    return HostReading(host.name, None, why, time.monotonic() - started, host)


def read_host(host: Host, label: str | None = None, peaks: bool = False) -> HostReading:
    """One host's reading, timed, its failure as its ``error`` (``hostrun top`` reads each host in
    a thread of its own, again and again; its kind's ``before_reading`` is the caller's)."""
    return _timed(host, label, peaks)

def read_reports(settings: Settings, names: list[str] | None = None, label: str | None = None,
                 peaks: bool = False) -> list[HostReading]:
    """Reports of ``names`` (default: every configured host), in the configured order; ``peaks``:
    each with its host's own peak table and history (``peak_table``).

    Hosts elsewhere are read in threads (each call bounded by ``report_timeout``), this host in the
    calling thread meanwhile; whatever has not answered by ``report_deadline`` is reported so.
    """
    from dispatch.hosts.kinds import hosts_of

    chosen = hosts_of(settings, names)
    kinds: list[type[Host]] = []
    for host in chosen:
        if type(host) not in kinds:
            kinds.append(type(host))
            type(host).before_reading(settings)
    started = time.monotonic()
    results: dict[str, HostReading] = {}
    threads = []
    for host in chosen:
        if host.is_here:
            continue

        def work(host: Host = host) -> None:
            results[host.name] = _timed(host, label, peaks)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        threads.append(thread)
    for host in chosen:
        if host.is_here:
            results[host.name] = _timed(host, label, peaks)
    for thread in threads:
        thread.join(max(0.0, settings.report_deadline - (time.monotonic() - started)))
    return [results.get(host.name) or HostReading(
        host.name, None, f"no answer within the {settings.report_deadline:g} s deadline",
        settings.report_deadline, host) for host in chosen]
