"""The resource table a hook puts before a heavy command: every configured host's load, heavy
threads still free, memory available for jobs, slice room, queue and VRAM, read as ``hostrun report``
reads them (``placement.reports.read_reports``: each host within ``report_timeout``, all within
``report_deadline``). A host that cannot be read is said so, with why.

"Memory available" is the report's ``available_for_jobs``: MemAvailable less what running jobs have
booked but not yet reached (they will take it), which is what a new job can really count on.
"""

from __future__ import annotations

MYPY = False
if MYPY:
    from dispatch.core.settings import Settings
    from dispatch.placement.reports import HostReading


HOOK_DEADLINE = 15.0  # seconds for the whole table: well under PreToolUse's installed 60 s timeout
DEADLINE_ENV = "HOSTRUN_HOOK_DEADLINE"  # tests: a shorter one
MISSED_FOR = 60.0  # seconds a host that did not answer is skipped before it is tried again


def read(settings: Settings, label: str | None = None) -> list[HostReading]:
    """Every configured host's reading (``label``: also that label's peak record, from this host).

    A hook runs before every heavy command: a hung peer must not cost its timeout each time, and
    the whole table must come well within the hook's own timeout (past it, Claude Code discards the
    answer and the command runs unguarded). So the reading is bounded by ``HOOK_DEADLINE`` whatever
    ``report_timeout`` says, and a host that did not answer is remembered for ``MISSED_FOR`` seconds
    (in the user's cache) and skipped meanwhile, the table saying so."""
    import os
    import time

    from dispatch.placement.reports import HostReading, read_reports

    budget = float(os.environ.get(DEADLINE_ENV) or HOOK_DEADLINE)
    bounded = settings._replace(report_deadline=min(settings.report_deadline, budget),
                                report_timeout=min(settings.report_timeout, budget))
    missed = _missed()
    now = time.time()
    here = settings.local.name  # this machine is always read: its reading costs no timeout
    skipped = {name: at for name, at in missed.items()
               if name in settings.hosts and name != here and 0 <= now - at < MISSED_FOR}
    names = [name for name in settings.hosts if name not in skipped]
    readings = {r.host: r for r in read_reports(bounded, names=names, label=label)}
    changed = False
    for name, reading in readings.items():
        if name == here:
            continue
        if reading.ok and name in missed:
            del missed[name]
            changed = True
        elif not reading.ok:
            missed[name] = now
            changed = True
    if changed:
        _save_missed(missed)
    return [readings.get(name) or HostReading(
        name, None, f"skipped: it did not answer {now - skipped[name]:.0f} s ago (tried again after "
                    f"{MISSED_FOR:g} s)", 0.0) for name in settings.hosts]


MISSED = "missed-hosts.json"


def _missed() -> dict[str, float]:
    """Hosts that did not answer, with when (epoch seconds); an unusable file means none."""
    from dispatch.hooks import hookstate

    data = hookstate.load(MISSED)
    try:
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (TypeError, ValueError):
        return {}


def _save_missed(missed: dict[str, float]) -> None:
    from dispatch.hooks import hookstate

    hookstate.save(MISSED, missed)


def host_line(settings: Settings, reading: HostReading) -> str:
    """One host's line of the table: what its kind says of it (``Host.summary``)."""
    if reading.report is None:
        return f"- {reading.host}: could not read: {reading.error}"
    from dispatch.hosts.kinds import host_for

    host = reading.source or host_for(settings, reading.host)
    return f"- {reading.host}: {host.summary(reading.report)}"


def text(settings: Settings, readings: list[HostReading], peers: bool) -> str:
    """The table as ``additionalContext``: a heading, one line per host, and how to use it."""
    lines = ["hostrun resources now (heavy work should run through hostrun, under a memory cap):"]
    lines += [host_line(settings, r) for r in readings]
    if peers:
        lines.append("Choose where it fits: `hostrun -m CAP -- CMD` here, `hostrun --peer NAME -m CAP "
                     "-- CMD` on a peer, `hostrun --auto -- CMD` to let hostrun choose.")
    else:
        lines.append("Run it as `hostrun [-m CAP] -- CMD`; it waits in the queue when the slice is full.")
    return "\n".join(lines)


def _here(settings: Settings, readings: list[HostReading]) -> HostReading | None:
    """This machine's reading, when it was read."""
    return next((r for r in readings if r.report is not None and r.host == settings.local.name), None)


def slice_limit(settings: Settings, readings: list[HostReading]) -> int | None:
    """This host's slice size, from its reading (None when it could not be read)."""
    local = _here(settings, readings)
    if local is None or local.report is None:
        return None
    value = local.report["slice"].get("limit")
    return int(value) if isinstance(value, int) else None


def label_peak(settings: Settings, readings: list[HostReading]) -> int:
    """The worst recorded peak of the label asked for, on this host (0 when unknown)."""
    local = _here(settings, readings)
    peak = local.report.get("label_peak") if local is not None and local.report is not None else None
    return int(peak.get("max_peak") or 0) if isinstance(peak, dict) else 0
