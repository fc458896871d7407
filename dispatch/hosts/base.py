"""``Host``: where a job runs, as one small interface that every part asks instead of branching on
a host's name or kind (docs/design.md, "Where to add a host kind").

A kind is a subclass in its own module (``dispatch.hosts.local.LocalHost``,
``dispatch.hosts.ssh.kind.SshPeer``, ``dispatch.hosts.slurm.kind.SlurmHost``), its settings declared once as a
``KindSpec`` (``dispatch.core.hostkeys``), registered in ``dispatch.hosts.kinds``. A kind whose
hosts run hostrun's own runner (this machine, an ssh peer's agent) derives from ``MachineHost``
(``dispatch.hosts.machine``), which reads and describes that runner's report.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dispatch.core.hostkeys import KindSpec
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any, Optional

    from dispatch.core.outcome import Outcome
    from dispatch.core.reportshape import Report
    from dispatch.core.request import RunRequest
    from dispatch.core.settings import HostSettings, Settings
    from dispatch.core.view import Block, Gauge
    from dispatch.hosts.diagnosis import HostDiagnosis
    from dispatch.hosts.judgement import HostPending, Job, Judgement


class RunExtras(NamedTuple):
    """What a run needs besides the ``RunRequest``: for a run sent elsewhere, the tree to sync, the
    paths to bring back and whether stdin goes along; for a run here, the callback a waiting job
    calls (``dispatch.placement.auto.PeerWatch``) and whether a long wait may park this process
    (the run is its own command line, so running that line again resumes it)."""

    tree: Optional[str] = None
    returns: tuple[str, ...] = ()
    stdin: bool = False
    watch: Optional[Callable[[Any], None]] = None
    park: bool = False


class Host(ABC):
    """One configured host (``[hosts.NAME]``) of one kind.

    ``settings`` is the whole configuration (as everywhere in hostrun), ``table`` this host's own
    (``[hosts.NAME]``, a ``HostSettings``). The methods are the questions the dispatcher,
    ``--auto``/``--peer``, ``report``, ``doctor`` and the agent hooks ask a host; a kind must answer
    the abstract ones (read its report, run a job, say what it has free, describe its report), the
    others have the answer of a machine running hostrun's own runner.
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
        return None  # most kinds have none

    @abstractmethod
    def report(self, label: str | None = None, peaks: bool = False) -> Report:
        """The host's report (``dispatch.core.reportshape``) with ``label``'s peak record;
        ``peaks``: its whole peak table. Raises HostrunError when it cannot be read."""

    @abstractmethod
    def judge(self, job: Job, report: Report, waiting: HostPending | None) -> Judgement:
        """Whether ``job`` fits there now (and could ever), by the kind's own rule, from the
        ``report`` just read and the bookings still ``waiting`` to show in it (a machine: its
        slice's free room covers the job's booking; a cluster: one node's)."""

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
        return None  # most kinds refuse no cap

    def pending_estimate(self, cap: int | None) -> int:
        """What a job sent there without reading its report will book: the cap it will run under
        (a peak booking is never larger), else its gamble size."""
        size = self.job_cap(cap, self.table.default_cap)
        return size if size is not None else self.settings.gamble_size_for(self.table)

    @abstractmethod
    def run(self, request: RunRequest, say: Callable[[str], None], extras: RunExtras) -> Outcome:
        """Run the job there, to its end; the outcome is the caller's to render."""

    @abstractmethod
    def summary(self, report: Report) -> str:
        """One line on what the host has free now, from its report just read (the agent hooks'
        resource table)."""

    @abstractmethod
    def describe(self, report: Report) -> list[Block]:
        """Its report as ``hostrun report`` shows it (``dispatch.core.view``: lines and tables)."""

    def gauges(self, report: Report) -> list[Gauge]:
        """Its panel in ``hostrun top``: a few lines, each a bar and its words
        (``dispatch.core.view.Gauge``); a kind that says nothing more has its summary line."""
        from dispatch.core.view import Gauge

        return [Gauge("", self.summary(report))]

    def diagnose(self, reading: Any) -> HostDiagnosis | None:
        """``hostrun doctor``'s entry for this host from its report just read (a ``HostReading``), or
        None when doctor's own checks of this machine cover it. Besides ``ok`` and ``problems``, the
        entry carries how doctor names it: ``title``, ``details`` (what it found, when it could read
        it) and ``unread`` (the word for a host it could not read)."""
        return None

