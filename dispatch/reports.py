"""Read every host's report in parallel, each within ``report_timeout``, all within
``report_deadline``. A host that cannot be read is reported honestly as "could not read: why", and
the others are still shown: the command never hangs past the deadline."""

from __future__ import annotations

import asyncio
import time

from dispatch.errors import HostrunError
from dispatch.records import NamedTuple
from dispatch.settings import Settings

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


async def _read(settings: Settings, name: str, label: str | None, peaks: bool = False
                ) -> dict[str, Any]:
    host = settings.hosts[name]
    if host.is_local:
        from dispatch.report import local_report

        return await asyncio.to_thread(local_report, settings, label, peaks)
    from dispatch.peer import PeerClient

    return await PeerClient(settings, host).report(label, timeout=settings.report_timeout, peaks=peaks)


async def _timed(settings: Settings, name: str, label: str | None, peaks: bool = False
                 ) -> HostReading:
    started = time.monotonic()
    try:
        report = await asyncio.wait_for(_read(settings, name, label, peaks), settings.report_timeout)
        return HostReading(name, report, None, time.monotonic() - started)
    except asyncio.TimeoutError:
        why = f"no answer within {settings.report_timeout:g} s"
    except HostrunError as exc:
        why = str(exc)
    except OSError as exc:
        why = f"{exc.strerror or exc}"
    return HostReading(name, None, why, time.monotonic() - started)


async def read_reports_async(settings: Settings, names: list[str], label: str | None = None,
                             peaks: bool = False) -> list[HostReading]:
    tasks = {name: asyncio.ensure_future(_timed(settings, name, label, peaks)) for name in names}
    done, pending = await asyncio.wait(tasks.values(), timeout=settings.report_deadline)
    for task in pending:
        task.cancel()
    readings = []
    for name, task in tasks.items():
        if task in done:
            readings.append(task.result())
        else:
            readings.append(HostReading(name, None, f"no answer within the {settings.report_deadline:g} s "
                                        "deadline", settings.report_deadline))
    return readings


def read_reports(settings: Settings, names: list[str] | None = None, label: str | None = None,
                 peaks: bool = False) -> list[HostReading]:
    """Reports of ``names`` (default: every configured host), in the configured order; ``peaks``:
    each with its host's own peak table and history (``peak_table``)."""
    chosen = list(settings.hosts) if names is None else names
    return asyncio.run(read_reports_async(settings, chosen, label, peaks))
