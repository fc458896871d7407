"""Sessions per host (``hostrun capacity --sessions``): how many agent sessions fit in each host's
sessions slice, and the cap each session label should have. See docs/capacity.md, "Sessions".

The rule, from the design's reference measurements: a session's memory is the half-rule cap of its
worst recorded peak (``capacity.half_rule_cap``: 2 x peak rounded up to 512 MiB), and
``sessions per node = floor((allocatable - others) / memory)``, where a host's allocatable is its
sessions slice's limit (``settings.sessions.limit`` in its report). Two figures per label:

- ``fits``: others = 0. The sessions slice holds only sessions, and the per-label figure is that
  slice filled with this one session, as the jobs' ``fits`` is an empty slice filled with one job;
- ``fits_beside_running``: others = what the sessions running now hold (the report's running jobs
  whose label starts ``session:``), each counted at its cap, the memory the rule gives it (its
  booking when it has no cap): how many more of this session fit now.

A label with no usable peak, and a session not yet run (the ``default`` row), get the host's
``sessions.cap``, the cap ``hostrun session`` gives without ``-m`` or a recorded peak. Pure and
standard library only, like ``capacity``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch.core.records import NamedTuple
from dispatch.core.settings import SESSION_LABEL_PREFIX, SessionSettings
from dispatch.core.units import format_size
from dispatch.local.capacity import (
    OVER_SLICE,
    LabelPeaks,
    half_rule_cap,
    how_many,
    is_session,
    labels_from_table,
    peak_flags,
    rules,
)

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.reportshape import Report, RunningJob, SessionFigures
    from dispatch.local.capacity import CapacityRules

    class SessionRules(CapacityRules):
        session_prefix: str  # what a session's label starts with

HALF_RULE = "half-rule"  # cap_source: 2 x its worst recorded peak, rounded up to 512 MiB
DEFAULT = "default"  # cap_source: the host's sessions.cap (no usable peak, or no session yet)
NO_FIGURES = ("its report has no sessions figures (a hostrun there from before sessions, or a kind "
              "without a sessions slice)")


class Room(NamedTuple):
    """A host's sessions slice as the figures need it."""

    limit: int  # the sessions slice's limit: the rule's allocatable
    held: int  # what the sessions running now hold (each at its cap): the rule's others, now
    what_if: Optional[int]  # the sessions slice's limit were hostrun's slice ``--slice``


class SessionFit(NamedTuple):
    """How many sessions at ``cap`` fit in a host's sessions slice."""

    cap: int
    cap_source: str  # HALF_RULE or DEFAULT
    fits: int  # floor(limit / cap): others = 0
    fits_beside_running: int  # floor((limit - held) / cap)
    what_if_fits: Optional[int]  # floor(what-if limit / cap), with --slice


class SessionAssessment(NamedTuple):
    label: str
    host: str
    hostname: Optional[str]
    runs: int
    max_peak: int
    last_peak: int
    hit_ceiling: bool
    history_runs: int
    variation: Optional[float]
    variation_basis: Optional[str]
    last_cap: Optional[int]  # the last run's cap, None: none or not recorded (see last_cap_known)
    last_cap_known: bool
    half_rule_cap: Optional[int]  # None: no usable peak (no run of it succeeded yet)
    fit: SessionFit
    flags: tuple[str, ...]
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        del data["fit"], data["flags"], data["notes"]
        data.update(self.fit._asdict())  # flat: .labels[] | {label, cap, fits}
        data["source"] = f"peak table on {self.host}" + (f" ({self.hostname})" if self.hostname else "")
        data["flags"] = list(self.flags)
        data["notes"] = list(self.notes)
        if self.variation is not None:
            data["variation"] = round(self.variation, 3)
        return data


class SessionHost(NamedTuple):
    host: str
    ok: bool
    error: Optional[str]  # why the host could not be read
    hostname: Optional[str]
    slice_limit: Optional[int]  # hostrun's slice on that host
    sessions: Optional[SessionFigures]  # its report's figures; None: unread, or not reported
    no_sessions: Optional[str]  # read, but without sessions figures: why
    what_if: Optional[int]  # --slice: hostrun's slice
    what_if_limit: Optional[int]  # the sessions slice that would give
    running_sessions: int
    running_held: int
    default: Optional[SessionFit]  # a session with no recorded peak
    labels: list[SessionAssessment]
    notes: tuple[str, ...] = ()  # of the host (its default cap over its sessions slice)

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["sessions"] = dict(self.sessions) if self.sessions is not None else None
        data["default"] = self.default._asdict() if self.default is not None else None
        data["labels"] = [a.as_dict() for a in self.labels]
        data["notes"] = list(self.notes)
        return data


