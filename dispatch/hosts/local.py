"""The ``local`` kind: this machine, where hostrun's own runner books and runs the job in-process."""

from __future__ import annotations

from dispatch.core.hostkeys import LOCAL, LOCAL_KIND
from dispatch.hosts.base import RunExtras
from dispatch.hosts.machine import MachineHost

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.core.outcome import Outcome
    from dispatch.core.reportshape import MachineReport
    from dispatch.core.request import RunRequest


class LocalHost(MachineHost):
    kind = LOCAL
    spec = LOCAL_KIND
    is_here = True

    def report(self, label: str | None = None, peaks: bool = False) -> MachineReport:
        from dispatch.local.report import local_report

        return local_report(self.settings, label, peaks)

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        from dispatch.local.run.localrun import run_local

        return run_local(self.settings, request, say, extras.watch, park=extras.park)
