"""Talking to a peer's agent over SSH: send the agent when missing, run a command, parse its JSON."""

from __future__ import annotations

import json
import time

from dispatch.core.errors import PeerUnreachableError
from dispatch.core.exitcodes import NOT_FOUND
from dispatch.core.hostkeys import FALLBACK_FIELDS
from dispatch.core.settings import HostSettings, Settings
from dispatch.hosts.ssh import bundle as agent
from dispatch.hosts.ssh.keys import options_of
from dispatch.hosts.ssh.transport import RemoteResult, SshTransport

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.core.reportshape import MachineReport

AGENT_MISSING = 97
# Run the agent if this exact version is there; say so (exit 97) if not. "$@" keeps argv intact.
# Paths are relative to $HOME (sshd starts in the passwd home, which $HOME may override).
_RUN = ('cd "$HOME" || exit 1; [ -f "$1/__main__.py" ] || exit 97; f=$1; py=$2; shift 2; '
        'exec "$py" -I "$f" "$@"')
# Unpack the zip from stdin into a private temporary directory, byte-compile it with the peer's own
# python, then move it into place (if another sender won the race, keep theirs). ~/.cache/hostrun is
# created 0700 and checked with lstat first: a directory another user owns or can write (or a
# symlink) is refused, never unpacked into, as on the controller (dispatch.guards.trust).
_SEND = 'cd "$HOME" || exit 1; umask 077; py=$1; shift; exec "$py" -I -c "$@"'
_UNPACK = """
import compileall, io, os, shutil, stat, sys, tempfile, zipfile
d = sys.argv[1]
parent = os.path.dirname(d)
here = ""
for part in parent.split("/"):
    here = os.path.join(here, part) if here else part
    try:
        os.mkdir(here, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(here)
    mode = stat.S_IMODE(st.st_mode)
    if here == parent:
        bad = st.st_uid != os.geteuid() or mode & 0o022
    else:
        bad = st.st_uid not in (os.geteuid(), 0) or (mode & 0o022 and not mode & stat.S_ISVTX)
    link = " (a symlink)" if stat.S_ISLNK(st.st_mode) else ""
    if bad or link or not stat.S_ISDIR(st.st_mode):
        sys.exit("refusing %s: owned by uid %d, mode %04o%s, not a private directory of ours; remove it"
                 % (os.path.abspath(here), st.st_uid, mode, link))
if mode != 0o700:
    os.chmod(parent, 0o700)
t = tempfile.mkdtemp(prefix=os.path.basename(d) + ".tmp.", dir=parent)
try:
    zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read())).extractall(t)
    if not compileall.compile_dir(t, quiet=1):
        sys.exit("could not byte-compile the agent")
    try:
        os.rename(t, d)
    except OSError:
        pass
finally:
    shutil.rmtree(t, ignore_errors=True)
"""


class PeerClient:
    def __init__(self, settings: Settings, host: HostSettings) -> None:
        self.settings = settings
        self.host = host
        self.ssh = SshTransport(host, settings.state_dir, settings.report_timeout, settings.control_persist)

    @property
    def python(self) -> str:
        return options_of(self.host).python or "python3"

    def fallback_values(self) -> dict[str, Any]:
        """The controller's ``[hosts.NAME]`` values of the fallback keys (``hostkeys.COMMON``), for
        what the peer's own config leaves unset."""
        values = {key: getattr(self.host, key) for key in FALLBACK_FIELDS}
        return {k: v for k, v in values.items() if v is not None}

    def fallback(self) -> str:
        return json.dumps(self.fallback_values())

    def send_agent(self, timeout: float | None = None) -> None:
        """Send this version of the agent; the peer unpacks and byte-compiles it."""
        result = self.ssh.run(["sh", "-c", _SEND, "hostrun-send", self.python, _UNPACK, agent.remote_path()],
                              input=agent.build()[0], timeout=timeout or self.settings.report_timeout * 2)
        if result.returncode != 0:
            last = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise PeerUnreachableError(f"peer {self.host.name}: could not install the agent "
                                       f"(exit {result.returncode}): {last[0]}")

    def run_agent(self, args: list[str], timeout: float) -> RemoteResult:
        """Run the agent with ``args`` over ssh, sending it first if the peer lacks this version."""
        path = agent.remote_path()
        command = ["sh", "-c", _RUN, "hostrun-agent", path, self.python, *args]
        started = time.monotonic()
        result = self.ssh.run(command, timeout=timeout)
        if result.returncode == AGENT_MISSING:
            self.send_agent(timeout)
            result = self.ssh.run(command, timeout=max(0.001, timeout - (time.monotonic() - started)))
        if result.returncode == NOT_FOUND:  # the remote shell did not find the interpreter
            raise PeerUnreachableError(f"peer {self.host.name}: {self.python!r} not found there "
                                       f"(set hosts.{self.host.name}.python)")
        return result

    def agent_json(self, args: list[str], timeout: float) -> dict[str, Any]:
        result = self.run_agent(args, timeout)
        if result.returncode != 0:
            last = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise PeerUnreachableError(
                f"peer {self.host.name}: agent failed (exit {result.returncode}): {last[0]}")
        try:
            data: dict[str, Any] = json.loads(result.stdout)
        except ValueError:
            raise PeerUnreachableError(f"peer {self.host.name}: agent answered no JSON") from None
        return data

    def report(self, label: str | None = None, timeout: float | None = None,
               peaks: bool = False) -> MachineReport:
        """The peer's report: from its daemon when ``agent_idle`` > 0 (within half of ``timeout``,
        starting or replacing it as needed: ``dispatch.hosts.ssh.agentd``), else, or when that fails,
        from a per-call agent over ssh within what is left. The same JSON either way."""
        timeout = timeout or self.settings.report_timeout
        started = time.monotonic()
        try:
            data = self._report_data(label, timeout, started, peaks)
        except PeerUnreachableError:
            if time.monotonic() - started < timeout:
                raise  # a failure of its own (refused, no key, ...): its words
            # Out of time: the reason is the timeout the user set, not what was left of it for
            # the last step (a frozen peer read "no answer within 1.49718 s" for a 3 s timeout).
            raise PeerUnreachableError(f"peer {self.host.name}: no answer within {timeout:g} s"
                                       ) from None
        if data.get("agent_version") is None:
            raise PeerUnreachableError(f"peer {self.host.name}: unexpected answer from the agent")
        data["host"] = self.host.name
        report: MachineReport = data  # type: ignore[assignment]  # an agent's report, by its version key
        return report

    def _report_data(self, label: str | None, timeout: float, started: float,
                     peaks: bool) -> dict[str, Any]:
        data = None
        if self.settings.agent_idle > 0:
            from dispatch.hosts.ssh.agentd import DaemonPath

            request = {"command": "report", "fallback": self.fallback_values(), "label": label,
                       "peaks": peaks}
            data = DaemonPath(self.ssh, self.settings.agent_idle, self.run_agent).report(
                request, started + timeout / 2)
        if data is None:
            args = ["report", "--fallback", self.fallback()]
            if label:
                args += ["--label", label]
            if peaks:
                args.append("--peaks")
            data = self.agent_json(args, max(0.001, timeout - (time.monotonic() - started)))
        return data
