"""``Host``: where a job runs, as one small interface that every part asks instead of branching on
a host's name or kind (docs/design.md, "Where to add a host kind").

A kind is a subclass in its own module (``dispatch.hosts.local.LocalHost``,
``dispatch.hosts.ssh.SshPeer``), its settings declared once as a ``KindSpec``
(``dispatch.core.hostkeys``), registered in ``dispatch.hosts.kinds``.
"""

from __future__ import annotations

from collections.abc import Callable

from dispatch.core.hostkeys import KindSpec
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.hosts.judgement import HostPending, Job, Judgement


class RunExtras(NamedTuple):
    """What a run needs besides the ``RunRequest``: for a run sent elsewhere, the tree to sync, the
    paths to bring back and whether stdin goes along; for a run here, the callback a waiting job
    calls (``dispatch.placement.auto.PeerWatch``)."""

    tree: Optional[str] = None
    returns: tuple[str, ...] = ()
    stdin: bool = False
    watch: Optional[Callable[[Any], None]] = None


class Host:
    """One configured host (``[hosts.NAME]``) of one kind.

    ``settings`` is the whole configuration (as everywhere in hostrun), ``table`` this host's own
    (``[hosts.NAME]``, a ``HostSettings``). The methods are the questions the dispatcher,
    ``--auto``/``--peer``, ``report`` and ``doctor`` ask a host.
    """

    kind = ""  # the ``kind`` key's value
    spec = KindSpec("")  # its settings: its own keys and rules (``dispatch.core.hostkeys``)
    is_here = False  # this machine: its report is read in this process, a job queues here

    def __init__(self, settings: Settings, table: HostSettings) -> None:
        self.settings = settings
        self.table = table

    @property
    def name(self) -> str:
        return self.table.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @classmethod
    def before_reading(cls, config: Settings) -> None:
        """Called once per kind before its hosts' reports are read in parallel: a check that must
        refuse (exit 2) before any of them is contacted."""

    def report(self, label: str | None = None, peaks: bool = False) -> dict[str, Any]:
        """The host's report (``dispatch.local.report``'s shape) with ``label``'s peak record;
        ``peaks``: its whole peak table. Raises HostrunError when it cannot be read."""
        raise NotImplementedError

    def judge(self, job: Job, report: dict[str, Any], waiting: HostPending | None) -> Judgement | None:
        """Whether ``job`` fits there now, by the kind's own rule, from the ``report`` just read and
        the bookings still ``waiting`` to show in it; None: the dispatcher's slice rule applies (a
        machine running hostrun's own runner: its slice's free room covers the job's booking)."""
        return None

    def job_cap(self, cap: int | None, default_cap: int | None) -> int | None:
        """The cap a job with ``-m cap`` runs under there, given the ``default_cap`` that applies
        there (from its report, or this config's table): the dispatcher judges and books that."""
        return cap if cap is not None else default_cap

    def cap_problem(self, limit: int | None) -> str | None:
        """Why a job limited to ``limit`` bytes may never be sent there (e.g. a peer's
        ``peer_memory_cap``), or None."""
        return None

    def check_cap(self, cap: int | None) -> None:
        """Refuse a job sent there with ``-m cap`` that it would not take (249), before contacting it."""

    def pending_estimate(self, cap: int | None) -> int:
        """What a job sent there without reading its report will book: the cap it will run under
        (a peak booking is never larger), else its gamble size."""
        size = self.job_cap(cap, self.table.default_cap)
        return size if size is not None else self.settings.gamble_size_for(self.table)

    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        """Run the job there, to its end; the outcome is the caller's to render."""
        raise NotImplementedError

    def summary(self, report: dict[str, Any]) -> str:
        """One line on what the host has free now, from its report just read (the agent hooks'
        resource table): here a machine running hostrun's own runner; a kind with another shape
        says its own."""
        from dispatch.core.units import format_size

        load = report.get("load") or [0.0]
        slice_ = report.get("slice") or {}
        memory = report.get("memory") or {}
        return (f"load {load[0]:.1f} on {report.get('cores', '?')} cores, "
                f"{report.get('threads_free', '?')} of {report.get('heavy_threads', '?')} heavy "
                f"threads free, memory available {format_size(memory.get('available_for_jobs'))}, "
                f"slice {format_size(slice_.get('free'))} free of {format_size(slice_.get('limit'))}, "
                f"{report.get('queue_length', 0)} queued, {len(report.get('running') or [])} running, "
                f"GPUs: {_gpus(report)}")

    def diagnose(self, reading: Any) -> dict[str, Any] | None:
        """``hostrun doctor``'s entry for this host from its report just read (a ``HostReading``), or
        None when doctor's own checks of this machine cover it. Besides ``ok`` and ``problems``, the
        entry carries how doctor names it: ``title``, ``details`` (what it found, when it could read
        it) and ``unread`` (the word for a host it could not read)."""
        return None


def _gpus(report: dict[str, Any]) -> str:
    from dispatch.core.units import format_size

    gpus = report.get("gpus") or []
    if report.get("gpu_error"):
        return f"unreadable ({report['gpu_error']})"
    if not gpus:
        return "none"
    return ", ".join(f"{g.get('index')}: {format_size(g.get('free'))} free of {format_size(g.get('total'))}"
                     for g in gpus)
