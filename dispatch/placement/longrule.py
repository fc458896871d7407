"""Rule 0 of the dispatcher alone (docs/peers.md, "The dispatcher"): a job recorded or declared longer
than ``long_job_threshold`` that would use one host is refused (244) unless it declares itself long.

Apart from ``dispatch.placement.dispatcher`` so that a run here with ``--long-job-rule``
(``dispatch.placement.labelrules``; the agent hooks and shims add it to every run) applies the same
rule without importing the dispatcher and the host kinds behind it (~8 ms); ``make_job`` is the job
both see.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch.core.units import format_duration
from dispatch.guards.headers import read_headers
from dispatch.guards.longjob import KEYS, from_headers, missing, parse_spec
from dispatch.hosts.judgement import Job
from dispatch.local.admission.booking import default_label

MYPY = False
if MYPY:
    from dispatch.core.settings import Settings
    from dispatch.local.store.ledgerdb import PeakRecord


def make_job(argv: Sequence[str], *, label: str | None, cap: int | None, gpu_memory: int | None,
             expect_duration: float | None, long_job: str | bool | None,
             threads: int | None = None) -> Job:
    """The job as the dispatcher sees it. The long-job answers come from ``--long-job=SPEC`` (a bare
    ``--long-job`` answers nothing) together with the script's ``# long-job:`` header lines."""
    answers = from_headers(value for key, value in read_headers(argv) if key == "long-job")
    if isinstance(long_job, str):
        answers.update(parse_spec(long_job))
    return Job(label=label or default_label(argv), cap=cap, gpu_memory=gpu_memory,
               expect_duration=expect_duration, long_job=tuple(k for k in KEYS if k in answers),
               threads=threads)


def expected_duration(job: Job, recorded: Sequence[tuple[PeakRecord | None, str]]
                      ) -> tuple[float | None, str]:
    """The declared duration, else the longest recorded on any host (``recorded``: each host's
    record of the label, None where it has none), with where it comes from."""
    if job.expect_duration is not None:
        return job.expect_duration, "declared"
    durations = [(p.max_duration, host) for p, host in recorded if p is not None and p.max_duration]
    if not durations:
        return None, "no history"
    seconds, host = max(durations)
    return seconds, f"recorded on {host}"


def long_job_rule(settings: Settings, job: Job, recorded: Sequence[tuple[PeakRecord | None, str]]
                  ) -> tuple[list[str], bool]:
    """The reasons rule 0 gives, and whether it refuses the job (244): too long for one host and not
    declared long."""
    reasons: list[str] = []
    duration, source = expected_duration(job, recorded)
    if duration is not None:
        reasons.append(f"expected duration {format_duration(duration)} ({source})")
    lacking = missing(job.long_job)
    if duration is not None and duration > settings.long_job_threshold and lacking:
        reasons.append(f"longer than {format_duration(settings.long_job_threshold)} on one host: "
                       f"its long-job declaration lacks {', '.join(lacking)} (say how it is "
                       "sharded, resumes after an interruption, uses more than one machine: "
                       "'# long-job: KEY: how' header lines or "
                       "--long-job='sharded=...;resumable=...;multi-host=...')")
        return reasons, True
    return reasons, False