def counts(cap: int, cap_source: str, room: Room) -> SessionFit:
    """Sessions at ``cap`` in ``room``: on their own, beside those running now, and with ``--slice``."""
    what_if = how_many(room.what_if, cap) if room.what_if is not None else None
    return SessionFit(cap, cap_source, how_many(room.limit, cap),
                      how_many(max(0, room.limit - room.held), cap), what_if)


def assess_session(p: LabelPeaks, room: Room, default_cap: int,
                   hostname: str | None = None) -> SessionAssessment:
    """One session label on one host: its cap by the half rule, how many fit, and the flags its
    peaks raise (as a job's: ``capacity.peak_flags``) plus one for a cap over the sessions slice."""
    r = p.record
    half_cap = half_rule_cap(r.max_peak) if r.max_peak > 0 else None
    fit = counts(half_cap, HALF_RULE, room) if half_cap is not None else counts(default_cap, DEFAULT, room)
    last_cap = p.last_cap if p.cap_known else None
    # the last run's cap judged against the half rule (the next session gets the rule's own cap);
    # with no usable peak there is nothing to judge it by
    if half_cap is None:
        judged, source = None, "none"
    else:
        judged, source = last_cap, "last-run" if p.cap_known else "unknown"
    flags, notes, cv, basis = peak_flags(p, judged, source, half_cap or 0, booked_at_cap=False)
    if fit.cap > room.limit:
        flags.append(OVER_SLICE)
        notes.append(f"its cap {format_size(fit.cap)} is larger than the sessions slice "
                     f"({format_size(room.limit)}): none fits")
    return SessionAssessment(
        label=r.label, host=r.host, hostname=hostname, runs=r.runs, max_peak=r.max_peak,
        last_peak=r.last_peak, hit_ceiling=r.hit_ceiling, history_runs=len(p.history), variation=cv,
        variation_basis=basis, last_cap=last_cap, last_cap_known=p.cap_known, half_rule_cap=half_cap,
        fit=fit, flags=tuple(flags), notes=tuple(notes))


def running_sessions(running: Sequence[RunningJob]) -> tuple[int, int]:
    """(how many, bytes held) of the sessions running now, told apart by their label's prefix; each
    held at its cap, else at its booking."""
    held = [int(j.get("cap") or j.get("booked") or 0) for j in running
            if (j.get("label") or "").startswith(SESSION_LABEL_PREFIX)]
    return len(held), sum(held)


def figures_of(report: Report) -> SessionFigures | None:
    """The report's sessions figures; None where it has none (an older peer's, another kind's) or
    not all of them (an agent between versions: judged as none, never a traceback)."""
    raw = report["settings"].get("sessions")
    if not isinstance(raw, dict):
        return None
    try:
        return {"limit": int(raw["limit"]), "share": float(raw["share"]), "cap": int(raw["cap"]),
                "first_booking": int(raw["first_booking"]), "high": float(raw["high"])}
    except (KeyError, TypeError, ValueError):
        return None


def host_sessions(host: str, report: Report | None, error: str | None = None,
                  what_if: int | None = None) -> SessionHost:
    """One host's sessions from its report (read with ``peaks=True``); an unread host says why, and
    a report without sessions figures (an older peer) says so, neither an error for the others."""
    if report is None:
        return SessionHost(host, False, error or "could not read", None, None, None, None, what_if,
                           None, 0, 0, None, [])
    hostname = report.get("hostname")
    slice_limit = int(report["slice"]["limit"])
    figures = figures_of(report)
    if figures is None:
        return SessionHost(host, True, None, hostname, slice_limit, None, NO_FIGURES, what_if, None,
                           0, 0, None, [])
    n, held = running_sessions(report.get("running") or [])
    then = SessionSettings(share=figures["share"]).limit(what_if) if what_if is not None else None
    room = Room(figures["limit"], held, then)
    default_cap = figures["cap"]
    labels = [assess_session(p, room, default_cap, hostname)
              for p in labels_from_table(report.get("peak_table") or [], host) if is_session(p.record.label)]
    notes = () if default_cap <= room.limit else (
        f"the default session cap {format_size(default_cap)} ([sessions] cap) is larger than the "
        f"sessions slice ({format_size(room.limit)}): a session with no recorded peak never fits",)
    return SessionHost(host, True, None, hostname, slice_limit, figures, None, what_if, then, n, held,
                       counts(default_cap, DEFAULT, room), labels, notes)


def session_rules() -> SessionRules:
    """``rules()`` and what tells a session apart, for ``--json`` readers."""
    job = rules()
    return {"half_rule_factor": job["half_rule_factor"], "round_to": job["round_to"],
            "wide_variation_cv": job["wide_variation_cv"], "session_prefix": SESSION_LABEL_PREFIX}
