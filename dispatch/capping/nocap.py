"""No memory cap at all: the last resort, used only with ``--no-cap``.

The job still runs in its own process group so it can be stopped as a whole; processes that leave
that group (setsid) cannot be tracked, which is exactly why hostrun refuses this backend by default.
"""

from __future__ import annotations

import os

from dispatch.capping.base import CapBackend, JobCgroup, OomEvidence, SliceUsage

MYPY = False
if MYPY:
    import signal
else:  # the C module: signal's enums would load enum, functools and collections (~3 ms a run)
    import _signal as signal


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class NoCapJob(JobCgroup):
    def __init__(self, cap: int) -> None:
        self.path = ""
        self.cap = cap
        self.pgid: int | None = None

    def started(self, pid: int) -> None:
        self.pgid = pid

    def sample(self) -> int:
        return _rss(self.pgid) if self.pgid else 0

    def charged_peak(self) -> int:
        return 0

    def pids(self) -> list[int]:
        return [self.pgid] if self.pgid and os.path.exists(f"/proc/{self.pgid}") else []

    def signal_all(self, sig: int) -> None:
        if self.pgid:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self) -> bool:
        self.signal_all(signal.SIGKILL)
        return True

    def oom_evidence(self) -> OomEvidence:
        return OomEvidence()

    def remove(self) -> None:
        pass


class NoCapBackend(CapBackend):
    name = "none"

    def __init__(self, mem_total: int) -> None:
        self.mem_total = mem_total
        self.limit = mem_total

    def describe(self) -> str:
        return "(no slice: memory is not capped)"

    def ensure_slice(self, limit: int) -> None:
        self.limit = limit

    def slice_usage(self) -> SliceUsage:
        return SliceUsage(limit=self.limit, usage=0, held=0)

    def create_job(self, job_id: str, cap: int) -> NoCapJob:
        return NoCapJob(cap)

    def job_at(self, path: str) -> JobCgroup | None:
        return None

    @property
    def caps_memory(self) -> bool:
        return False
