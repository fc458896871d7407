"""What a run may send the admission engine, checked before the engine acts on it: a ``plan``'s
fields, a status interval, a GPU want, a finished run's record. Each check raises ValueError with
the field's name (the engine answers it as the run's refusal); nothing here touches the ledger.

A client is another process of the same user (or root, for a shared slice's engine): never trusted
to send well-formed requests, so every field is checked for its type and range here, once.
"""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.engineshape import AdmissionFields, Request, RunFields
    from dispatch.local.admission.policy import Admission
    from dispatch.local.store.ledgerdb import RunRecord

PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: no process id is larger
TEXT_MAX = 8192  # characters of a run's text fields (its command line is cut at 4,096 by the run)
GPU_DEVICES_MAX = 64  # device indices a --gpu-memory run may name (its CUDA_VISIBLE_DEVICES)
# What ``plan`` takes: a run before anything of it is made; the engine checks its cap against the
# slice, plans its booking from the ledger (``booking.plan_for``) and queues it (``admitclient``).
RUN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "host": str, "label": str, "pid": int, "pid_start": int, "cap": (int, type(None)), "no_cap": bool,
    "program": str, "command": str, "session": (str, type(None)), "group": (str, type(None)),
    "when_idle": bool, "booking_id": (int, type(None)), "requeue": bool, "gamble": int,
    "gpu": (list, type(None)),
}
_NUMBER = (int, float)
_TEXT = (str, type(None))
# RunRecord's fields as a run sends them, in order (ledgerdb.RunRecord, its id left out).
RUN_RECORD_TYPES: list[type | tuple[type, ...]] = [
    _NUMBER, _NUMBER, (int, float, type(None)), (int, float, type(None)), str, str, _TEXT, str,
    (int, type(None)), _TEXT, (int, type(None)), (int, type(None)), int, str, bool,
]


class GpuWant(NamedTuple):
    """A ``--gpu-memory`` run's want: the VRAM it books and the devices it may have."""

    need: int
    devices: frozenset[int]


class PeakCall(NamedTuple):
    """``Ledger.record_peak``'s arguments as a run sent them (``Link.record_peak``)."""

    peak: int
    hit_ceiling: bool
    duration: float
    cap: Optional[int]
    event: str
    vram: Optional[int]
    ramp: Optional[list[int]]


class RecordCall(NamedTuple):
    """A finished run's record, checked: its history row, and with ``peak`` its peak too."""

    run: Optional[RunRecord]
    peak: Optional[PeakCall]


def positive_int(value: object, what: str) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{what}: a positive whole number")
    return value


def is_size(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def checked_list(value: object, types: list[type | tuple[type, ...]], what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != len(types):
        raise ValueError(f"{what}: a list of {len(types)} fields")
    for item, kind in zip(value, types):
        if not isinstance(item, kind) or (isinstance(item, bool) and kind is not bool):
            raise ValueError(f"{what}: a field of the wrong type")
    return value


def checked_run(fields: object) -> RunFields:
    """A ``plan``'s ``run``: an object with exactly ``RUN_FIELDS``, each of its type, numbers and
    texts in range."""
    key, spec = "run", RUN_FIELDS
    if not isinstance(fields, dict) or set(fields) != set(spec):
        raise ValueError(f"{key}: an object with {', '.join(sorted(spec))}")
    for name, kind in spec.items():
        value = fields[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{key}: {name} of the wrong type")
    for name, value in fields.items():
        if isinstance(value, bool) and spec[name] is not bool:
            raise ValueError(f"{key}: {name} of the wrong type")
        if isinstance(value, int) and not isinstance(value, bool) and not (
                (0 if name == "pid_start" else 1) <= value < (PID_MAX if name == "pid" else 1 << 62)):
            raise ValueError(f"{key}: {name} out of range")
        if isinstance(value, str) and len(value) > TEXT_MAX:
            raise ValueError(f"{key}: {name} longer than {TEXT_MAX} characters")
    return fields  # type: ignore[return-value]  # each of RunFields' fields checked above


def checked_interval(message: Request, default: float) -> float:
    """How often a waiter is told its status (``status_interval``), in seconds."""
    interval = message.get("status_interval", default)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
            or not 0.05 <= interval <= 86400:
        raise ValueError("status_interval: seconds, 0.05 to 86400")
    return float(interval)


def gpu_want(value: object) -> GpuWant | None:
    """A run's ``gpu`` field (``[need, [device index, ...]]``, None: no GPU) checked."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
            and 0 < value[0] < 1 << 62 and isinstance(value[1], list)
            and 0 < len(value[1]) <= GPU_DEVICES_MAX
            and all(type(i) is int and 0 <= i < 1 << 16 for i in value[1])):
        raise ValueError(f"gpu: [VRAM in bytes, [up to {GPU_DEVICES_MAX} device indices]]")
    return GpuWant(value[0], frozenset(value[1]))


def checked_record(fields: object) -> RecordCall:
    """A finished run's record (``Link.record_peak``/``record_run``): ``call`` ``run`` (its history
    row) or ``peak`` (its peak, ramp and event, with the row when it has one)."""
    from dispatch.local.store.ledgerdb import CLEAN, FAILED, NO_EVENT, OOM_KILLED, SLICE_FULL, RunRecord

    if not isinstance(fields, dict):
        raise ValueError("record: an object")
    run_fields = fields.get("run")
    run = None if run_fields is None else RunRecord(*checked_list(run_fields, RUN_RECORD_TYPES, "run"))
    call = fields.get("call")
    if call == "run":
        if run is None:
            raise ValueError("run: a history row")
        return RecordCall(run, None)
    if call != "peak":
        raise ValueError("call: run or peak")
    peak, duration, cap, vram = (fields.get(k) for k in ("peak", "duration", "cap", "vram"))
    event, ramp, hit = fields.get("event"), fields.get("ramp"), fields.get("hit_ceiling")
    if not isinstance(peak, int) or not is_size(peak) or not (cap is None or is_size(cap)) \
            or not (vram is None or is_size(vram)):
        raise ValueError("peak, cap, vram: bytes")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e9:
        raise ValueError("duration: seconds")
    if event not in (CLEAN, FAILED, NO_EVENT, OOM_KILLED, SLICE_FULL) or not isinstance(hit, bool):
        raise ValueError("event, hit_ceiling: of the wrong kind")
    if ramp is not None and not (isinstance(ramp, list) and len(ramp) <= 64
                                 and all(is_size(v) for v in ramp)):
        raise ValueError("ramp: up to 64 sizes")
    return RecordCall(run, PeakCall(peak, hit, float(duration), cap, str(event), vram, ramp))


def admission_dict(adm: Admission) -> AdmissionFields:
    """An ``Admission`` as the engine sends it (its bookings as lists of their fields)."""
    data: AdmissionFields = adm._asdict()  # type: ignore[assignment]  # the same fields, by name
    data["holders"] = [list(b) for b in adm.holders]
    data["reclaimed"] = [list(b) for b in adm.reclaimed]
    return data
