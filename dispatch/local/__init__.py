"""Running a job on the host this code runs on: book, admit, run capped, judge, record, release.

Standard library only; shipped to peers (the agent runs a peer's jobs with it).
"""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "Booking": "dispatch.local.store.ledgerdb",
    "KernelLog": "dispatch.local.gpus.kernlog",
    "Ledger": "dispatch.local.admission.ledger",
    "PeakRecord": "dispatch.local.store.ledgerdb",
    "RunRecord": "dispatch.local.store.ledgerdb",
    "Script": "dispatch.local.run.preflight",
    "PreflightResult": "dispatch.local.run.preflight",
    "admission_engine": "dispatch.local.report",
    "as_dict": "dispatch.local.history",
    "check": "dispatch.local.run.preflight",
    "declared": "dispatch.local.run.preflight",
    "default_label": "dispatch.local.admission.booking",
    "host_capacity": "dispatch.local.capacity",
    "host_sessions": "dispatch.local.sessions.sessioncapacity",
    "inspect": "dispatch.local.store.recovery",
    "install": "dispatch.local.shared.sharedinstall",
    "job_rules": "dispatch.local.capacity:rules",
    "live_jobs_of": "dispatch.local.hostslice",
    "mark_reasons": "dispatch.local.admission.booking",
    "outside_the_slice": "dispatch.local.hostslice",
    "report_lines": "dispatch.local.run.preflight",
    "run_inside": "dispatch.local.run.nested",
    "run_session": "dispatch.local.sessions.agentsession",
    "session_rules": "dispatch.local.sessions.sessioncapacity",
    "since_time": "dispatch.local.history",
    "time_to_peak": "dispatch.local.store.ramp",
    "uninstall": "dispatch.local.shared.sharedinstall",
}
__all__ = [
    "Booking",
    "KernelLog",
    "Ledger",
    "PeakRecord",
    "PreflightResult",
    "RunRecord",
    "Script",
    "admission_engine",
    "as_dict",
    "check",
    "declared",
    "default_label",
    "host_capacity",
    "host_sessions",
    "inspect",
    "install",
    "job_rules",
    "live_jobs_of",
    "mark_reasons",
    "outside_the_slice",
    "report_lines",
    "run_inside",
    "run_session",
    "session_rules",
    "since_time",
    "time_to_peak",
    "uninstall",
]
MYPY = False
if MYPY:
    from dispatch.local.admission.booking import default_label as default_label
    from dispatch.local.admission.booking import mark_reasons as mark_reasons
    from dispatch.local.admission.ledger import Ledger as Ledger
    from dispatch.local.capacity import host_capacity as host_capacity
    from dispatch.local.capacity import rules as job_rules
    from dispatch.local.gpus.kernlog import KernelLog as KernelLog
    from dispatch.local.history import as_dict as as_dict
    from dispatch.local.history import since_time as since_time
    from dispatch.local.hostslice import live_jobs_of as live_jobs_of
    from dispatch.local.hostslice import outside_the_slice as outside_the_slice
    from dispatch.local.report import admission_engine as admission_engine
    from dispatch.local.run.nested import run_inside as run_inside
    from dispatch.local.run.preflight import PreflightResult as PreflightResult
    from dispatch.local.run.preflight import Script as Script
    from dispatch.local.run.preflight import check as check
    from dispatch.local.run.preflight import declared as declared
    from dispatch.local.run.preflight import report_lines as report_lines
    from dispatch.local.sessions.agentsession import run_session as run_session
    from dispatch.local.sessions.sessioncapacity import host_sessions as host_sessions
    from dispatch.local.sessions.sessioncapacity import session_rules as session_rules
    from dispatch.local.shared.sharedinstall import install as install
    from dispatch.local.shared.sharedinstall import uninstall as uninstall
    from dispatch.local.store.ledgerdb import Booking as Booking
    from dispatch.local.store.ledgerdb import PeakRecord as PeakRecord
    from dispatch.local.store.ledgerdb import RunRecord as RunRecord
    from dispatch.local.store.ramp import time_to_peak as time_to_peak
    from dispatch.local.store.recovery import inspect as inspect

__getattr__ = lazy_attributes(__name__, SURFACE)
