"""Capacity planning (``hostrun capacity``): how many of each job fit on a host at once, and the cap
each job should have by the half rule. See docs/capacity.md.

Pure functions over peak records and slice sizes, so every figure can be checked by hand:

- **fits**: ``floor(slice limit / booking)``, the booking decided exactly as the ledger would book the
  next run (``dispatch.local.admission.booking.plan_booking``: its recorded peak if it never hit its
  ceiling, else its
  cap, else the whole slice or the gamble size), on an otherwise empty slice, and never more than
  ``floor(slice limit / worst recorded peak)`` (a gamble booking can be below the real peak);
- **half rule**: the worst recorded peak must be at most half the cap, the cap a multiple of
  512 MiB: ``half_rule_cap = ceil(2 * max_peak / 512 MiB) * 512 MiB`` (at least 512 MiB);
- **peaks vary widely**: the coefficient of variation (population standard deviation / mean) of the
  recent peaks is above 1/3; for two samples that is exactly "the larger is more than twice the
  smaller".

Figures of different hosts are never mixed: every record is one label on one host, and the host
whose peak table it came from is named in every result. Standard library only: the agent builds its
host's ``peak_table`` with this module when asked for ``report --peaks``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dispatch.core.errors import NeverFitsError
from dispatch.core.records import NamedTuple
from dispatch.core.settings import SESSION_LABEL_PREFIX
from dispatch.core.units import MiB, format_size
from dispatch.local.admission.booking import plan_booking
from dispatch.local.store.ledgerdb import PeakRecord

MYPY = False
if MYPY:
    from typing import Any, Optional, TypedDict

    from dispatch.core.reportshape import Report
    from dispatch.local.store.ledgerdb import PeakRun

    class CapacityRules(TypedDict):
        """The constants behind ``hostrun capacity``'s figures (its ``--json`` ``rules``)."""

        half_rule_factor: int
        round_to: int
        wide_variation_cv: float

STEP = 512 * MiB  # caps are rounded up to a multiple of this
HALF_RULE_FACTOR = 2  # the cap must be at least this many times the worst recorded peak
WIDE_CV = 1 / 3  # coefficient of variation above which peaks "vary widely"

# Flags, in the order they are shown.
CAP_BELOW = "cap-below-half-rule"
HIT_CEILING = "hit-ceiling"
PEAKS_VARY = "peaks-vary"
OVER_SLICE = "half-rule-over-slice"
NEVER_FITS = "never-fits"


class LabelPeaks(NamedTuple):
    """One label's peak figures on one host: its peak-table record plus its recent history."""

    record: PeakRecord  # label, host, peaks, runs, ceiling and slice-full mark (no durations or times)
    history: tuple[int, ...] = ()  # peaks of the last runs kept (oldest first)
    cap_known: bool = False  # whether the last run's cap was recorded (runs since the history)
    last_cap: Optional[int] = None  # that cap; None with cap_known: the job had no cap of its own

    @property
    def slice_full_marked(self) -> bool:
        """Exited 254 and not yet cleared: booked at its cap."""
        return self.record.slice_full_at is not None


class Fit(NamedTuple):
    """How many of one job fit at once in a slice of ``slice_limit`` bytes."""

    slice_limit: int
    kind: str  # the booking: peak, cap, gamble, or never-fits
    booked: int  # bytes booked per job
    fits: int
    fits_at_half_rule_cap: int  # if every run were booked at the half-rule cap
    why: str


class Assessment(NamedTuple):
    label: str
    host: str
    hostname: Optional[str]
    runs: int
    max_peak: int
    last_peak: int
    hit_ceiling: bool
    history_runs: int
    variation: Optional[float]  # coefficient of variation of the samples, None under two samples
    variation_basis: Optional[str]  # "history" (the last runs) or "max-vs-last"
    cap: Optional[int]  # the cap assumed for the next run
    cap_source: str  # "last-run", "default-cap" or "unknown"
    half_rule_cap: int
    now: Fit
    what_if: Optional[Fit]
    flags: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def source(self) -> str:
        where = f" ({self.hostname})" if self.hostname else ""
        return f"peak table on {self.host}{where}"

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["source"] = self.source
        data["now"] = self.now._asdict()
        data["what_if"] = self.what_if._asdict() if self.what_if is not None else None
        data["flags"] = list(self.flags)
        data["notes"] = list(self.notes)
        if self.variation is not None:
            data["variation"] = round(self.variation, 3)
        return data


