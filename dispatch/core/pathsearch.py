"""Finding a command on PATH without ``shutil``.

``shutil`` imports ``bz2``, ``lzma`` and ``fnmatch`` (~3 ms), and the paths that only ask "is
nvidia-smi / systemd-run / rsync installed?" run on every report, probe and peer run.
"""

from __future__ import annotations

import os


def which(name: str, path: str | None = None) -> str | None:
    """What ``shutil.which(name, path=path)`` answers on POSIX: a name with a slash is checked as
    it is; else the first executable, non-directory entry of ``path`` (``$PATH``, or the system's
    default search path when that is unset; an empty ``path`` finds nothing)."""
    if os.path.dirname(name):
        return name if _runnable(name) else None
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):
                path = os.defpath
    if not path:
        return None
    seen = set()
    for directory in path.split(os.pathsep):
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, name)
        if _runnable(candidate):
            return candidate
    return None


def _runnable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)
