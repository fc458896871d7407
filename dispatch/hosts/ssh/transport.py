"""The SSH transport: the OpenSSH client, driven as a subprocess, sharing one ControlMaster per peer.

Why the OpenSSH client (measured on these machines): a command through a warm ControlMaster costs
~16 ms against 164-316 ms for a cold ``ssh``, while a Python SSH library costs ~500 ms just to import
and cannot share a connection with rsync (asyncssh ignores every ``Control*`` option). Driving ``ssh``
also keeps the user's whole ``~/.ssh/config`` in force: ProxyJump, keys, certificates, known hosts.

Host keys are always checked: hostrun never turns ``StrictHostKeyChecking`` off, and ``BatchMode``
makes an unknown or changed key fail at once (no prompt) with an error naming the host. Transient
connection failures are retried (at most 5 times, exponential backoff with full jitter, within the
caller's deadline); authentication and host-key failures are not.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence

from dispatch.core.errors import HostKeyError, PeerAuthError, PeerUnreachableError
from dispatch.core.fingerprint import short_hash
from dispatch.core.records import NamedTuple
from dispatch.core.settings import HostSettings
from dispatch.hosts.ssh.keys import options_of

MYPY = False
if MYPY:
    from typing import TypeVar

    T = TypeVar("T")

SSH_FAILED = 255
RETRIES = 5
BACKOFF_BASE = 0.2
BACKOFF_CAP = 2.0
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; %C expands to 40 hex digits

_HOST_KEY_SIGNS = (
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "host key for",
    "No matching host key",
)
_AUTH_SIGNS = ("Permission denied", "Too many authentication failures", "no matching key exchange")
_TRANSIENT_SIGNS = (
    "Connection refused", "Connection timed out", "timed out", "No route to host",
    "Network is unreachable", "Connection reset", "Connection closed", "closed by remote host",
    "kex_exchange_identification", "banner exchange", "Broken pipe", "Connection to",
    "mux_client", "Control socket connect",
)


class RemoteResult(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes
    elapsed: float


def classify(host: str, stderr: str) -> PeerUnreachableError:
    """Turn ssh's own failure (exit 255) into one of our errors, naming the host."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "ssh failed without a message"
    lowered = text.lower()
    if any(sign.lower() in lowered for sign in _HOST_KEY_SIGNS):
        return HostKeyError(f"peer {host}: host key not known or changed ({last}); "
                            "check it and add it to known_hosts yourself: hostrun never skips the check")
    if any(sign.lower() in lowered for sign in _AUTH_SIGNS):
        return PeerAuthError(f"peer {host}: authentication failed ({last})")
    return PeerUnreachableError(f"peer {host}: {last}",
                                transient=any(sign.lower() in lowered for sign in _TRANSIENT_SIGNS))


def is_transient(error: Exception) -> bool:
    """Worth another try: a refused, reset or timed-out connection. Not a host-key or authentication
    failure, nor an unknown host name (configuration, not weather)."""
    return isinstance(error, PeerUnreachableError) and error.transient


def backoff(attempt: int, deadline: float | None = None) -> float:
    """The pause before retry ``attempt`` (1, 2, ...): full jitter, capped, never past ``deadline``."""
    import random  # only on a retry: ``random`` costs ~2 ms to import, on every report otherwise

    pause = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** attempt))
    if deadline is not None:
        pause = min(pause, max(0.0, deadline - time.monotonic()))
    return pause


def retry_transient(attempt: Callable[[], T], deadline: float | None, retries: int = RETRIES) -> T:
    """``attempt()``, tried again while it fails transiently (``is_transient``): at most ``retries``
    more times, full jitter between tries, none started past ``deadline`` (None: no deadline); the
    last failure is raised. The one retry rule of an ssh command and of a peer's run session."""
    tries = 0
    while True:
        try:
            return attempt()
        except PeerUnreachableError as exc:
            if not is_transient(exc) or tries >= retries or (
                    deadline is not None and time.monotonic() >= deadline):
                raise
            tries += 1
            time.sleep(backoff(tries, deadline))


def control_dir(state_dir: str) -> str:
    """Where the ControlMaster sockets live: in the state dir, or a short path under /tmp if that is
    too long for a unix socket (``ensure_control_dir`` makes it private or refuses it)."""
    preferred = os.path.join(state_dir, "ssh")
    if len(preferred) + 41 <= SOCKET_PATH_MAX:
        return preferred
    return os.path.join("/tmp", f"hostrun-ssh-{os.getuid()}-{short_hash(state_dir.encode(), 8)}")