def round_up(n: int, step: int = STEP) -> int:
    """``n`` rounded up to a multiple of ``step`` (0 stays 0)."""
    return -(-n // step) * step


def half_rule_cap(worst_peak: int, step: int = STEP) -> int:
    """The smallest multiple of ``step`` that is at least twice ``worst_peak`` (at least ``step``)."""
    return max(step, round_up(HALF_RULE_FACTOR * worst_peak, step))


def how_many(slice_limit: int, size: int) -> int:
    """Jobs of ``size`` bytes that fit at once in ``slice_limit`` bytes."""
    return slice_limit // size if size > 0 else 0


def variation(samples: Sequence[int]) -> float | None:
    """Population standard deviation / mean, or None for fewer than two samples or a zero mean."""
    if len(samples) < 2:
        return None
    mean = sum(samples) / len(samples)
    if mean <= 0:
        return None
    return math.sqrt(sum((x - mean) ** 2 for x in samples) / len(samples)) / mean


def samples(p: LabelPeaks) -> tuple[list[int], str | None]:
    """The peaks to judge variation by: the history when it holds two runs or more; else, for a
    label recorded (mostly) before the history existed, its max and last peak."""
    if len(p.history) >= 2:
        return list(p.history), "history"
    if p.record.runs >= 2:
        return [p.record.last_peak, p.record.max_peak], "max-vs-last"
    return [], None


def assumed_cap(p: LabelPeaks, default_cap: int | None) -> tuple[int | None, str]:
    """The cap the next run is assumed to have: the last run's (when recorded), else the host's
    ``default_cap`` (what a run without ``-m`` gets), else unknown (planned as no cap)."""
    if p.cap_known:
        return p.last_cap, "last-run"
    if default_cap is not None:
        return default_cap, "default-cap"
    return None, "unknown"


def fit(p: LabelPeaks, cap: int | None, slice_limit: int, gamble_size: int, half_cap: int) -> Fit:
    """How the ledger would book the next run in ``slice_limit``, and how many such runs fit."""
    r = p.record
    at_half = how_many(slice_limit, half_cap)
    try:
        plan = plan_booking(cap=cap, peak=r, slice_limit=slice_limit,
                            gamble_size=gamble_size)
    except NeverFitsError:
        assert cap is not None
        return Fit(slice_limit, NEVER_FITS, cap, 0, at_half,
                   f"its cap {format_size(cap)} is larger than the slice: never admitted")
    if plan.kind == "peak":
        why = "booked at its recorded peak (never hit its ceiling)"
    elif plan.kind == "cap" and cap is None:
        why = f"{_marked(p)} and has no cap: booked at the whole slice"
    elif plan.kind == "cap":
        why = f"{_marked(p)}: booked at its cap" if r.hit_ceiling or p.slice_full_marked else (
            "booked at its cap (its peak is not below the cap)")
    else:
        why = "no usable peak and no cap: booked at the gamble size"
    fits = how_many(slice_limit, plan.size)
    if r.max_peak > 0 and how_many(slice_limit, r.max_peak) < fits:  # a gamble below its real peak
        fits = how_many(slice_limit, r.max_peak)
        why += f"; but only {fits} fit at its worst recorded peak"
    if r.max_peak > slice_limit:
        why = f"its worst recorded peak {format_size(r.max_peak)} is larger than the slice"
    return Fit(slice_limit, plan.kind, plan.size, fits, at_half, why)


def _marked(p: LabelPeaks) -> str:
    return "hit its ceiling" if p.record.hit_ceiling else "killed when the slice filled (marked)"


def peak_flags(p: LabelPeaks, cap: int | None, cap_source: str, half_cap: int, *,
               booked_at_cap: bool = True) -> tuple[list[str], list[str], float | None, str | None]:
    """What a label's own peaks say, whatever slice it runs in (jobs and sessions alike): its cap
    below the half rule, its ceiling hit, peaks that vary widely. Returns (flags, notes, variation,
    its basis); ``booked_at_cap``: the ceiling note says it is booked at its cap from now on."""
    r = p.record
    values, basis = samples(p)
    cv = variation(values)
    flags: list[str] = []
    notes: list[str] = []
    if cap is not None and cap < half_cap:
        flags.append(CAP_BELOW)
        notes.append(f"cap {format_size(cap)} ({cap_source}) is below the half-rule cap "
                     f"{format_size(half_cap)} (2 x worst peak {format_size(r.max_peak)}, rounded up "
                     "to 512 MiB)")
    elif cap is None and cap_source == "unknown" and r.hit_ceiling:
        flags.append(CAP_BELOW)
        notes.append(f"its cap was not recorded, but it hit its ceiling, so that cap was below the "
                     f"half-rule cap {format_size(half_cap)}")
    if r.hit_ceiling:
        flags.append(HIT_CEILING)
        notes.append(f"hit its ceiling: its true peak is above {format_size(r.max_peak)}, so "
                     f"{format_size(half_cap)} is only a lower bound"
                     + ("; it is booked at its cap" if booked_at_cap else ""))
    if cv is not None and cv > WIDE_CV:
        flags.append(PEAKS_VARY)
        if basis == "history":
            notes.append(f"peaks vary widely: {format_size(min(values))} to {format_size(max(values))} "
                         f"over the last {len(values)} runs (variation {cv:.2f} > {WIDE_CV:.2f})")
        else:
            notes.append(f"peaks vary widely: worst {format_size(r.max_peak)}, last "
                         f"{format_size(r.last_peak)} (more than 2x apart)")
    return flags, notes, cv, basis


def assess(p: LabelPeaks, *, slice_limit: int, default_cap: int | None, gamble_size: int,
           what_if: int | None = None, hostname: str | None = None) -> Assessment:
    """Everything ``hostrun capacity`` says about one label on one host."""
    r = p.record
    half_cap = half_rule_cap(r.max_peak)
    cap, cap_source = assumed_cap(p, default_cap)
    now = fit(p, cap, slice_limit, gamble_size, half_cap)
    other = fit(p, cap, what_if, gamble_size, half_cap) if what_if is not None else None
    flags, notes, cv, basis = peak_flags(p, cap, cap_source, half_cap)
    if half_cap > slice_limit:
        flags.append(OVER_SLICE)
        notes.append(f"the half-rule cap {format_size(half_cap)} is larger than the slice "
                     f"({format_size(slice_limit)})")
    if now.kind == NEVER_FITS:
        flags.append(NEVER_FITS)
        notes.append(now.why)
    return Assessment(
        label=r.label, host=r.host, hostname=hostname, runs=r.runs, max_peak=r.max_peak,
        last_peak=r.last_peak, hit_ceiling=r.hit_ceiling, history_runs=len(p.history),
        variation=cv, variation_basis=basis, cap=cap, cap_source=cap_source, half_rule_cap=half_cap,
        now=now, what_if=other, flags=tuple(flags), notes=tuple(notes),
    )


# -- a host's peak table, as its report carries it (``report --peaks``) --

def peak_table(records: Sequence[PeakRecord], runs: Sequence[PeakRun]) -> list[dict[str, Any]]:
    """``records`` joined with their ``runs`` history (both of one host), as plain JSON data."""
    history: dict[str, list[PeakRun]] = {}
    for run in runs:
        history.setdefault(run.label, []).append(run)
    table = []
    for r in records:
        mine = history.get(r.label, [])
        table.append({
            "label": r.label, "host": r.host, "max_peak": r.max_peak, "runs": r.runs,
            "last_peak": r.last_peak, "hit_ceiling": r.hit_ceiling, "history": [x.peak for x in mine],
            "cap_known": bool(mine), "last_cap": mine[-1].cap if mine else None,
            "slice_full_marked": r.slice_full_at is not None,
        })
    return table


def labels_from_table(table: Sequence[dict[str, Any]], host: str) -> list[LabelPeaks]:
    """The entries of a report's ``peak_table``, tagged with ``host`` as this controller names it
    (a peer's ledger calls itself ``local``)."""
    out = []
    for e in table:
        record = PeakRecord(str(e["label"]), host, int(e["max_peak"]), int(e["runs"]),
                            int(e["last_peak"]), bool(e["hit_ceiling"]), None, None, 0.0,
                            slice_full_at=0.0 if e.get("slice_full_marked") else None)
        out.append(LabelPeaks(
            record, history=tuple(int(x) for x in e.get("history") or ()),
            cap_known=bool(e.get("cap_known")),
            last_cap=None if e.get("last_cap") is None else int(e["last_cap"]),
        ))
    return out


class HostCapacity(NamedTuple):
    host: str
    ok: bool
    error: Optional[str]
    hostname: Optional[str]
    slice_limit: Optional[int]
    what_if: Optional[int]
    default_cap: Optional[int]
    gamble_size: Optional[int]
    labels: list[Assessment]
    session_labels: int = 0  # ``session:`` labels left to ``--sessions`` (their own slice and rule)

    def as_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["labels"] = [a.as_dict() for a in self.labels]
        return data


def is_session(label: str) -> bool:
    """A ``hostrun session`` label: its runs live in the sessions slice, not the jobs'."""
    return label.startswith(SESSION_LABEL_PREFIX)


def host_capacity(host: str, report: Report | None, error: str | None = None,
                  what_if: int | None = None) -> HostCapacity:
    """One host's capacity from its report (read with ``peaks=True``); an unread host says why.
    Session labels are only counted: judged against the whole slice and the jobs' booking rules
    their figures would be wrong (``hostrun capacity --sessions`` judges them)."""
    if report is None:
        return HostCapacity(host, False, error or "could not read", None, None, what_if, None, None, [])
    settings = report["settings"]
    limit = int(report["slice"]["limit"])
    default_cap = settings.get("default_cap")
    gamble = int(settings.get("gamble_size") or 0)  # a cluster books no gamble
    hostname = report.get("hostname")
    table = labels_from_table(report.get("peak_table") or [], host)
    jobs = [p for p in table if not is_session(p.record.label)]
    labels = [assess(p, slice_limit=limit, default_cap=default_cap, gamble_size=gamble,
                     what_if=what_if, hostname=hostname) for p in jobs]
    return HostCapacity(host, True, None, hostname, limit, what_if, default_cap, gamble, labels,
                        len(table) - len(jobs))


def rules() -> CapacityRules:
    """The constants behind the figures, for ``--json`` readers."""
    return {"half_rule_factor": HALF_RULE_FACTOR, "round_to": STEP, "wide_variation_cv": WIDE_CV}
