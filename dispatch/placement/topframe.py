"""What one frame of ``hostrun top`` holds (docs/cli.md, "hostrun top"): a pure function from the
hosts' latest readings, this machine's run history and its alerts to plain records, sorted and
filtered as the viewer asked. How a frame is laid out on a terminal is ``dispatch.cli.toplayout``'s;
how the readings keep coming, ``dispatch.placement.hostwatch``'s.

Each host says its own panel (``Host.gauges``); the jobs and the queue come from the keys every
report has (``dispatch.core.reportshape``), so no kind or name is looked at here.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from collections.abc import Sequence
    from typing import Any, Optional

    from dispatch.core.alertshape import Alert
    from dispatch.core.reportshape import RunningJob
    from dispatch.core.view import Gauge
    from dispatch.local.store.ledgerdb import RunRecord
    from dispatch.placement.reports import HostReading

# the orders ``s`` cycles through: name -> (key of a JobRow, largest first)
SORTS = ("host", "elapsed", "booked", "use", "near cap", "label", "session")


class HostPanel(NamedTuple):
    """One host: what it says of itself, or why it could not be read and when it last was."""

    name: str
    title: str
    gauges: tuple[Gauge, ...]
    error: Optional[str]
    read_at: Optional[float]  # the last successful read (time.time()), None: never


class JobRow(NamedTuple):
    """A running job, or an agent session (``hostrun session``: the frame's ``sessions``)."""

    host: str
    label: str
    session: str
    booked: Optional[int]
    in_use: Optional[int]
    cap: Optional[int]
    elapsed: Optional[float]
    in_session: str = ""  # a job: the agent session it was started in, its label less "session:"
    jobs: int = 0  # an agent session: how many of the running jobs it started

    @property
    def near_cap(self) -> Optional[float]:
        """How much of its cap it uses now (0..1+), None when it has no cap or no figure."""
        if not self.cap or self.in_use is None:
            return None
        return self.in_use / self.cap


class QueueRow(NamedTuple):
    host: str
    label: str
    session: str
    need: Optional[int]
    waited: Optional[float]
    reason: str


class OutcomeRow(NamedTuple):
    ended: float
    host: str
    label: str
    session: str
    code: int
    outcome: str
    meaning: str
    peak: Optional[int]
    duration: Optional[float]


class TopFrame(NamedTuple):
    time: float
    hosts: tuple[HostPanel, ...]
    jobs: tuple[JobRow, ...]
    queue: tuple[QueueRow, ...]
    outcomes: tuple[OutcomeRow, ...]
    alerts: tuple[str, ...]
    alerts_title: str  # "unread alerts for session S" or "recent alerts"
    sort: str
    filter: str
    notes: tuple[str, ...] = ()  # what the readers said (a ledger recovered, an alert file unreadable)
    sessions: tuple[JobRow, ...] = ()  # the running agent sessions, apart from the jobs


def _text(value: object) -> str:
    from dispatch.core.text import printable

    return printable("" if value is None else str(value))


def _number(value: object) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _size(value: object) -> Optional[int]:
    number = _number(value)
    return None if number is None else int(number)


def panel(reading: HostReading, read_at: Optional[float]) -> HostPanel:
    """A host's panel from its latest reading; ``read_at``: when it was last read successfully."""
    report = reading.report
    if report is None or reading.source is None:
        return HostPanel(reading.host, reading.host, (), _text(reading.error or "?"), read_at)
    version = report.get("version")
    where = f" ({_text(report.get('hostname'))})" if report.get("hostname") else ""
    title = f"{reading.host}{where}" + (f", hostrun {_text(version)}" if version else "")
    try:
        gauges = reading.source.gauges(report)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a peer's odd report, unsaid
        return HostPanel(reading.host, title, (), f"could not show its report ({type(exc).__name__}: "
                                                  f"{_text(exc)})", read_at)
    shown = tuple(g._replace(name=_text(g.name), text=_text(g.text)) for g in gauges)
    return HostPanel(reading.host, title, shown, None, read_at)


def runs_of(host: str, running: Sequence[RunningJob]) -> tuple[list[JobRow], list[JobRow]]:
    """A host's running jobs and its agent sessions (``role``), each job with the name of the
    session it was started in (``in_session``), each session with how many of them it started.
    A report without these keys (an older peer's agent, another kind) has jobs alone."""
    from dispatch.core.settings import SESSION_LABEL_PREFIX
    from dispatch.core.view import report_id, session_names

    names = session_names(running)
    jobs: list[JobRow] = []
    sessions: list[JobRow] = []
    for job in running:
        row = JobRow(host, _text(job.get("label") or job.get("id")), _text(job.get("session")),
                     _size(job.get("booked")), _size(job.get("in_use")), _size(job.get("cap")),
                     _number(job.get("age_s")))
        inside = report_id(job.get("in_session"))
        if job.get("role") == "session":
            key = report_id(job.get("id"))
            started = sum(1 for j in running if key is not None and j.get("in_session") == key)
            sessions.append(row._replace(label=_text(names.get(key, row.label) if key is not None
                                                     else row.label), jobs=started))
        else:
            jobs.append(row if inside is None else row._replace(  # under "agent session": no prefix
                in_session=_text(names.get(inside, f"#{inside}")).removeprefix(SESSION_LABEL_PREFIX)))
    return jobs, sessions


def jobs_of(readings: Sequence[HostReading]) -> tuple[list[JobRow], list[JobRow], list[QueueRow]]:
    """Every host's running jobs, its agent sessions and its queued jobs, from the keys every
    report has."""
    jobs: list[JobRow] = []
    sessions: list[JobRow] = []
    queue: list[QueueRow] = []
    for reading in readings:
        report = reading.report
        if report is None:
            continue
        found, held = runs_of(reading.host, report["running"])
        jobs += found
        sessions += held
        here = sorted(found + held, key=lambda j: -(j.booked or 0))
        holders = ", ".join(j.label for j in here[:3]) + (", …" if len(here) > 3 else "")
        for waiting in report["queue"]:
            reason = _text(waiting.get("reason"))
            if holders and "held by" not in reason:  # who holds the room, as its waiting line says
                reason = f"{reason}; held by {holders}" if reason else f"held by {holders}"
            queue.append(QueueRow(reading.host, _text(waiting.get("label") or waiting.get("id")),
                                  _text(waiting.get("session")), _size(waiting.get("need")),
                                  _number(waiting.get("waited_s")), reason))
    return jobs, sessions, queue


def meaning(code: int, outcome: str) -> str:
    """What an exit code means in a run's history (``dispatch.core.exitcodes``)."""
    from dispatch.core.exitcodes import SIGNAL_BASE, ExitCode

    if outcome == "exit":
        return "ok" if code == 0 else "the job's own exit status"
    if outcome == "signal":
        import signal

        try:
            return f"killed by {signal.Signals(code - SIGNAL_BASE).name}"
        except ValueError:
            return f"killed by signal {code - SIGNAL_BASE}"
    try:
        return ExitCode(code).meaning
    except ValueError:
        return outcome


def outcome_rows(runs: Sequence[RunRecord]) -> list[OutcomeRow]:
    """The history's latest runs, newest first."""
    return [OutcomeRow(r.ended, _text(r.host), _text(r.label), _text(r.session), r.exit_code,
                       _text(r.outcome), meaning(r.exit_code, r.outcome), r.peak, r.duration)
            for r in sorted(runs, key=lambda r: r.ended, reverse=True)]


def sort_key(name: str) -> Any:
    """The key a jobs table sorted by ``name`` is ordered with (largest first for the figures)."""
    if name == "host":
        return lambda j: (j.host, j.label)
    if name in ("label", "session"):
        return lambda j: (getattr(j, name).lower(), j.host)
    figure = {"elapsed": "elapsed", "booked": "booked", "use": "in_use", "near cap": "near_cap"}[name]
    return lambda j: (-(getattr(j, figure) or 0), j.host, j.label)


def matches(text: str, row: JobRow | QueueRow | OutcomeRow) -> bool:
    """The filter: ``text`` in the row's session or label (or the agent session a job was started
    in: an agent session's name shows it and its jobs), whatever the case."""
    wanted = text.lower()
    inside = row.in_session.lower() if isinstance(row, JobRow) else ""
    return not wanted or wanted in row.label.lower() or wanted in row.session.lower() or wanted in inside


def build(readings: Sequence[HostReading], read_at: dict[str, float], runs: Sequence[RunRecord],
          alerts: Sequence[Alert], alerts_title: str, now: float, sort: str = SORTS[0],
          filter_text: str = "", notes: Sequence[str] = ()) -> TopFrame:
    """The frame: each reading's panel (``read_at``: each host's last good read), jobs sorted by
    ``sort`` and, like the queue and the outcomes, filtered by ``filter_text``; ``alerts`` as one
    line each (``dispatch.placement.alerts.describe``)."""
    from dispatch.placement.alerts import describe

    jobs, sessions, queue = jobs_of(readings)
    jobs = sorted((j for j in jobs if matches(filter_text, j)), key=sort_key(sort))
    sessions = sorted((j for j in sessions if matches(filter_text, j)), key=sort_key(sort))
    return TopFrame(
        time=now, hosts=tuple(panel(r, read_at.get(r.host)) for r in readings), jobs=tuple(jobs),
        sessions=tuple(sessions),
        queue=tuple(q for q in queue if matches(filter_text, q)),
        outcomes=tuple(o for o in outcome_rows(runs) if matches(filter_text, o)),
        alerts=tuple(describe(a) for a in alerts), alerts_title=alerts_title, sort=sort,
        filter=filter_text, notes=tuple(_text(n) for n in notes))
