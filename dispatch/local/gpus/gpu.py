"""GPUs: the ``nvidia-smi`` fact (a command plus a pure parser) and GPU out-of-memory detection.

Standard library only, and imported only when a job asks for ``--gpu-memory`` (or a report reads the
GPUs): a plain ``hostrun -- CMD`` never loads this module.

Devices. ``nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free
--format=csv,noheader,nounits`` prints one line per GPU, fields separated by ``", "``, memory in MiB.
A figure the device does not report reads ``[N/A]`` (older drivers: ``[Not Supported]``) and becomes
None. nvidia-smi does not quote its CSV fields, so a name that itself contains a comma (vGPU and MIG
profile names can) is taken as everything between the uuid and the three trailing figures; a name in
double quotes is unquoted as CSV would. No ``nvidia-smi`` on PATH means no GPUs, which is not an error;
one that fails or does not answer within ``SMI_TIMEOUT`` raises :class:`GpuError` saying why.

Out of memory. cgroups do not cap VRAM, so a shortage shows only as a message: in the job's own output
(``OUTPUT_PATTERNS``, found by ``dispatch.local.gpus.gputee.OutputTee``, which forwards the job's stdout and
stderr live and keeps just a short tail for matching), and, for allocations made by the driver, as
``NV_ERR_NO_MEMORY`` in the kernel log (``dispatch.local.gpus.kernlog``, which a job without ``--gpu-memory``
loads alone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from dispatch.core.errors import GpuError, NeverFitsError, NotRunError
from dispatch.core.records import NamedTuple
from dispatch.core.units import MiB, format_size
from dispatch.local.gpus.gputee import OUTPUT_PATTERNS as OUTPUT_PATTERNS
from dispatch.local.gpus.gputee import OutputTee as OutputTee
from dispatch.local.gpus.kernlog import (  # noqa: F401  (KernelLog & co are dispatch.local.gpus.gpu's API too)
    CHUNK,
    KERNEL_LOG_ENV,
    KERNEL_PATTERNS,
    KMSG,
    KernelLog,
    KernelWatch,
    PatternScanner,
)

MYPY = False
if MYPY:
    from typing import Optional

SMI_TIMEOUT = 5.0
VRAM_SAMPLE_INTERVAL = 2.0  # seconds between readings of a --gpu-memory job's VRAM
QUERY_FIELDS = "index,uuid,name,memory.total,memory.used,memory.free"
QUERY_GPUS = (f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits")
QUERY_APPS = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")


class Gpu(NamedTuple):
    index: int  # type: ignore[assignment]  # nvidia-smi's name; shadows tuple.index
    uuid: str
    name: str
    total: Optional[int]  # bytes; None where nvidia-smi says [N/A]
    used: Optional[int]
    free: Optional[int]


class GpuApp(NamedTuple):
    """One process using a GPU, from ``--query-compute-apps``."""

    uuid: str
    pid: int
    used: Optional[int]  # bytes


# ------------------------------------------------------------------------------------------ parsing
def _unquote(field: str) -> str:
    field = field.strip()
    if len(field) >= 2 and field[0] == field[-1] == '"':
        return field[1:-1].replace('""', '"')
    return field


def _mib(field: str) -> int | None:
    try:
        value = int(field.strip())
    except ValueError:
        return None  # [N/A], [Not Supported], [Insufficient Permissions], ...
    return value * MiB if value >= 0 else None


def _fields(line: str, before: int, after: int) -> list[str] | None:
    """A line's fields when only the one after the first ``before`` may itself contain commas."""
    parts = line.split(",")
    if len(parts) < before + 1 + after:
        return None
    middle = ",".join(parts[before:len(parts) - after])
    return [_unquote(p) for p in parts[:before]] + [_unquote(middle)] + [
        _unquote(p) for p in parts[len(parts) - after:]
    ]


def parse_gpus(text: str) -> list[Gpu]:
    """Devices from the ``QUERY_GPUS`` output; lines that are not device rows are skipped."""
    gpus = []
    for line in text.splitlines():
        fields = _fields(line, 2, 3) if line.strip() else None
        if fields is None:
            continue
        try:
            index = int(fields[0])
        except ValueError:
            continue
        gpus.append(Gpu(index=index, uuid=fields[1], name=fields[2], total=_mib(fields[3]),
                        used=_mib(fields[4]), free=_mib(fields[5])))
    return gpus


