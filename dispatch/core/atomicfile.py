"""Replace a file atomically (standard library only): a reader sees the old content or the new, never
half of one, and a crash leaves no half-written file in place.

One helper for every state file hostrun rewrites (result files, lock records, owner files, caches,
the peak journal's snapshot). Some of them live in directories other users may write (a lock record
in a shared checkout), so the temporary file gets a name nobody can predict and is created
exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``): a file, hard link or symlink planted beside the target
is never opened, truncated, chmodded or renamed into place. It is removed again when anything fails.
"""

from __future__ import annotations

import os

from dispatch.core.fdio import write_all


def write_atomic(path: str, data: bytes, mode: int = 0o600, *, exact_mode: bool = False,
                 fsync: bool = False, dir_fd: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename.

    ``mode`` is the new file's mode, narrowed by the umask unless ``exact_mode`` (a record meant to
    be readable by every user, such as a lock record). ``fsync`` flushes the data to disk before
    the rename (for a file that must survive a power cut). ``dir_fd``: ``path`` is a name in that
    open directory (so a directory swapped on the way cannot redirect the write). On failure the
    temporary file is removed and the OSError raised.
    """
    tmp = temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
        try:
            if exact_mode:
                os.fchmod(fd, mode)
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def temporary_name(path: str) -> str:
    """``PATH.<pid>.<12 random hex digits>.tmp``: unique to this call, unguessable by a neighbour."""
    return f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
