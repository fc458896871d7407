"""Deciding where a job goes: reading hosts' reports, judging them, pending bookings, alerts.

Controller only.
"""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "TopFrame": "dispatch.placement.topframe",
    "HostPanel": "dispatch.placement.topframe",
    "HostWatch": "dispatch.placement.hostwatch",
    "JobRow": "dispatch.placement.topframe",
    "PeerWatch": "dispatch.placement.auto",
    "SORTS": "dispatch.placement.topframe",
    "build": "dispatch.placement.topframe",
    "consider": "dispatch.placement.auto",
    "forget_sent": "dispatch.placement.sent",
    "make_job": "dispatch.placement.longrule",
    "parse_exec": "dispatch.placement.watchdog",
    "place": "dispatch.placement.auto",
    "place_on_peer": "dispatch.placement.sent",
    "read_reports": "dispatch.placement.reports",
    "watch": "dispatch.placement.watchdog",
}
__all__ = [
    "SORTS",
    "HostPanel",
    "HostWatch",
    "JobRow",
    "PeerWatch",
    "TopFrame",
    "build",
    "consider",
    "forget_sent",
    "make_job",
    "parse_exec",
    "place",
    "place_on_peer",
    "read_reports",
    "watch",
]
MYPY = False
if MYPY:
    from dispatch.placement.auto import PeerWatch as PeerWatch
    from dispatch.placement.auto import consider as consider
    from dispatch.placement.auto import place as place
    from dispatch.placement.hostwatch import HostWatch as HostWatch
    from dispatch.placement.longrule import make_job as make_job
    from dispatch.placement.reports import read_reports as read_reports
    from dispatch.placement.sent import forget_sent as forget_sent
    from dispatch.placement.sent import place_on_peer as place_on_peer
    from dispatch.placement.topframe import SORTS as SORTS
    from dispatch.placement.topframe import HostPanel as HostPanel
    from dispatch.placement.topframe import JobRow as JobRow
    from dispatch.placement.topframe import TopFrame as TopFrame
    from dispatch.placement.topframe import build as build
    from dispatch.placement.watchdog import parse_exec as parse_exec
    from dispatch.placement.watchdog import watch as watch

__getattr__ = lazy_attributes(__name__, SURFACE)