def parse_apps(text: str) -> list[GpuApp]:
    """Processes from the ``QUERY_APPS`` output ("No running processes found" gives none)."""
    apps = []
    for line in text.splitlines():
        parts = [_unquote(p) for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            pid = int(parts[1])
        except ValueError:
            continue
        apps.append(GpuApp(uuid=parts[0], pid=pid, used=_mib(parts[2])))
    return apps


# ------------------------------------------------------------------------------------------ reading
def _smi(args: Sequence[str], timeout: float) -> str | None:
    """nvidia-smi's stdout; None when it is not on PATH; GpuError when it fails or hangs."""
    from dispatch.core.pathsearch import which

    exe = which("nvidia-smi")
    if exe is None:
        return None
    import subprocess

    try:
        proc = subprocess.Popen([exe, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        raise GpuError(f"cannot run {exe}: {exc.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        raise GpuError(f"nvidia-smi did not answer within {timeout:g} s") from None
    if proc.returncode != 0:
        lines = (out + err).decode(errors="replace").strip().splitlines()
        why = lines[-1].strip() if lines else "no output"
        raise GpuError(f"nvidia-smi failed (exit {proc.returncode}): {why}")
    return out.decode(errors="replace")


def read_gpus(timeout: float = SMI_TIMEOUT) -> list[Gpu]:
    """This host's GPUs: [] when nvidia-smi is not installed; GpuError when it fails or hangs."""
    text = _smi(QUERY_GPUS, timeout)
    return [] if text is None else parse_gpus(text)


def read_gpu_apps(timeout: float = SMI_TIMEOUT) -> list[GpuApp]:
    text = _smi(QUERY_APPS, timeout)
    return [] if text is None else parse_apps(text)


# ---------------------------------------------------------------------------------------- admission
def visible(gpus: Sequence[Gpu], spec: str | None) -> list[Gpu]:
    """The devices a job may use given its inherited ``CUDA_VISIBLE_DEVICES`` (all when unset).

    Tokens are nvidia-smi indices or (prefixes of) UUIDs; as CUDA does, the list ends at the first
    token that names no device, so ``""`` or ``-1`` hide every GPU.
    """
    if spec is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for token in (t.strip() for t in spec.split(",")):
        found = [g for g in gpus if token == str(g.index)
                 or (token.startswith("GPU-") and g.uuid.startswith(token))]
        if not token or not found:
            break
        chosen.extend(g for g in found if g not in chosen)
    return chosen


def preflight(need: int, environ: Mapping[str, str], timeout: float = SMI_TIMEOUT) -> list[Gpu]:
    """The devices a ``--gpu-memory`` job could be booked on; refuse what can never run.

    No nvidia-smi, no GPU, none visible or none reporting its memory → NotRunError (78). ``need``
    above the total of every candidate → NeverFitsError (243). Nothing is booked before this passes.
    """
    try:
        gpus = read_gpus(timeout)
    except GpuError as exc:
        raise GpuError(f"--gpu-memory: cannot read the GPUs: {exc}; nothing ran") from None
    if not gpus:
        found = "nvidia-smi lists no GPU" if _has_smi() else "nvidia-smi is not on PATH"
        raise NotRunError(f"--gpu-memory needs a GPU, but {found}; nothing ran")
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    candidates = visible(gpus, spec)
    if not candidates:
        raise NotRunError(f"--gpu-memory: CUDA_VISIBLE_DEVICES={spec!r} leaves none of this host's "
                          f"{len(gpus)} GPU(s); nothing ran")
    known = [g for g in candidates if g.total is not None and g.free is not None]
    if not known:
        raise NotRunError("--gpu-memory: no GPU here reports its memory (nvidia-smi says [N/A]), "
                          "so VRAM cannot be booked; nothing ran")
    largest = max(known, key=lambda g: (g.total or 0, -g.index))
    if need > (largest.total or 0):
        raise NeverFitsError(
            f"--gpu-memory {format_size(need)} is larger than any GPU here (largest: GPU "
            f"{largest.index}, {format_size(largest.total)}); it could never be admitted"
        )
    return known


def _has_smi() -> bool:
    from dispatch.core.pathsearch import which

    return which("nvidia-smi") is not None


def gpu_rooms(gpus: Sequence[Gpu], held: Sequence[tuple[int, int, Sequence[int]]],
              apps: Sequence[GpuApp]) -> dict[int, int]:
    """VRAM room per device index: free now, less what running bookings have yet to allocate.

    ``held`` is (device index, booked bytes, pids of that job) per running GPU booking. A job's own
    allocation already shows in nvidia-smi's ``free``, so only the part of its booking it has not
    allocated yet (booked - what its processes hold on that device, per ``apps``) is taken off. A job
    whose processes cannot be matched counts as having allocated nothing: room is underestimated,
    never overestimated.
    """
    index_of = {g.uuid: g.index for g in gpus}
    allocated: dict[tuple[int, int], int] = {}
    for app in apps:
        index = index_of.get(app.uuid)
        if index is not None and app.used:
            allocated[(index, app.pid)] = allocated.get((index, app.pid), 0) + app.used
    rooms = {g.index: g.free for g in gpus if g.free is not None and g.total is not None}
    for index, booked, pids in held:
        if index in rooms:
            mine = sum(allocated.get((index, pid), 0) for pid in pids)
            rooms[index] = rooms[index] - max(0, booked - mine)
    return rooms


def device_environment(gpu: Gpu) -> dict[str, str]:
    """What a job booked on ``gpu`` gets: its UUID in CUDA_VISIBLE_DEVICES (CUDA's own device order
    need not match nvidia-smi's indices; a UUID is unambiguous), and the index in HOSTRUN_GPU."""
    env = {"HOSTRUN_GPU": str(gpu.index)}
    if gpu.uuid.startswith("GPU-"):
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu.index)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # then CUDA's indices are nvidia-smi's
    return env


class GpuSnapshot:
    """The figures one admission attempt judges by, read outside the ledger's write lock.

    nvidia-smi can take a second without persistence mode; reading it inside the ledger transaction
    would stall every hostrun on the host. A snapshot is reused for up to ``max_age`` seconds: a
    stale one only underestimates room, because bookings are always read fresh from the ledger.
    """

    def __init__(self, need: int, candidates: Sequence[Gpu], max_age: float = 1.0,
                 timeout: float = SMI_TIMEOUT) -> None:
        self.need = need
        self.allowed = {g.index for g in candidates}
        self.gpus: list[Gpu] = list(candidates)
        self.apps: list[GpuApp] = []
        self.error: str | None = None
        self.max_age = max_age
        self.timeout = timeout
        self.read_at = time.monotonic()
        self._apps_at = float("-inf")

    def refresh(self, want_apps: Callable[[], bool]) -> None:
        """Re-read nvidia-smi if the figures are older than ``max_age``; the per-process usage too
        when ``want_apps()`` says a running GPU booking could use it."""
        now = time.monotonic()
        if now - self.read_at >= self.max_age:
            self.read_at = now
            try:
                self.gpus = [g for g in read_gpus(self.timeout) if g.index in self.allowed]
                self.error = None if self.gpus else "nvidia-smi lists none of the GPUs now"
            except GpuError as exc:
                self.gpus, self.error = [], str(exc)
        if now - self._apps_at >= self.max_age and want_apps():
            self._apps_at = now
            try:
                self.apps = read_gpu_apps(self.timeout)
            except GpuError:
                self.apps = []  # no per-process figures: whole bookings come off (underestimates)

    def rooms(self, held: Sequence[tuple[int, int, Sequence[int]]]) -> dict[int, int]:
        return gpu_rooms(self.gpus, held, self.apps)

    def device(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)


class GpuRun(KernelWatch):
    """Everything a ``--gpu-memory`` run carries: the request, candidates, the tee, the kernel log, and
    the most VRAM the job's processes used (``vram_peak``).

    The VRAM is read from ``--query-compute-apps`` every ``VRAM_SAMPLE_INTERVAL`` in a thread of its
    own: nvidia-smi can take a second on a busy device, and the run's loop forwards the job's output.
    Only the job's own processes count (the pids in its cgroup, as nvidia-smi reports host pids).
    """

    def __init__(self, need: int, candidates: Sequence[Gpu]) -> None:
        super().__init__()
        self.need = need
        self.snapshot = GpuSnapshot(need, candidates)
        self.device: Gpu | None = None
        self.vram_peak = 0  # bytes; 0 until one of the job's processes shows on a GPU
        self._stop_sampling: threading.Event | None = None
        self._sampler: threading.Thread | None = None

    def sample_vram(self, pids: Callable[[], Sequence[int]]) -> None:
        """One reading: the job's processes' VRAM (summed) into ``vram_peak``. A failed read is
        skipped: the peak is what was seen, never an invention."""
        try:
            apps = read_gpu_apps(self.snapshot.timeout)
        except GpuError:
            return
        mine = set(pids())
        used = sum(a.used or 0 for a in apps if a.pid in mine)
        self.vram_peak = max(self.vram_peak, used)

    def start_sampling(self, pids: Callable[[], Sequence[int]],
                       interval: float = VRAM_SAMPLE_INTERVAL) -> None:
        """Sample the job's VRAM until ``finish`` (or ``close``), the first time at once."""
        stop = self._stop_sampling = threading.Event()

        def loop() -> None:
            while True:
                self.sample_vram(pids)
                if stop.wait(interval):
                    return

        self._sampler = threading.Thread(target=loop, name="hostrun-vram", daemon=True)
        self._sampler.start()

    def _stop(self) -> None:
        if self._stop_sampling is not None:
            self._stop_sampling.set()
        if self._sampler is not None:
            self._sampler.join(self.snapshot.timeout + 1.0)
            self._sampler = None

    def start_output(self) -> tuple[int, int]:
        """Create the job's stdout/stderr pipes (before the fork); returns the child's ends."""
        tee = OutputTee()
        self.tee = tee
        assert tee.child_fds is not None
        return tee.child_fds

    def finish(self) -> str | None:
        """After the job: forward the rest of its output and say what shows a GPU OOM, if anything;
        the output first. The VRAM sampling stops here (the job's processes are gone)."""
        self._stop()
        if self.tee is not None:
            self.tee.drain()
        in_log = super().finish()
        found = self.tee.evidence if self.tee is not None else None
        return found if found is not None else in_log

    def close(self) -> None:
        self._stop()
        if self.tee is not None:
            self.tee.close()
        super().close()
