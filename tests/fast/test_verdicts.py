"""The verdicts (``dispatch.core.verdicts``) on recorded evidence: every code the local judgement
decides, the order of causes, and what is only a warning. Wait statuses are the kernel's encoding
(``os.waitstatus_to_exitcode``'s inverse): exit N is ``N << 8``, a signal N is ``N``."""

from __future__ import annotations

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.verdicts import MACHINE_WIDE, JobEvidence, Verdict, after_failed_return, job_verdict

OK, FAILED, KILLED = 0, 1 << 8, 9  # exit 0, exit 1, SIGKILL
EXITED_0_OOM = "a process of the job was OOM-killed, but the job exited 0; passing 0 through"
VRAM = "CUDA error: out of memory"

CASES = [
    # evidence, then (code, outcome, message, warnings)
    (JobEvidence(OK), (0, "exit", None, ())),
    (JobEvidence(3 << 8), (3, "exit", None, ())),
    (JobEvidence(KILLED), (128 + 9, "signal", None, ())),
    (JobEvidence(KILLED, timed_out=True), (253, ExitCode.MAX_RUNTIME.outcome, None, ())),
    (JobEvidence(KILLED, timed_out=True, own_cap=True, oom_killed=True),  # the runtime comes first
     (253, ExitCode.MAX_RUNTIME.outcome, None, ())),
    (JobEvidence(KILLED, own_cap=True, oom_killed=True), (250, ExitCode.OWN_CAP.outcome, None, ())),
    (JobEvidence(OK, own_cap=True, oom_killed=True), (0, "exit", None, (EXITED_0_OOM,))),
    (JobEvidence(OK, own_cap=True, oom_killed=True, whole=True),  # a session killed at its cap
     (250, ExitCode.OWN_CAP.outcome, None, ())),
    (JobEvidence(KILLED, slice_full=True, oom_killed=True), (254, ExitCode.SLICE_FULL.outcome, None, ())),
    (JobEvidence(OK, slice_full=True, oom_killed=True), (0, "exit", None, (EXITED_0_OOM,))),
    (JobEvidence(FAILED, vram=VRAM), (245, ExitCode.VRAM.outcome, f"GPU out of memory: {VRAM}", ())),
    (JobEvidence(OK, vram=VRAM),
     (0, "exit", None, (f"{VRAM} (a GPU out-of-memory), but the job exited 0; passing 0 through",))),
    (JobEvidence(KILLED, oom_killed=True), (128 + 9, "signal", MACHINE_WIDE, (MACHINE_WIDE,))),
    (JobEvidence(FAILED, own_cap=True, slice_full=True, oom_killed=True),  # its own cap before the slice
     (250, ExitCode.OWN_CAP.outcome, None, ())),
]


@pytest.mark.parametrize(("evidence", "expected"), CASES)
def test_a_job_s_evidence_gives_its_verdict(evidence: JobEvidence, expected: tuple[object, ...]) -> None:
    assert tuple(job_verdict(evidence)) == expected


def test_every_code_the_local_judgement_gives_is_covered() -> None:
    given = {job_verdict(ev).exit_code for ev, _ in CASES}
    assert {int(c) for c in (ExitCode.MAX_RUNTIME, ExitCode.OWN_CAP, ExitCode.SLICE_FULL,
                             ExitCode.VRAM)} <= given


def test_a_failed_return_is_252_only_when_the_job_succeeded() -> None:
    assert after_failed_return(0) is ExitCode.SYNC_FAILED
    assert after_failed_return(3) is None and after_failed_return(250) is None


def test_a_verdict_of_a_code_carries_its_outcome_name() -> None:
    assert Verdict.of(ExitCode.OWN_CAP, "x") == Verdict(250, ExitCode.OWN_CAP.outcome, "x", ())
