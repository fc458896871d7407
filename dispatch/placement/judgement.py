"""What the dispatcher asks and answers about one host: the job, and the judgement of whether it fits
there. Apart from ``dispatch.placement.dispatcher`` so that a host kind with its own rule
(``Host.judge``) can build a ``Judgement`` without importing the dispatcher."""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Optional


class Job(NamedTuple):
    label: str
    cap: Optional[int] = None
    gpu_memory: Optional[int] = None
    expect_duration: Optional[float] = None
    long_job: tuple[str, ...] = ()  # the long-job declaration's answered keys (dispatch.guards.longjob)


class Judgement(NamedTuple):
    host: str
    fits: bool
    could_ever_fit: bool
    need: Optional[int]
    free: Optional[int]
    reason: str
    gpu_index: Optional[int] = None  # with --gpu-memory: the GPU judged (most free after pending)
