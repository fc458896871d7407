"""A cluster reached through a login node over SSH (``ssh`` set on a slurm host): Slurm's client
commands run there through the peer's SSH transport (one ControlMaster, the user's ~/.ssh/config),
and the tree is rsynced to ``work_root`` there over the same connection before the job.

The job's argv never goes through the login node's shell: ssh's command line carries only a fixed
Python one-liner (``SHIM``), which reads the environment, the directory and srun's argv as bytes from
its stdin (length-prefixed, NUL-separated) and execs srun; whatever follows on stdin is the job's
own (``--stdin``). Short fixed Slurm commands (``scontrol show job -o 12``) are quoted word by word
for the login shell, as the transport does for a peer.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Sequence

from dispatch.core.errors import SyncFailedError
from dispatch.core.fdio import write_all
from dispatch.hosts.slurm.commands import Done, SlurmCommands
from dispatch.hosts.ssh.remotetree import LOGIN_RSYNC, Rsync, pump_stdin, remote_tree_spec, rsync_over
from dispatch.hosts.ssh.sync import protects_args, tree_sync_options

MYPY = False
if MYPY:
    from typing import IO

    from dispatch.core.settings import HostSettings, Settings
    from dispatch.hosts.slurm.keys import SlurmOptions

# Reads exactly its header from fd 0 (no buffered stdin: the rest stays for srun), then execs.
SHIM = ("import os\n"
        "def take(n):\n"
        "    b = b''\n"
        "    while len(b) < n:\n"
        "        c = os.read(0, n - len(b))\n"
        "        if not c: raise SystemExit(97)\n"
        "        b += c\n"
        "    return b\n"
        "parts = take(int(take(10))).split(b'\\0')\n"
        "n = int(parts[0])\n"
        "for pair in parts[1:1 + n]:\n"
        "    k, _, v = pair.partition(b'=')\n"
        "    os.environb[k] = v\n"
        "d = parts[1 + n]\n"
        "os.makedirs(d, exist_ok=True)\n"
        "os.chdir(d)\n"
        "argv = parts[2 + n:]\n"
        "os.execvp(argv[0], argv)\n")


# Makes the work directory (private) and claims it for the session unless claimed already: the
# owner file of ``dispatch.guards.workdirs`` (same fields, 0644, never over a link or another's;
# tests/system/test_workdir_clean_trust.py fails when the two differ).
MAKE_DIR = ("import json, os, pwd, socket, sys, time\n"
            "d = os.path.abspath(os.path.expanduser(sys.argv[1]))\n"
            "os.makedirs(d, mode=0o700, exist_ok=True)\n"
            "try:\n"
            "    fd = os.open(os.path.join(d, '.hostrun-owner'),"
            " os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)\n"
            "except OSError:\n"
            "    fd = -1\n"
            "if fd >= 0:\n"
            "    now, here = time.time(), os.stat(d)\n"
            "    owner = {'session': sys.argv[2], 'purpose': sys.argv[3], 'created': now,\n"
            "             'dir_dev': here.st_dev, 'dir_ino': here.st_ino,\n"
            "             'created_at': time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(now)),\n"
            "             'host': socket.gethostname(), 'user': pwd.getpwuid(os.getuid()).pw_name,\n"
            "             'pid': os.getppid()}\n"
            "    os.fchmod(fd, 0o644)\n"
            "    os.write(fd, (json.dumps(owner, indent=2, sort_keys=True) + '\\n').encode())\n"
            "    os.close(fd)\n"
            "print(d)\n")


def header(env: dict[str, str], directory: str, argv: Sequence[str]) -> bytes:
    """What ``SHIM`` reads: a 10-digit length, then the count of variables, the variables, the
    directory (relative to the login home, or absolute) and the argv, NUL-separated, as bytes."""
    fields = [str(len(env)).encode(), *(os.fsencode(f"{k}={v}") for k, v in env.items()),
              os.fsencode(directory), *(os.fsencode(a) for a in argv)]
    if any(b"\0" in f for f in fields):
        raise ValueError("a NUL byte cannot be passed in an argument")
    body = b"\0".join(fields)
    return b"%010d" % len(body) + body


class LoginCommands(SlurmCommands):
    """The cluster's commands, run on its login node over SSH."""

    remote = True

    def __init__(self, name: str, options: SlurmOptions, host: HostSettings, config: Settings) -> None:
        super().__init__(name, options)
        from dispatch.hosts.ssh.transport import SshTransport

        self.config = config
        self.ssh = SshTransport(host, config.state_dir, config.report_timeout, config.control_persist)

    def _with_conf(self, argv: Sequence[str]) -> list[str]:
        conf = self.options.slurm_conf
        return ["env", f"SLURM_CONF={conf}", *argv] if conf else list(argv)

    def run(self, argv: Sequence[str], timeout: float) -> Done:
        done = self.ssh.run(self._with_conf(argv), timeout=timeout)
        return Done(done.returncode, done.stdout.decode(errors="replace"),
                    done.stderr.decode(errors="replace"))

    def start(self, argv: Sequence[str], env: dict[str, str], directory: str | None,
              stdin: bool) -> subprocess.Popen[bytes]:
        """srun on the login node: stdout straight back, stderr piped, our stdin after the header."""
        self.ssh.ensure_control_dir()
        python = self.options.python or "python3"
        if self.options.slurm_conf:
            env = {**env, "SLURM_CONF": self.options.slurm_conf}
        proc = subprocess.Popen(self.ssh.argv([python, "-c", SHIM]), stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        assert proc.stdin is not None
        write_all(proc.stdin.fileno(), header(env, directory or ".", argv))
        if stdin:
            pipe = proc.stdin
            threading.Thread(target=pump_stdin, args=(lambda data: write_all(pipe.fileno(), data),
                                                      lambda: _close(pipe)), daemon=True).start()
        else:
            proc.stdin.close()
        return proc

    # -- the tree --
    def _rsync(self) -> Rsync:
        return Rsync(self.name, lambda options, args: rsync_over(self.ssh, options, args),
                     protects_args(self.config.state_dir),
                     guard=(f"{self.options.ssh}:", "the login node's shell"))

    def sync(self, tree: str, excludes: Sequence[str], claim: dict[str, str]) -> str:
        """The tree to its work directory on the login node (``work_root``/``tree_id``, made private
        there, ``~`` as that side's $HOME says, as a peer's agent reads it, and claimed as ``claim``
        says (``remotetree.work_claim``) unless claimed already), as ``--peer`` syncs it; returns the
        directory's absolute path there."""
        wanted = remote_tree_spec(self.options.work_root, tree)
        done = self.ssh.run([self.options.python or "python3", "-c", MAKE_DIR, wanted, claim["session"],
                             claim["purpose"]], timeout=self.config.report_timeout)
        remote = done.stdout.decode(errors="replace").strip()
        if done.returncode != 0 or not remote.startswith("/"):
            why = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"]
            raise SyncFailedError(f"cannot make {wanted} on {self.name}'s login node: {why[-1]}")
        self._rsync().run(["--delete", *tree_sync_options(excludes), f"{tree}/",
                           f"{self.options.ssh}:{remote}/"], "sync", LOGIN_RSYNC)
        return remote

    def bring_back(self, returns: Sequence[str], remote_dir: str, local_dir: str,
                   say: Callable[[str], None]) -> bool:
        """``--return`` paths from the job's directory there to here; whether any failed."""
        return self._rsync().bring_back(returns, f"{self.options.ssh}:{remote_dir}", local_dir,
                                        LOGIN_RSYNC, say)


def _close(pipe: IO[bytes]) -> None:
    try:
        pipe.close()
    except OSError:
        pass
