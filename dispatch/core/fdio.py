"""Writing whole buffers to file descriptors: the one loop (``os.write`` may write less than asked;
Python retries an interrupted write itself, PEP 475), and the policy for a job's output forwarded to
this process's stdout or stderr."""

from __future__ import annotations


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; an OSError (a closed pipe included) is raised."""
    import os

    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def forward(fd: int, data: bytes) -> None:
    """A job's output to our stdout (1) or stderr (2): a reader that went away (a closed pipe, e.g.
    ``hostrun ... | head``) drops the rest silently; the job itself goes on and keeps its own status."""
    try:
        write_all(fd, data)
    except BrokenPipeError:
        pass
