"""The declared shape of an alert: one JSON line of the alert file, written by
``dispatch.local.alertlog`` (here, or for a peer's job by its controller) and read by ``hostrun
alerts``/``watch``/``top`` and the agent hooks (``dispatch.placement.alerts``). Every field past
the common ones belongs to some kinds only; a line from an older hostrun may lack them, so readers
use ``.get`` for those. The meanings: docs/agents.md, "Alerts".

Type-checking only: runtime modules import it under ``if MYPY:`` (an alert is written on a run's
path, and read by the hooks' light path).
"""

from __future__ import annotations

from typing import Optional, TypedDict


class Holding(TypedDict):
    """A running booking that holds room a waiting job needs."""

    label: Optional[str]
    session: Optional[str]
    size: int
    pid: int


class WaitFigures(TypedDict):
    """What a waiting job knows of its wait (``alertlog.wait_figures``); a peer's agent sends these
    to its controller, which checks them (``alertlog.checked_figures``) and writes the alert."""

    waited_s: float
    need: int
    free: int
    position: int
    policy: Optional[str]
    holders: list[Holding]


class Alert(TypedDict, total=False):
    kind: str  # alertlog.KINDS
    time: float
    host: str
    label: str
    session: Optional[str]  # the session it is addressed to (None: every session)
    pid: Optional[int]  # the process that raised it
    command: str
    action: str  # what to run or do about it
    message: str
    exit_code: int
    peak: Optional[int]
    cap: Optional[int]
    suggested_cap: Optional[int]  # own-cap: the half rule's cap
    error: str  # peer-unreachable: why
    waited_s: float  # waiting: WaitFigures' fields but the policy
    need: int
    free: int
    position: int
    holders: list[Holding]
