"""Taking a ``flock`` on a descriptor: at once or not at all, waiting as long as it takes, or with
patience until a deadline (polled, since ``flock`` itself has no timeout). The lock lasts until the
descriptor is closed (or ``LOCK_UN``); every hostrun lock file goes through here."""

from __future__ import annotations

import time


def try_flock(fd: int, shared: bool = False) -> bool:
    """Lock ``fd`` (exclusively, or ``shared``) without waiting: False when another holds it. Any
    other error passes through."""
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def flock_wait(fd: int) -> None:
    """Lock ``fd`` exclusively, waiting as long as another holds it (a signal's exception ends the
    wait)."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


def flock_by(fd: int, deadline: float, step: float = 0.01) -> bool:
    """Lock ``fd`` exclusively, retrying until ``deadline`` (``time.monotonic``); False when another
    still holds it then. Any other error (a signal's exception included) passes through."""
    while not try_flock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True
