"""rsync as ``hostrun --peer`` starts it: arguments the peer's shell never sees, and never outliving
hostrun.

**Protected arguments.** rsync names remote paths on the remote shell's command line. rsync 3.2.4+
escapes them by default, but ``RSYNC_OLD_ARGS=1`` (or rsync 3.1.3-3.2.3 itself) passes them as they
are, so ``--return 'a b;touch X'`` ran ``touch X`` on the peer. ``-s`` (``--protect-args``, called
``--secluded-args`` since 3.3) sends them inside the protocol instead; hostrun passes it whenever the
local rsync has it, and otherwise refuses paths the remote shell would interpret.

**Dying with hostrun.** rsync runs in a session of its own (a Ctrl-C meant for hostrun must not cut
it mid-file), so a SIGKILLed hostrun used to leave it (and its ssh) running until the transfer ended.
``PR_SET_PDEATHSIG`` makes the kernel SIGKILL it when the thread that started it goes; the agent on
the peer stops the remote ``rsync --server`` (``SYNC_MARK``) when the session drops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Sequence

from dispatch.core.atomicfile import write_atomic
from dispatch.core.pathsearch import which

PROTECT_ARGS = "-s"
SYNC_MARK = "HOSTRUN_SYNC"  # in the remote rsync's environment: which run's sync it is
_CACHE = "rsync-caps.json"
# Characters no shell gives a meaning to; any other ASCII character in an unprotected remote path is
# refused (non-ASCII bytes are plain characters to a shell).
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,/:@+%")
PR_SET_PDEATHSIG = 1


def protects_args(state_dir: str) -> bool:
    """Whether the local rsync has ``-s``: its ``--help`` read once per rsync binary (path, size,
    mtime), then cached in ``<state_dir>/rsync-caps.json`` (0600)."""
    binary = which("rsync")
    if binary is None:
        return True  # no rsync: running it fails on its own, with a clear 252
    st = os.stat(binary)
    key = f"{os.path.realpath(binary)}:{st.st_size}:{st.st_mtime_ns}"
    path = os.path.join(state_dir, _CACHE)
    try:
        with open(path, encoding="utf-8") as fh:
            cached = json.load(fh)
        if cached.get("binary") == key:
            return bool(cached["protect_args"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    try:
        help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30,
                                   check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return True  # cannot tell: passing -s to an rsync without it fails loudly, never silently
    found = "--protect-args" in help_text or "--secluded-args" in help_text
    try:
        write_atomic(path, json.dumps({"binary": key, "protect_args": found}).encode())
    except OSError:
        pass
    return found


def shell_unsafe(path: str) -> bool:
    """Whether a remote shell would give a character of ``path`` a meaning (space, ``;``, ``$``...)."""
    return any(ch not in _SAFE and ord(ch) < 128 for ch in path)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the starting thread ends (hostrun
    killed included); None where ``prctl`` is not available. ``prctl`` is looked up here, before the
    fork: the child only makes the call."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # hostrun died before the call: nothing would kill us later
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def tree_sync_options(sync_excludes: Sequence[str]) -> list[str]:
    """rsync's options for a tree sent to a work directory (``--peer``, a cluster's login node).

    ``--modify-window=-1``: compare mtimes to the nanosecond. The default (whole seconds) misses an
    edit that keeps the size within the same second, which an agent's quick edits often do. The owner
    file, lock files and the copy's manifest at the top are the peer's own: never sent, never deleted.
    """
    from dispatch.agent.treestate import MANIFEST

    return ["--modify-window=-1", "--filter=:- .gitignore", "--exclude=/.git/",
            "--exclude=/.hostrun-owner*", "--exclude=/.hostrun-lock*", f"--exclude=/{MANIFEST}*",
            *(f"--exclude={pattern}" for pattern in sync_excludes)]
