"""The controller's side of the peer's report daemon (``dispatch.agent.serve``, docs/peers.md).

Warm, a report is one connection to a local Unix socket that the ControlMaster forwards to the
daemon's socket on the peer (``ssh -O forward -L``): no ssh process, no Python start on the peer.
The local socket lives in hostrun's private control directory, named per peer and agent version.

Anything else (no socket yet, a stale one left by a master that is gone, a daemon that died or
answers for another version, a socket that is not a private one of ours) is replaced once: the
daemon is started through the master (``agent serve``, a no-op if it runs), the forward is made
again, and the request retried. If that fails too (e.g. the peer's sshd refuses stream-local
forwarding), this call falls back to the per-call agent over ssh, and the daemon path is skipped
for ``RETRY_AFTER`` seconds (a marker file next to the socket) so calls do not pay for retrying.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time

from dispatch.agent.socketframes import frame, read_frame
from dispatch.core.errors import HostrunError
from dispatch.core.fingerprint import short_hash
from dispatch.hosts.ssh import bundle as agent

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import Any

    from dispatch.hosts.ssh.transport import RemoteResult, SshTransport

RETRY_AFTER = 300.0
MAX_ANSWER = 64 << 20


class Gone(Exception):
    """The daemon path did not answer; the message says why (for tests and debugging)."""


def local_socket(ssh: SshTransport) -> str:
    """``<control dir>/a-<hash>.sock``: per destination, ssh options and agent version."""
    key = "\0".join([ssh.destination, str(ssh.options.port), ssh.options.ssh_config or "",
                     ssh.options.identity_file or "", agent.name()])
    return os.path.join(ssh.ctl_dir, f"a-{short_hash(key.encode(), 16)}.sock")


def ask(path: str, request: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One request over the local socket; ``Gone`` for anything that is not a daemon's answer.
    ``socket.timeout`` (an OSError) passes through: the peer may be frozen."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Gone("no socket") from None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise Gone(f"{path} is not a private socket of ours")  # never connected to
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            conn.connect(path)
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            raise Gone(f"connect: {exc.strerror}") from None
        try:
            conn.sendall(frame(request))
            raw = read_frame(conn, MAX_ANSWER)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Gone(f"connection: {exc.strerror}") from None
        except (EOFError, ValueError) as exc:
            raise Gone(str(exc)) from None
    try:
        reply: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise Gone("an answer that is not JSON") from None
    if reply.get("agent") != request["agent"]:
        raise Gone(f"an answer from agent {reply.get('agent')}, not {request['agent']}")
    return reply


class DaemonPath:
    """Reports through the daemon for one peer; ``report`` returns None where the per-call agent
    must answer this call instead."""

    def __init__(self, ssh: SshTransport, idle: float,
                 run_agent: Callable[[list[str], float], RemoteResult]) -> None:
        """``run_agent``: runs the agent over ssh, sending it first if missing (``PeerClient``)."""
        self.ssh, self.idle, self.run_agent = ssh, idle, run_agent
        self.path = local_socket(ssh)
        self.marker = self.path + ".off"

    def skipped(self) -> bool:
        try:
            return time.time() - os.stat(self.marker).st_mtime < RETRY_AFTER
        except FileNotFoundError:
            return False

    def skip_for_a_while(self) -> None:
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.utime(self.marker)

    def report(self, request: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        # The socket's directory must be ours alone before anything in it is trusted (else another
        # user could swap the socket between its check and the connect), as before any ssh.
        self.ssh.ensure_control_dir()
        if self.skipped():
            return None
        request = {"agent": agent.name(), "idle": self.idle, **request}
        try:
            reply = ask(self.path, request, deadline)
        except Gone:
            try:
                reply = self.replace(request, deadline)
            except HostrunError:  # ssh itself failed: the per-call agent says how, in what is left
                return None
            except (Gone, OSError):
                self.skip_for_a_while()
                return None
        except OSError:  # timed out: maybe a frozen peer, maybe a stuck daemon; try per call
            self.skip_for_a_while()
            return None
        if "report" not in reply:  # the daemon's report failed: the per-call agent says why
            return None
        data: dict[str, Any] = reply["report"]
        return data

    def replace(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Start the daemon (a no-op if it runs), forward our socket to it again, and ask. One
        controller at a time (a lock next to the socket), and each asks again first: the one before
        may have replaced it already (else two would undo each other's forwards)."""
        from dispatch.core.flocking import flock_by

        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if not flock_by(fd, deadline):
                raise Gone("another hostrun is replacing it")
            try:
                return ask(self.path, request, deadline)
            except Gone:
                pass
            self._start_and_forward(deadline)
            return ask(self.path, request, deadline)
        finally:
            os.close(fd)

    def _start_and_forward(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Gone("no time left")
        result = self.run_agent(["serve", "--idle", repr(float(self.idle))], left)
        if result.returncode != 0:
            raise Gone(f"serve: exit {result.returncode}: {result.stderr.decode(errors='replace')}")
        try:
            remote = json.loads(result.stdout)["socket"]
        except (ValueError, KeyError, TypeError):
            raise Gone("serve said no socket") from None
        spec = f"{self.path}:{remote}"
        if os.path.lexists(self.path):
            self._control("cancel", spec, deadline)  # a forward of this name the master may hold
            os.unlink(self.path)  # our private directory: a stale file here is ours to remove
        self._control("forward", spec, deadline, check=True)
        st = os.lstat(self.path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() \
                or stat.S_IMODE(st.st_mode) & 0o077:
            raise Gone(f"ssh made {self.path} with mode {stat.S_IMODE(st.st_mode):04o}")

    def _control(self, command: str, spec: str, deadline: float, check: bool = False) -> None:
        import subprocess

        ssh = self.ssh
        argv = [*ssh.base_argv(master="no"), "-O", command, "-L", spec, ssh.destination]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=max(0.001, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Gone(f"ssh -O {command}: no answer") from None
        if check and done.returncode != 0:
            raise Gone(f"ssh -O {command}: {done.stderr.decode(errors='replace').strip()}")

