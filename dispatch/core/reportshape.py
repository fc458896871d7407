"""The declared shape of a host's report: what ``Host.report()`` returns and ``hostrun report
--json`` prints (docs/design.md, "Concepts"; the keys' meanings: docs/cli.md, "hostrun report").

A report is plain JSON data, because a peer's agent sends it over ssh and an older agent's report
must still be read; these ``TypedDict``s declare that contract for the type checker.

- ``Report``: what every kind's report has, and all that code outside ``dispatch/hosts/`` reads:
  the label's peak record, the peak table, the jobs running and queued (a pending note is settled
  by them), and the ``Room`` one job could have (``slice``) with the ``settings`` the capacity
  rules need. A kind narrows the read-only keys to its own shape.
- ``MachineReport``: a machine running hostrun's own runner (this machine, an ssh peer's agent):
  its memory, slice, load, heavy threads, GPUs, bookings and queue.
- A kind with another shape declares it beside its module (the Slurm cluster's:
  ``dispatch.hosts.slurm.shape``).

Type-checking only: runtime modules import it under ``if MYPY:``, so no report path pays for
``typing`` (a report is read before every heavy command).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, Optional, TypedDict, Union

from typing_extensions import ReadOnly


class PeakRecordData(TypedDict):
    """A label's row in a host's peak table (``dispatch.local.store.ledgerdb.PeakRecord._asdict()``); an
    older peer's agent sends fewer of the later fields."""

    label: str
    host: str
    max_peak: int
    runs: int
    last_peak: int
    hit_ceiling: bool
    last_duration: Optional[float]
    max_duration: Optional[float]
    updated: float
    ceiling_at: NotRequired[Optional[float]]
    slice_full_at: NotRequired[Optional[float]]
    clean_runs: NotRequired[int]
    max_vram: NotRequired[Optional[int]]


class Room(TypedDict):
    """The room one job could have on a host: the shared fit and capacity rules read it."""

    limit: int  # the most one job could ever be given
    free: int  # what a job could be given now


class SliceRoom(Room):
    """A machine's shared slice (docs/backends.md, "Several users, one machine")."""

    used: int
    usage_with_cache: int
    reclaimable: int
    booked: int
    booked_not_at_peak: int
    queued: int


class Memory(TypedDict):
    total: int
    available: int
    available_for_jobs: NotRequired[int]  # an older peer's agent does not report it


class RoomSettings(TypedDict):
    """The host's settings the capacity rules need; ``gamble_size`` None: the kind books no gamble
    (Slurm sizes a job without ``--mem`` itself)."""

    default_cap: Optional[int]
    gamble_size: ReadOnly[Optional[int]]


class SessionFigures(TypedDict):
    """The host's ``[sessions]`` settings and its sessions slice's limit (``hostrun capacity
    --sessions``)."""

    limit: int
    share: float
    cap: int
    first_booking: int
    high: float


class SessionsNow(TypedDict):
    """A machine's running agent sessions together (``dispatch.local.report.sessions_now``)."""

    count: int
    booked: int
    in_use: int
    jobs: int  # the running jobs they started
    limit: int  # the sessions slice's, as ``settings.sessions.limit``


class MachineSettings(RoomSettings):
    gamble_size: int
    sessions: NotRequired[SessionFigures]  # an older peer's agent does not report it
    slice_bytes: Optional[int]
    reserve_bytes: Optional[int]
    peer_memory_cap: Optional[int]  # an ssh peer's bound; None here
    state_dir: str


class Gpu(TypedDict):
    """One NVIDIA device (``dispatch.local.gpus.gpu.Gpu._asdict()``)."""

    index: int
    uuid: str
    name: str
    total: Optional[int]  # None where nvidia-smi says [N/A]
    used: Optional[int]
    free: Optional[int]


class RunningJob(TypedDict):
    id: Union[int, str]  # a booking's id; a Slurm job id
    label: Optional[str]  # a Slurm job may have no name
    booked: Optional[int]
    age_s: Optional[float]
    # what a kind may also say of a job (``hostrun top`` shows them): a machine says all three
    cap: NotRequired[Optional[int]]
    in_use: NotRequired[int]
    session: NotRequired[Optional[str]]
    # agent sessions (``hostrun session``; a machine says both, an older peer's agent neither):
    role: NotRequired[str]  # "session" for a session, "job" for a job
    in_session: NotRequired[Optional[Union[int, str]]]  # the id of the session that started it


class MachineJob(RunningJob):
    pid: int
    kind: str
    command: Optional[str]


class QueuedJob(TypedDict):
    id: Union[int, str]
    label: Optional[str]
    need: Optional[int]
    reason: Optional[str]
    waited_s: Optional[float]
    session: NotRequired[Optional[str]]  # a machine says it (an older peer's agent does not)


class MachineQueued(QueuedJob):
    pid: int


class Disagreement(TypedDict):
    key: str
    peer: object
    controller: object


class PeerNotes(TypedDict):
    """What a peer's agent adds to its machine's report about its own configuration."""

    config: Optional[str]  # the file it read, None: none
    config_error: Optional[str]  # why that file could not be used
    disagreements: list[Disagreement]  # keys where its config and the controller's differ


class AdmissionEngine(TypedDict):
    """Where this host's admission engine runs (``dispatch.local.engine.admitclient.where``)."""

    socket: Optional[str]  # its socket; None when runs do not go through it
    pid: Optional[int]  # what its hello says; None when none answers
    detail: str  # in words: running, not running (the next run starts it), off, why not


class Report(TypedDict):
    """What every kind's report has."""

    host: str  # the configured host's name (set by the controller for a peer's report)
    hostname: Optional[str]
    version: str
    time: float
    slice: ReadOnly[Room]
    settings: ReadOnly[RoomSettings]
    running: ReadOnly[Sequence[RunningJob]]
    queue: ReadOnly[Sequence[QueuedJob]]
    gpus: list[Gpu]
    queue_length: int
    label_peak: Optional[PeakRecordData]
    peak_table: NotRequired[list[dict[str, object]]]  # with ``peaks``: for ``hostrun capacity``


class MachineReport(Report):
    slice: SliceRoom
    settings: MachineSettings
    running: list[MachineJob]
    queue: list[MachineQueued]
    backend: str
    slice_path: str
    memory: Memory
    load: list[float]
    cores: int
    heavy_threads: int
    threads_free: NotRequired[int]  # an older peer's agent does not report it
    gpu_error: Optional[str]
    sessions: NotRequired[SessionsNow]  # an older peer's agent does not report it
    # ``hostrun report`` adds it for this host (``dispatch.local.report.admission_engine``)
    admission_engine: NotRequired[AdmissionEngine]
    # a peer's agent adds these
    agent_version: NotRequired[str]
    python: NotRequired[str]
    config: NotRequired[Optional[str]]
    config_error: NotRequired[Optional[str]]
    disagreements: NotRequired[list[Disagreement]]
