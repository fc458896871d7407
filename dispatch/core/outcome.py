"""The outcome of one run, as the exit code says it and as ``--result-file`` writes it (JSON)."""

from __future__ import annotations

import os

MYPY = False
if MYPY:
    from typing import Any, Optional

    from dispatch.core.exitcodes import ExitCode


FIELDS = (
    "exit_code", "outcome", "host", "label", "argv", "cap_bytes", "booking_kind", "booked_bytes",
    "peak_bytes", "hit_ceiling", "duration_s", "waited_s", "backend", "cgroup", "counters", "message",
    "gpu_index", "gpu_bytes", "vram_evidence", "vram_peak_bytes", "requeued",
)


class Outcome:
    """Filled in as the run goes; ``outcome`` is "exit", "signal", or a name from exitcodes."""

    __slots__ = (*FIELDS, "ramp")

    def __init__(
        self, *, exit_code: int, outcome: str, host: str, label: str, argv: list[str],
        cap_bytes: int | None = None, booking_kind: str | None = None,
        booked_bytes: int | None = None, peak_bytes: int | None = None, hit_ceiling: bool = False,
        duration_s: float = 0.0,
        waited_s: float = 0.0, backend: str | None = None, cgroup: str | None = None,
        counters: dict[str, int] | None = None, message: str | None = None,
        gpu_index: int | None = None, gpu_bytes: int | None = None, vram_evidence: str | None = None,
        vram_peak_bytes: int | None = None, requeued: int = 0,
    ) -> None:
        self.exit_code = exit_code
        self.outcome = outcome
        self.host = host
        self.label = label
        self.argv = argv
        self.cap_bytes = cap_bytes
        self.booking_kind = booking_kind
        self.booked_bytes = booked_bytes
        self.peak_bytes = peak_bytes
        self.hit_ceiling = hit_ceiling
        self.duration_s = duration_s
        self.waited_s = waited_s
        self.backend = backend
        self.cgroup = cgroup
        self.counters = counters or {}
        self.message = message
        self.gpu_index = gpu_index  # --gpu-memory: the GPU the job was booked on
        self.gpu_bytes = gpu_bytes  # --gpu-memory: the VRAM booked
        self.vram_evidence = vram_evidence  # what showed a GPU out-of-memory, if anything
        self.vram_peak_bytes = vram_peak_bytes  # --gpu-memory: the most VRAM the job's processes used
        self.requeued = requeued  # times it ran again after a slice-full kill (--requeue)
        # The run's ramp profile (``dispatch.local.store.ramp``), for its label's record; kept out of
        # FIELDS (the result file, the wire): the host that ran the job records it.
        self.ramp: Optional[list[int]] = None

    @classmethod
    def of(cls, code: ExitCode, *, host: str, label: str, argv: list[str], **fields: Any) -> Outcome:
        """An outcome that is hostrun's own verdict (``code`` and its outcome name together)."""
        return cls(exit_code=int(code), outcome=code.outcome, host=host, label=label, argv=argv,
                   **fields)

    def mark(self, code: ExitCode) -> None:
        """hostrun's own verdict: the code and its outcome name, always together."""
        self.exit_code, self.outcome = int(code), code.outcome

    def is_verdict(self, *codes: ExitCode) -> bool:
        """Whether hostrun itself decided this outcome as one of ``codes`` (an OOM kill it saw, a
        runtime it enforced): a job that exits 250 by itself has the number, never the verdict."""
        return any(self.exit_code == int(code) and self.outcome == code.outcome for code in codes)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def __repr__(self) -> str:
        return f"Outcome({self.to_dict()!r})"


def argv_b64(argv: list[str]) -> list[str]:
    """Each argument's bytes in base64: the faithful form of an argv that is not UTF-8 (``argv``
    holds such bytes as lone surrogates, which JSON tools turn into U+FFFD). ``binascii`` is what
    ``base64.b64encode`` runs, without the ``base64`` module's own imports (``re``, ``struct``)."""
    from binascii import b2a_base64

    return [b2a_base64(os.fsencode(arg), newline=False).decode("ascii") for arg in argv]


def write_result(path: str, outcome: Outcome) -> None:
    """Write atomically, so a reader polling for the file never sees half of it; on failure the
    temporary file is removed and the OSError raised. The text is ``json.dumps(data, indent=2,
    sort_keys=True)``'s, written without importing ``json`` (``core.jsontext.dumps``)."""
    from dispatch.core.atomicfile import write_atomic
    from dispatch.core.jsontext import dumps

    data = outcome.to_dict()
    data["argv_b64"] = argv_b64(outcome.argv)
    text = dumps(data) + "\n"
    write_atomic(path, text.encode(), 0o666)  # the caller's file: modes as its umask says


def check_result_path(path: str) -> str | None:
    """Why a result file could not be written at ``path`` (checked before the job runs), or None.

    Creates and removes a temporary file named as ``write_result``'s are, in the same directory.
    """
    from dispatch.core.atomicfile import temporary_name

    if os.path.isdir(path):
        return "it is a directory"
    tmp = temporary_name(path)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        return exc.strerror or str(exc)
    os.unlink(tmp)
    return None
