"""What a run on another machine needs of this source tree, the same for an ssh peer
(``dispatch.hosts.peerrun``) and a Slurm login node (``dispatch.hosts.slurmlogin``/``slurmrun``): the
tree and the job's place in it, its stable name there under the work root, how an rsync failure is
said (exit 252), and what a ``--return`` that failed after a successful job does to the outcome.
"""

from __future__ import annotations

import os
import socket
import subprocess

from dispatch.core.errors import SyncFailedError, UsageError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.fingerprint import short_hash

MYPY = False
if MYPY:
    from dispatch.core.outcome import Outcome

DEFAULT_WORK_ROOT = "~/hostrun-work"  # ``work_root`` of a peer or a login node, when not set
RETURN_FAILED = "the job succeeded but --return could not bring everything back"


def source_tree(explicit: str | None) -> str:
    """The tree to sync: ``--tree``, else the git top level around the current directory, else it."""
    if explicit:
        path = os.path.abspath(explicit)
        if not os.path.isdir(path):
            raise UsageError(f"--tree {explicit}: not a directory")
        return path
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10, check=False)
        if top.returncode == 0 and top.stdout.strip():
            return top.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.getcwd()


def job_place(explicit_tree: str | None) -> tuple[str, str]:
    """The tree (``source_tree``) and the current directory relative to it ("" at its top): the job
    runs in the same place in the copy. A current directory outside the tree is a usage error (2)."""
    tree = source_tree(explicit_tree)
    cwd = os.getcwd()
    rel = os.path.relpath(cwd, tree)
    if rel.startswith(".."):
        raise UsageError(f"the current directory {cwd} is outside the tree {tree} (use --tree)")
    return tree, "" if rel == "." else rel


def tree_id(tree: str) -> str:
    """Stable per source tree (and per controller host), so the remote copy stays incremental."""
    base = os.path.basename(tree.rstrip("/")) or "root"
    return f"{base}-{short_hash(f'{socket.gethostname()}:{tree}'.encode(), 12)}"


def remote_tree_spec(work_root: str | None, tree: str) -> str:
    """Where the copy of ``tree`` goes on the other machine (``~`` expanded there)."""
    return f"{(work_root or DEFAULT_WORK_ROOT).rstrip('/')}/{tree_id(tree)}"


def rsync_failure(what: str, where: str, returncode: int, stderr: str) -> SyncFailedError:
    """A failed rsync as one line: rsync's first complaint names the cause ("No such file ..."),
    its last is the aftermath."""
    lines = stderr.strip().splitlines() or [f"exit {returncode}"]
    cause = next((line for line in lines if line.startswith("rsync:")), lines[-1])
    return SyncFailedError(f"{what} with {where} failed (rsync exit {returncode}): {cause}")


def returns_failed(outcome: Outcome) -> None:
    """A ``--return`` that failed: 252 when the job itself succeeded (its output is not all here);
    a failed job keeps its own code (the failure to bring files back is said, not counted)."""
    if outcome.exit_code == 0:
        outcome.mark(ExitCode.SYNC_FAILED)
        outcome.message = RETURN_FAILED
