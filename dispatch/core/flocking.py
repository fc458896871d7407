"""Taking an exclusive ``flock`` with patience: polled, since ``flock`` itself has no timeout."""

from __future__ import annotations

import time


def flock_by(fd: int, deadline: float, step: float = 0.01) -> bool:
    """Lock ``fd`` exclusively, retrying until ``deadline`` (``time.monotonic``); False when another
    still holds it then. Any other error (a signal's exception included) passes through."""
    import fcntl

    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(step)
