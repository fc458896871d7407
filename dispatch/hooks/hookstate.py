"""What the hooks remember between calls (a configuration problem already told, hosts that did not
answer lately, the idle session's waiter), in the user's ``$XDG_CACHE_HOME/hostrun/hooks/``.

Every hook is a new process, so memory lives in files; the directory must be ours alone
(``dispatch.guards.trust``), or nothing in it is believed and nothing written. Best effort by
design: a cache that cannot be used costs a repeated message or a repeated read, never a hook.
"""

from __future__ import annotations

import json
import os

MYPY = False
if MYPY:
    from typing import Any


def directory() -> str:
    from dispatch.core.configpath import cache_dir

    return cache_dir(os.environ, "hooks")


def ensure() -> str:
    """The directory, created private (``UntrustedPathError`` when it is someone else's)."""
    from dispatch.guards.trust import private_dir

    return private_dir(directory())


def load(name: str) -> Any:
    """The JSON in ``name``; None when missing, unreadable, or the directory is not ours alone."""
    from dispatch.guards.trust import private_dir_ok

    if not private_dir_ok(directory()):
        return None
    try:
        with open(os.path.join(directory(), name), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def save(name: str, data: Any) -> None:
    """Write ``name`` (private, atomically); a failure is silent (see the module docstring)."""
    from dispatch.core.atomicfile import write_atomic

    try:
        write_atomic(os.path.join(ensure(), name), json.dumps(data).encode(), 0o600)
    except Exception:
        pass
