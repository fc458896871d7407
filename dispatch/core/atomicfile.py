"""Replace a file atomically (standard library only): a reader sees the old content or the new, never
half of one, and a crash leaves no half-written file in place.

One helper for every state file hostrun rewrites (result files, lock records, owner files, caches,
the peak journal's snapshot): the temporary file is opened without following a symlink planted at
its name, and removed again when anything fails.
"""

from __future__ import annotations

import os

from dispatch.core.fdio import write_all


def write_atomic(path: str, data: bytes, mode: int = 0o600, *, exact_mode: bool = False,
                 fsync: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename.

    ``mode`` is the new file's mode, narrowed by the umask unless ``exact_mode`` (a record meant to
    be readable by every user, such as a lock record). ``fsync`` flushes the data to disk before
    the rename (for a file that must survive a power cut). On failure the temporary file is removed
    and the OSError raised.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            if exact_mode:
                os.fchmod(fd, mode)
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
