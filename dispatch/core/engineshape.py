"""The declared shape of the admission engine's messages: what a run sends it (``Request``, JSON
lines, each field checked where the engine reads it: ``dispatch.local.engine.requests``) and what it
answers (``Reply``, ``marshal`` frames read by ``admitclient.Link``). The shared slice's engine
(``dispatch.local.shared.sharedd``) speaks the same, with a few fields of its own.

Type-checking only: runtime modules (the engine, its client, the shared backend) import it under
``if MYPY:`` (the client is on every run's path, and the engine ships to peers as standard library
only). In ``core``: the shared backend (``capping``) reads these messages too.
"""

from __future__ import annotations

from typing import Any, List, Optional, TypedDict, Union

# A run's GPU want as sent: [VRAM in bytes, [device index, ...]] (``requests.gpu_want``).
GpuField = List[Union[int, List[int]]]


class RunFields(TypedDict):
    """A ``plan``'s run (``requests.RUN_FIELDS``: checked field by field, ``requests.checked_fields``)."""

    host: str
    label: str
    pid: int
    pid_start: int
    cap: Optional[int]
    no_cap: bool
    program: str
    command: str
    session: Optional[str]
    group: Optional[str]
    when_idle: bool
    booking_id: Optional[int]
    requeue: bool
    gamble: int
    gpu: Optional[GpuField]


class RecordFields(TypedDict, total=False):
    """A finished run's record sent with its ``release`` (``requests.checked_record``): ``call``
    ``run`` (its history row) or ``peak`` (the row, when it has one, and its peak)."""

    call: str
    run: Optional[List[Any]]  # ledgerdb.RunRecord's fields but its id, in order
    peak: int
    hit_ceiling: bool
    duration: float
    cap: Optional[int]
    event: str
    vram: Optional[int]
    ramp: Optional[List[int]]


class Request(TypedDict, total=False):
    """One request line: ``op`` says which; the rest belong to some ops only."""

    op: str  # hello, plan, cgroup, park, attach, release; shared: list, scope
    protocol: int  # hello
    id: int  # the booking: cgroup, park, attach, release, scope
    run: RunFields  # plan
    status_interval: float  # plan, attach
    gpu: Optional[GpuField]  # attach
    path: str  # cgroup: the job's cgroup directory
    record: RecordFields  # release
    pids: List[int]  # scope: the processes to move
    unit: Optional[str]  # scope: the unit the run expects


class AdmissionFields(TypedDict):
    """``policy.Admission`` as the engine sends it (``requests.admission_dict``): its bookings as
    lists of their fields (``admitclient`` makes them ``Booking``s again)."""

    admitted: bool
    need: int
    free: int
    ahead: int
    position: int
    holders: List[Any]  # ledgerdb.Booking's fields, a list each
    reclaimed: List[Any]
    gpu_need: int
    gpu_device: Optional[int]
    gpu_free: Optional[int]
    gpu_ahead: int
    memory_ok: bool
    gpu_ok: bool
    policy: Optional[str]
    head: Optional[str]
    backfill: Optional[str]
    pass_on: bool
    machine: Optional[str]


class SharedBooking(TypedDict):
    """One booking on the shared slice, as ``list`` answers it (``hostrun shared``)."""

    user: str
    pid: int
    label: str
    size: int
    cap: int
    state: str
    since: float
    unit: str


# One answer: ``op`` says which (or ``error`` a refusal). ``class`` is a Python keyword, hence the
# functional form.
Reply = TypedDict("Reply", {
    "op": str,  # hello, queued, wait, soon, admitted, parked, cgroup, attached, released, say; list, scope
    "protocol": int, "pid": int, "host": str,  # hello
    "id": int,
    "plan": List[Any],  # queued, attached: booking.Plan's fields
    "adm": AdmissionFields,  # wait, admitted
    "line": str,  # wait, say: a line for the run to say
    "near": bool,  # wait: its turn is near (else it may park)
    "parked": bool,
    "state": str,  # attached: the booking's state, or "gone"
    "kind": Optional[str],  # admitted: the booking's kind; a refusal: "ledger" for the state dir's own
    "size": int,  # admitted
    "gpu_index": Optional[int],  # admitted, attached
    "error": str,  # a refusal
    "class": str,  # a refusal: hostrun's own error class to raise it as
    # the shared slice's engine
    "slice": str, "cgroup": str, "limit": int, "group": Optional[str], "uid": int, "used": int,
    "bookings": List[SharedBooking], "unit": str,
}, total=False)


class EngineWhere(TypedDict):
    """Where the engine of a configuration runs (``admitclient.where``, ``hostrun doctor``)."""

    socket: str
    pid: Optional[int]  # None: none answers (the next run starts it)
    detail: str
