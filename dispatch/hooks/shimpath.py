"""Where a PATH shim's real tool is: the part of the shims both the shim itself
(``dispatch.cli.shim``) and ``hostrun shims`` (``dispatch.hooks.shims``) need. Standard library only,
nothing but ``os`` at import time: it runs before every wrapped command.
"""

from __future__ import annotations

import os

MARKER = b"# hostrun-shim: "


def is_shim(path: str) -> bool:
    """``path`` is a shim that ``hostrun shims install`` wrote (its marker line near the top)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return b"\n" + MARKER in head


def find_real(tool: str, shim_dir: str, path: str | None = None) -> str | None:
    """The first ``tool`` on ``path`` (default ``$PATH``) that is neither in ``shim_dir`` nor a shim."""
    skip = os.path.realpath(shim_dir)
    for entry in (os.environ.get("PATH", "") if path is None else path).split(os.pathsep):
        directory = entry or "."
        candidate = os.path.join(directory, tool)
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            continue
        if os.path.realpath(directory) == skip or is_shim(candidate):
            continue
        return candidate
    return None
