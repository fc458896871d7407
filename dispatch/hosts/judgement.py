"""What the dispatcher asks and answers about one host: the job, what is still pending there, and the
judgement of whether it fits. Part of the ``Host`` seam (hosts sit below placement): a host kind with
its own rule (``Host.judge``) builds a ``Judgement`` without importing the dispatcher."""

from __future__ import annotations

from dispatch.core.records import NamedTuple

MYPY = False
if MYPY:
    from typing import Optional

    from dispatch.core.reportshape import Gpu


class Job(NamedTuple):
    label: str
    cap: Optional[int] = None
    gpu_memory: Optional[int] = None
    expect_duration: Optional[float] = None
    long_job: tuple[str, ...] = ()  # the long-job declaration's answered keys (dispatch.guards.longjob)
    threads: Optional[int] = None  # --threads: a cluster node must have that many CPUs to give


class HostPending(NamedTuple):
    """What a host has pending (``dispatch.placement.pending``): memory, VRAM per GPU index, and VRAM
    on a GPU not yet known."""
    memory: int
    vram: dict[int, int]
    vram_unplaced: tuple[int, ...]


class Judgement(NamedTuple):
    host: str
    fits: bool
    could_ever_fit: bool
    need: Optional[int]
    free: Optional[int]
    reason: str
    gpu_index: Optional[int] = None  # with --gpu-memory: the GPU judged (most free after pending)
    too_big: bool = False  # never fits because the cap is over the host's whole slice (243, not 78)


def gpu_free_after(gpus: list[Gpu], pending: HostPending) -> dict[int, int]:
    """Free VRAM per GPU index after the host's pending VRAM: placed notes on their device, each
    unplaced one on the device with the most left (where admission would put it)."""
    free: dict[int, int] = {}
    for position, gpu in enumerate(gpus):
        index = int(gpu["index"]) if gpu.get("index") is not None else position
        free[index] = int(gpu.get("free") or 0) - pending.vram.get(index, 0)  # "[N/A]" counts as none
    for size in pending.vram_unplaced:
        if free:
            best = max(free, key=lambda i: free[i])
            free[best] -= size
    return free