def ensure_control_dir(directory: str) -> None:
    from dispatch.guards.trust import private_dir

    private_dir(directory, fix="set a shorter state_dir (its ssh/ subdirectory is used then)")


def control_path_option(directory: str) -> str:
    """``ControlPath=...`` for ``ssh -o``, naming ``directory/%C`` whatever the directory's name holds:
    ssh splits an option's value into words like a config line (a space ends it unless quoted; inside
    double quotes a backslash escapes ``"`` and ``\\``) and expands ``%`` tokens (``%%`` is a %)."""
    escaped = directory.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'ControlPath="{escaped}/%C"'


def remote_command(argv: Sequence[str]) -> str:
    """One shell-safe string: sshd hands the command to the login shell, so every word is quoted."""
    return " ".join(shlex.quote(a) for a in argv)


class SshTransport:
    """One peer as the ``ssh`` command sees it, with hostrun's ControlMaster options."""

    def __init__(self, host: HostSettings, state_dir: str, connect_timeout: float,
                 control_persist: float = 600.0, ssh_program: str = "ssh") -> None:
        options = options_of(host)
        if not options.ssh:
            raise ValueError(f"host {host.name} has no ssh destination")
        self.name = host.name
        self.host = host
        self.options = options
        self.destination = options.ssh
        self.ctl_dir = control_dir(state_dir)
        self.connect_timeout = connect_timeout
        self.control_persist = control_persist
        self.ssh_program = ssh_program

    def base_argv(self, master: str = "auto") -> list[str]:
        argv = [
            self.ssh_program,
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}",
            "-o", f"ControlMaster={master}",
            "-o", control_path_option(self.ctl_dir),
            "-o", f"ControlPersist={int(self.control_persist)}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
        ]
        if self.options.ssh_config:
            argv += ["-F", self.options.ssh_config]
        if self.options.port:
            argv += ["-p", str(self.options.port)]
        if self.options.identity_file:
            argv += ["-i", self.options.identity_file]
        return argv

    def argv(self, remote: Sequence[str], tty: bool = False) -> list[str]:
        return [*self.base_argv(), "-T" if not tty else "-t", self.destination, "--",
                remote_command(remote)]

    def rsync_rsh(self) -> str:
        """The ``-e`` value for rsync, so it rides on the same ControlMaster."""
        return remote_command(self.base_argv())

    def ensure_control_dir(self) -> None:
        """Before any ssh: whoever controls this directory controls where our connections go (a
        master socket of theirs at the socket's name), so it must be ours alone (``dispatch.guards.trust``):
        the /tmp fallback pre-created by another user, or a symlink, is refused (exit 2)."""
        ensure_control_dir(self.ctl_dir)

    def run(self, remote: Sequence[str], *, input: bytes | None = None,
            timeout: float | None = None, retries: int = RETRIES) -> RemoteResult:
        """Run ``remote`` (an argv) on the peer; ssh's own failures raise, the command's do not.

        ``timeout`` bounds everything, retries included; on expiry the ssh process is killed and
        PeerUnreachableError names the host. Plain ``subprocess`` (no asyncio: its import alone
        costs ~30 ms on every call); callers that read several peers use threads.
        """
        self.ensure_control_dir()
        deadline = None if timeout is None else time.monotonic() + timeout

        def attempt() -> RemoteResult:
            left = None if deadline is None else deadline - time.monotonic()
            result = None if left is not None and left <= 0 else self._once(remote, input, left)
            if result is None:
                raise PeerUnreachableError(f"peer {self.name}: no answer within {timeout:g} s")
            if result.returncode == SSH_FAILED:
                raise classify(self.name, result.stderr.decode(errors="replace"))
            return result

        return retry_transient(attempt, deadline, retries)

    def _once(self, remote: Sequence[str], input: bytes | None, timeout: float | None
              ) -> RemoteResult | None:
        """One ssh run; None when it did not finish within ``timeout`` (it is killed then)."""
        import subprocess

        started = time.monotonic()
        proc = subprocess.Popen(
            self.argv(remote), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C meant for hostrun must not kill ssh mid-answer
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            # Do not wait for the pipes to close: through a ControlMaster the client hands its stdio
            # to the master, which keeps them open as long as the (frozen) session lives.
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
            return None
        return RemoteResult(proc.returncode, out, err, time.monotonic() - started)
