"""Where a cluster's Slurm client commands run: on this machine, with the host's ``slurm_conf`` as
``SLURM_CONF`` when set. Each call has a deadline, as reading a peer does, so a stuck slurmctld
makes a report say "could not read", never hang.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from dispatch.core.errors import NotRunError, PeerUnreachableError
from dispatch.core.records import NamedTuple
from dispatch.hosts.slurm.keys import SlurmOptions


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


class SlurmCommands:
    """Runs ``scontrol``, ``squeue``, ``sacct``, ``scancel`` and ``srun`` for one cluster, named
    ``name``, on this machine (``dispatch.hosts.slurm.login.LoginCommands``: on a login node)."""

    remote = False  # the job's directory is this machine's own (a filesystem the nodes share)

    def __init__(self, name: str, options: SlurmOptions) -> None:
        self.name = name
        self.options = options

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: ours) with the cluster's ``SLURM_CONF`` when the host sets one."""
        env = dict(os.environ if base is None else base)
        if self.options.slurm_conf:
            env["SLURM_CONF"] = self.options.slurm_conf
        return env

    def run(self, argv: Sequence[str], timeout: float) -> Done:
        """One command to its end; its own failure is the caller's to read (``returncode``).

        A command that is not installed is NotRunError (78); one that outlives ``timeout`` is killed
        and raises PeerUnreachableError (246), as a peer that does not answer in time.
        """
        try:
            done = subprocess.run(list(argv), env=self.environment(), capture_output=True,
                                  timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise NotRunError(f"{self.name}: {argv[0]} not found: Slurm's client commands are not "
                              "installed here (or set ssh = a login node)") from None
        except subprocess.TimeoutExpired:
            raise PeerUnreachableError(f"{self.name}: {argv[0]} did not answer within "
                                       f"{timeout:g} s") from None
        return Done(done.returncode, done.stdout.decode(errors="replace"),
                    done.stderr.decode(errors="replace"))

    def start(self, argv: Sequence[str], env: dict[str, str], directory: str | None,
              stdin: bool) -> subprocess.Popen[bytes]:
        """srun, started: its stdout is ours, its stderr piped to the caller; ``directory`` is
        already in srun's ``--chdir``. Its own session: a terminal's Ctrl-C is the caller's to pass."""
        try:
            return subprocess.Popen(list(argv), env=self.environment(env), stderr=subprocess.PIPE,
                                    stdin=None if stdin else subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise NotRunError(f"{self.name}: {argv[0]} not found: Slurm's client commands are not "
                              "installed here (or set ssh = a login node)") from None
