"""What a run on another machine needs of this source tree, the same for an ssh peer
(``dispatch.hosts.ssh.peerrun``) and a Slurm login node (``dispatch.hosts.slurm.login``/``run``): the
tree and the job's place in it, its stable name there under the work root and the owner claim on it,
rsync to and from there (one runner, one timeout rule, one failure line: exit 252), the ``--return``
paths brought back (a failure after a successful job is 252), and our stdin pumped to the job.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Sequence

from dispatch.core.errors import SyncFailedError, UsageError
from dispatch.core.fingerprint import short_hash
from dispatch.core.records import NamedTuple
from dispatch.hosts.ssh.sync import PROTECT_ARGS, die_with_parent, shell_unsafe

MYPY = False
if MYPY:
    from dispatch.core.outcome import Outcome
    from dispatch.hosts.ssh.transport import SshTransport

DEFAULT_WORK_ROOT = "~/hostrun-work"  # ``work_root`` of a peer or a login node, when not set
RETURN_FAILED = "the job succeeded but --return could not bring everything back"


class Limit(NamedTuple):
    """How long one rsync may take (None: as long as it needs), and how its expiry is said."""

    seconds: float | None
    says: str = "no end within"


# The one timeout rule, per kind and direction, side by side. A peer's sync has no limit (the
# agent's heartbeats watch the link, Ctrl-C stops it); its --return is bounded. A login node has no
# heartbeat: every rsync there is bounded by the hour.
PEER_SYNC = Limit(None)
PEER_RETURN = Limit(300.0, "no progress within")
LOGIN_RSYNC = Limit(3600.0, "no end within")


def current_directory() -> str:
    """``os.getcwd()``, or a usage error (2) naming the problem when it was deleted under us."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory no longer exists (deleted); cd to one that does"
                         ) from None


def source_tree(explicit: str | None) -> str:
    """The tree to sync: ``--tree``, else the git top level around the current directory, else it."""
    cwd = current_directory()
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
    return cwd


def job_place(explicit_tree: str | None) -> tuple[str, str]:
    """The tree (``source_tree``) and the current directory relative to it ("" at its top): the job
    runs in the same place in the copy. A current directory outside the tree is a usage error (2)."""
    tree = source_tree(explicit_tree)
    cwd = current_directory()
    rel = os.path.relpath(cwd, tree)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):  # not "..foo", a name inside it
        raise UsageError(f"the current directory {cwd} is outside the tree {tree} (use --tree)")
    return tree, "" if rel == "." else rel


def tree_id(tree: str) -> str:
    """Stable per source tree (and per controller host), so the remote copy stays incremental."""
    base = os.path.basename(tree.rstrip("/")) or "root"
    return f"{base}-{short_hash(f'{socket.gethostname()}:{tree}'.encode(), 12)}"


def remote_tree_spec(work_root: str | None, tree: str) -> str:
    """Where the copy of ``tree`` goes on the other machine (``~`` expanded there)."""
    return f"{(work_root or DEFAULT_WORK_ROOT).rstrip('/')}/{tree_id(tree)}"


def work_claim(tree: str, session: str | None) -> dict[str, str]:
    """The owner claim on the copy of ``tree`` (``dispatch.guards.workdirs``' owner file): the
    controller's session, and a purpose that says whose copy it is."""
    from dispatch.guards.workdirs import fallback_session

    return {"session": session or fallback_session(),
            "purpose": f"hostrun --peer sync target of {socket.gethostname()}:{tree}"}


def rsync_failure(what: str, where: str, returncode: int, stderr: str) -> SyncFailedError:
    """A failed rsync as one line: rsync's first complaint names the cause ("No such file ..."),
    its last is the aftermath."""
    lines = stderr.strip().splitlines() or [f"exit {returncode}"]
    cause = next((line for line in lines if line.startswith("rsync:")), lines[-1])
    return SyncFailedError(f"{what} with {where} failed (rsync exit {returncode}): {cause}")


