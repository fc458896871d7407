"""eventfd(2) for cgroup v1 OOM notifications; ``os.eventfd`` on 3.10+, ctypes on 3.9 peers."""

from __future__ import annotations

import os

EFD_CLOEXEC = 0o2000000
EFD_NONBLOCK = 0o4000


def open_eventfd() -> int:
    flags = EFD_CLOEXEC | EFD_NONBLOCK
    if hasattr(os, "eventfd"):
        return os.eventfd(0, flags)
    import ctypes  # pragma: no cover - Python 3.9 only

    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.eventfd(0, flags))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def drain(fd: int) -> int:
    """The count accumulated since the last drain (0 if none); never blocks."""
    try:
        data = os.read(fd, 8)
    except BlockingIOError:
        return 0
    return int.from_bytes(data, "little")
