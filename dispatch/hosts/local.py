"""The ``local`` kind: this machine, where hostrun's own runner books and runs the job in-process."""

from __future__ import annotations

from collections.abc import Callable

from dispatch.core.hostkeys import LOCAL, LOCAL_KIND
from dispatch.hosts.base import Host, RunExtras

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest


class LocalHost(Host):
    kind = LOCAL
    spec = LOCAL_KIND
    is_here = True

    def report(self, label: str | None = None, peaks: bool = False) -> dict[str, Any]:
        from dispatch.local.report import local_report

        return local_report(self.settings, label, peaks)

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        from dispatch.local.runner import run_local

        return run_local(self.settings, request, say, extras.watch)