def returns_failed(outcome: Outcome) -> None:
    """A ``--return`` that failed, judged (``verdicts.after_failed_return``) into ``outcome``."""
    from dispatch.core.verdicts import after_failed_return

    code = after_failed_return(outcome.exit_code)
    if code is not None:
        outcome.mark(code)
        outcome.message = RETURN_FAILED


def rsync_over(ssh: SshTransport, options: list[str], args: list[str]) -> list[str]:
    """rsync with ``options`` and ``args`` (remote paths as ``<ssh destination>:PATH``), its ``-e``
    riding on ``ssh``'s ControlMaster."""
    return ["rsync", *options, "-e", ssh.rsync_rsh(), *args]


class Rsync:
    """rsync between this tree and its copy on ``where``, over ssh (``argv_of(options, args)`` puts
    ``-e`` and the ssh command in). One at a time; ``stop`` (from another thread) kills the one
    running. It runs in its own session (a Ctrl-C for hostrun must not cut it mid-file) but dies
    with us.

    Without ``protect_args`` (no ``-s``) the other side's shell reads the remote paths: ``guard``,
    (the ``host:`` prefix, whose shell), refuses such a path at each rsync, where a caller has not
    refused it before anything ran."""

    def __init__(self, where: str, argv_of: Callable[[list[str], list[str]], list[str]],
                 protect_args: bool, guard: tuple[str, str] | None = None) -> None:
        self.where = where
        self.argv_of = argv_of
        self.protect_args = protect_args
        self.guard = guard
        self._proc: subprocess.Popen[str] | None = None

    def run(self, args: list[str], what: str, limit: Limit, *, stdin: bytes | None = None,
            progress: bool = False) -> None:
        """One rsync; SyncFailedError (252) with its first complaint when it fails or overruns."""
        if self.guard is not None and not self.protect_args:
            prefix, shell = self.guard
            if any(shell_unsafe(a) for a in args if a.startswith(prefix)):
                raise SyncFailedError(f"{what}: the local rsync cannot protect a remote path from "
                                      f"{shell} (no -s): use a newer rsync")
        options = ["-a", *(["--info=progress2"] if progress else []),
                   *([PROTECT_ARGS] if self.protect_args else [])]
        try:
            proc = subprocess.Popen(self.argv_of(options, args),
                                    stdout=None if progress else subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    stdin=None if stdin is None else subprocess.PIPE,
                                    preexec_fn=die_with_parent())
        except OSError as exc:
            raise SyncFailedError(f"{what}: cannot run rsync: {exc.strerror}") from None
        self._proc = proc
        try:
            _, stderr = proc.communicate(
                None if stdin is None else stdin.decode("utf-8", "surrogateescape"), timeout=limit.seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):  # not waiting for them: an ssh child
                if pipe is not None:  # of rsync's may hold them open
                    pipe.close()
            proc.wait()
            raise SyncFailedError(f"{what} with {self.where}: {limit.says} {limit.seconds:g} s") from None
        finally:
            self._proc = None
        if proc.returncode != 0:
            raise rsync_failure(what, self.where, proc.returncode, stderr)

    def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def bring_back(self, returns: Sequence[str], remote_dir: str, local_dir: str, limit: Limit,
                   say: Callable[[str], None]) -> bool:
        """``--return`` paths (``remote_dir`` is ``host:dir``, the job's directory in the copy) into
        the job's directory here, each said as it fails; whether any failed (``returns_failed``)."""
        failed = False
        for path in returns:
            try:
                self.run(["--relative", f"{remote_dir}/./{path}", f"{local_dir}/"], f"--return {path}",
                         limit)
            except SyncFailedError as exc:
                say(f"error: {exc}")
                failed = True
        return failed


def pump_stdin(write: Callable[[bytes], None], close: Callable[[], None]) -> None:
    """Our stdin to the job, until EOF (a read error counts as EOF), then ``close``: the job sees
    EOF too. A ``write`` that fails (the session ended) stops the pump; ``close`` still runs."""
    try:
        while True:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            if not data:
                break
            write(data)
    except (OSError, ValueError):
        pass
    finally:
        close()
