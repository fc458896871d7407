"""The ``--gpu-memory`` bookings an admission engine holds: the devices each may have (its
``CUDA_VISIBLE_DEVICES``; None: any) and the GPUs' figures, read by ``nvidia-smi`` at most once a
second while such a booking waits (``GpuSnapshot``); a failed read is each GPU waiter's status."""

from __future__ import annotations

MYPY = False
if MYPY:
    from collections.abc import Callable

    from dispatch.capping.base import CapBackend
    from dispatch.local.admission.policy import GpuRoom
    from dispatch.local.gpus.gpu import GpuSnapshot


class GpuWaits:
    def __init__(self) -> None:
        self.wants: dict[int, frozenset[int] | None] = {}  # booking id -> the devices it may have
        self.snapshot: GpuSnapshot | None = None
        self.error: str | None = None

    def read(self, running_may_use: Callable[[], bool]) -> None:
        """The figures, re-read at most once a second, and per process when a running GPU booking
        could use them (``running_may_use``)."""
        from dispatch.core.errors import GpuError
        from dispatch.local.gpus.gpu import GpuSnapshot, read_gpus

        if self.snapshot is None:
            try:
                self.snapshot = GpuSnapshot(0, read_gpus())
            except GpuError as exc:
                self.error = str(exc)
                return
        self.snapshot.refresh(running_may_use)
        self.error = self.snapshot.error

    def room(self, booking_id: int, backend: CapBackend) -> GpuRoom | None:
        """A GPU booking's VRAM room per device, on the devices it may have (None: not a GPU booking)."""
        if booking_id not in self.wants:
            return None
        allowed = self.wants[booking_id]
        snapshot = self.snapshot
        if snapshot is None:
            return lambda running: {}
        from dispatch.local.admission.rooms import gpu_room_function

        rooms = gpu_room_function(backend, snapshot)
        return lambda running: {i: r for i, r in rooms(running).items() if allowed is None or i in allowed}

    def error_for(self, booking_id: int) -> str | None:
        """Why the GPUs could not be read, for a GPU booking's status and reason."""
        return self.error if booking_id in self.wants else None
