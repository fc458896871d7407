"""Which evidence gives which exit code: pure functions beside the code table (``exitcodes``), tested
on recorded evidence (``tests/fast/test_verdicts.py``). The parts that watch a job gather the
evidence (the runner: its wait status and cgroup counters; a peer run: what came back; the Slurm
kind its own, in ``dispatch.hosts.slurm.job``) and ask here; what they ask is a ``Verdict``.

Standard library only: it is shipped to peers, whose agent judges its jobs with it.
"""

from __future__ import annotations

import os

from dispatch.core.exitcodes import ExitCode, from_wait_status
from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Optional

class Verdict(NamedTuple):
    """An ended job's exit code and outcome (``exit``, ``signal``, or an exit code's outcome name),
    the message that says why, and ``warnings``: what is said while the code stands (an OOM kill
    the job survived)."""

    exit_code: int
    outcome: str
    message: Optional[str] = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(cls, code: ExitCode, message: str | None = None, warnings: tuple[str, ...] = ()) -> Verdict:
        """hostrun's own verdict: the code and its outcome name together."""
        return cls(int(code), code.outcome, message, warnings)


class JobEvidence(NamedTuple):
    """What a job that ran here left: its wait status, whether its max runtime ended it, what the
    kernel's counters say of out-of-memory kills (at its own cap, at the slice's limit, any), the
    GPU out-of-memory line found in its output or the kernel log, and whether it is an agent
    session (ended whole at its own cap)."""

    status: int
    timed_out: bool = False
    own_cap: bool = False
    slice_full: bool = False
    oom_killed: bool = False
    vram: Optional[str] = None
    whole: bool = False


MACHINE_WIDE = ("a process of the job was OOM-killed by a machine-wide out-of-memory, not at its cap or "
                "the slice's; the job's own status passes through")


def job_verdict(ev: JobEvidence) -> Verdict:
    """The first cause first: its max runtime (253), its own cap (250), a full slice (254), a GPU
    out-of-memory (245), else its own wait status. An OOM kill or a GPU OOM that did not fail the
    job, or a machine-wide OOM kill, is a warning. A whole run (an agent session) killed at its own
    cap is 250 even when its main process then ended on its own."""
    failed = not (os.WIFEXITED(ev.status) and os.WEXITSTATUS(ev.status) == 0)
    if ev.timed_out:
        found = Verdict.of(ExitCode.MAX_RUNTIME)
    elif ev.own_cap and (failed or ev.whole):
        found = Verdict.of(ExitCode.OWN_CAP)
    elif ev.slice_full and failed:
        found = Verdict.of(ExitCode.SLICE_FULL)
    elif ev.vram is not None and failed:
        found = Verdict.of(ExitCode.VRAM, f"GPU out of memory: {ev.vram}")
    else:
        found = Verdict(*from_wait_status(ev.status))
    warnings: list[str] = []
    if ev.oom_killed and not failed and not (ev.whole and ev.own_cap):
        warnings.append("a process of the job was OOM-killed, but the job exited 0; passing 0 through")
    elif ev.oom_killed and not (ev.own_cap or ev.slice_full or ev.timed_out):
        found = found._replace(message=MACHINE_WIDE)  # neither its cap nor the slice: the machine ran out
        warnings.append(MACHINE_WIDE)
    if ev.vram is not None and not failed:
        warnings.append(f"{ev.vram} (a GPU out-of-memory), but the job exited 0; passing 0 through")
    return found._replace(warnings=tuple(warnings))


def after_failed_return(job_code: int) -> ExitCode | None:
    """A ``--return`` that failed: 252 when the job itself succeeded (its output is not all here);
    a failed job keeps its own code (the failure to bring files back is said, not counted)."""
    return ExitCode.SYNC_FAILED if job_code == 0 else None
