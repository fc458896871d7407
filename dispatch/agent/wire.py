"""The records that cross ``hostrun --peer``'s wire: the run's spec (``J``) and its result (``R``).

Each field is written once, here, for both sides: the controller (``dispatch.hosts.ssh.peerrun``) encodes and
the agent (``dispatch.agent.run``) decodes with the same code, and both ship from the same tree (the
agent's name is its content hash), so they always agree. The request's own fields travel under their
``RunRequest`` names: a field added there travels without a change here. The frames themselves:
``dispatch.agent.frames``; the protocol: docs/design.md, "The wire protocol". Standard library only.
"""

from __future__ import annotations

import base64
import os

from dispatch.core.records import NamedTuple
from dispatch.core.request import RunRequest

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.agent.prepareshape import PrepareSpec
    from dispatch.core.outcome import Outcome

# What of the request travels as a JSON value. The arguments travel as their bytes (``argv_b64``:
# base64 of ``os.fsencode``), exact whatever they are and whatever the peer's encoding; the
# environment never travels (the job runs in the agent's environment, on the peer).
# Not carried: argv (as bytes, below), env (stays on the controller), role (a peer runs jobs; an
# agent session runs where its agent does, ``hostrun session`` has no --peer).
CARRIED = tuple(name for name in RunRequest._fields if name not in ("argv", "env", "role"))


class RunSpec(NamedTuple):
    """The first frame of a run session: the request plus what the agent needs to run it there."""

    request: RunRequest
    cwd: str  # the job's directory on the peer (``~`` expanded there)
    cap_if_none: Optional[int] = None  # the controller's peer_memory_cap for this peer
    stdin: bool = False  # --stdin: the controller forwards its stdin (D and Z frames)
    fallback: Optional[dict[str, Any]] = None  # the controller's [hosts.NAME] values, for unset keys
    prepare: Optional[PrepareSpec] = None  # probes and work directory first (a P frame), then wait
    alert_wait_after: float = 0.0  # the controller's: a wait this long sends an A frame (0: never)
    status_interval: float = 0.0  # the controller's (its user reads the waiting lines); 0: the peer's

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "argv_b64": [base64.b64encode(os.fsencode(arg)).decode() for arg in self.request.argv]}
        data.update((name, getattr(self.request, name)) for name in CARRIED)
        data.update(cwd=self.cwd, cap_if_none=self.cap_if_none, stdin=self.stdin,
                    fallback=self.fallback, prepare=self.prepare,
                    alert_wait_after=self.alert_wait_after, status_interval=self.status_interval)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Raises KeyError, TypeError or ValueError for what a controller would not have sent."""
        defaults = RunRequest._field_defaults
        carried: dict[str, Any] = {name: data.get(name, defaults[name]) for name in CARRIED}
        request = RunRequest(argv=[os.fsdecode(base64.b64decode(arg)) for arg in data["argv_b64"]],
                             **carried)
        return cls(request=request, cwd=str(data["cwd"]), cap_if_none=data.get("cap_if_none"),
                   stdin=bool(data.get("stdin")), fallback=data.get("fallback"),
                   prepare=data.get("prepare"),
                   alert_wait_after=float(data.get("alert_wait_after") or 0.0),
                   status_interval=float(data.get("status_interval") or 0.0))


def result_of(outcome: Outcome) -> dict[str, Any]:
    """The ``R`` frame's JSON of a run that ended (also a refused one): the outcome less its argv,
    which the controller has (it may be megabytes, over a frame's limit)."""
    result = outcome.to_dict()
    del result["argv"]
    return result


def error_result(exc: Exception) -> dict[str, Any]:
    """The ``R`` frame's JSON when the agent could not run the job at all: the error's exit code."""
    from dispatch.core.errors import HostrunError
    from dispatch.core.exitcodes import outcome_name

    code = int(exc.exit_code) if isinstance(exc, HostrunError) else 1
    return {"exit_code": code, "outcome": outcome_name(code), "message": str(exc),
            "error_type": type(exc).__name__}


def outcome_of(result: dict[str, Any], host: str, request: RunRequest) -> Outcome:
    """The controller's ``Outcome`` of an ``R`` frame: what the agent sent (fields it does not know
    are ignored), with the host, the label and the argv from this side. The label keys this host's
    history and alerts, so the peer never chooses it: a compromised peer could otherwise write
    another label's peaks or raise alerts under a name of its choosing."""
    from dispatch.core.outcome import FIELDS, Outcome
    from dispatch.local.admission.booking import default_label

    fixed = ("exit_code", "outcome", "host", "label", "argv")
    known = {k: result[k] for k in FIELDS if k in result and k not in fixed}
    return Outcome(exit_code=int(result["exit_code"]), outcome=str(result.get("outcome", "exit")),
                   host=host, label=request.label or default_label(request.argv),
                   argv=list(request.argv), **known)
