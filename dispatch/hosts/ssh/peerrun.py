"""``hostrun --peer -- CMD``: the peer driver's seven steps (docs/design.md, "A peer run").

1. ``enable_across_machines`` must be on (248), 2. the cap within the peer's ``peer_memory_cap``
(249) — both in ``dispatch.hosts.ssh.peers``; 3. the toolchain probes agree on both hosts (247); 4.
the tree is rsynced to a stable per-tree directory under the peer's work root, over the same
ControlMaster (252), unless neither the tree nor the peer's copy changed since the last sync
(``dispatch.hosts.ssh.syncstate``);
5-7. the agent books the job on the peer's own ledger, runs it under the peer's cap and reports the
outcome; output is streamed live (stdout and stderr kept apart), signals are forwarded in-band (sshd
refuses signal requests for root logins), heartbeats both ways detect a dead link (251), and
``--return`` paths are copied back afterwards, even after a failed job.

A session that fails before the job was started (ssh cannot connect, authenticate or verify the host
key; the link drops during the sync) is 246 with ssh's own reason, after the transport's retries for
a transient failure; 251 is only for a link lost once the agent was told to go.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from dispatch.agent.frames import SILENCE_LIMIT, SYNC_MARK
from dispatch.agent.treestate import walk
from dispatch.agent.wire import RunSpec
from dispatch.core.errors import (
    ConnectionLostError,
    HostrunError,
    PeerUnreachableError,
    SyncFailedError,
    ToolchainMismatchError,
    UsageError,
)
from dispatch.core.outcome import Outcome
from dispatch.core.settings import HostSettings, Settings
from dispatch.guards.toolchain import compare, probe_here
from dispatch.hosts.ssh import bundle as agent
from dispatch.hosts.ssh.keys import options_of
from dispatch.hosts.ssh.peer import _RUN, PeerClient
from dispatch.hosts.ssh.peersession import AgentMissing, AgentSession
from dispatch.hosts.ssh.remotetree import (
    PEER_RETURN,
    PEER_SYNC,
    Rsync,
    job_place,
    remote_tree_spec,
    returns_failed,
    rsync_over,
    tree_id,
    work_claim,
)
from dispatch.hosts.ssh.sync import protects_args, shell_unsafe, tree_sync_options
from dispatch.hosts.ssh.transport import retry_transient
from dispatch.local import alertlog
from dispatch.local.admission.booking import default_label

MYPY = False
if MYPY:
    from typing import Protocol

    from dispatch.agent.prepareshape import CopyState, PrepareReply, PrepareSpec, WorkClaim
    from dispatch.agent.treestate import Walk
    from dispatch.core.alertshape import Alert
    from dispatch.core.request import RunRequest
    from dispatch.hosts.ssh.syncstate import Loaded

    class PeerLink(Protocol):
        """What ``PeerRun`` does to its peer (``SshLink`` for real; tests/support/fakepeer.py for a fake)."""

        def open_agent(self) -> subprocess.Popen[bytes]: ...
        def send_agent(self) -> None: ...
        def rsync_argv(self, options: list[str], args: list[str]) -> list[str]: ...

# The peer refused or never started the job: nothing of this run to bring back.
_NOT_RUN_OUTCOMES = ("never-fits", "not-run", "usage", "error")


class SshLink:
    """How a run reaches its peer: the agent's session over ssh, rsync over the same ControlMaster.
    The one seam between ``PeerRun`` and the network, so that a test can play the peer locally
    (tests/support/fakepeer.py) and drive every phase without sshd."""

    def __init__(self, client: PeerClient) -> None:
        self.client = client

    def open_agent(self) -> subprocess.Popen[bytes]:
        """The session: only the agent's fixed argv on ssh's command line; the spec goes on stdin."""
        self.client.ssh.ensure_control_dir()
        command = ["sh", "-c", _RUN, "hostrun-agent", agent.remote_path(), self.client.python, "run"]
        return subprocess.Popen(self.client.ssh.argv(command), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def send_agent(self) -> None:
        """The session exited 97 (this agent is not there): send it."""
        self.client.send_agent()

    def rsync_argv(self, options: list[str], args: list[str]) -> list[str]:
        """rsync with ``options`` and ``args`` (remote paths as ``<host.ssh>:PATH``), over ssh."""
        return rsync_over(self.client.ssh, options, args)


class PeerRun:
    # No frame for this long is a dead link (an attribute so that a test can shorten it).
    silence_limit = SILENCE_LIMIT

    def __init__(self, settings: Settings, host: HostSettings, request: RunRequest,
                 say: Callable[[str], None], *, tree: str | None = None,
                 returns: Sequence[str] = (), forward_stdin: bool = False,
                 link: PeerLink | None = None) -> None:
        self.settings = settings
        self.host = host
        self.request = request
        self.say = say
        self.client = PeerClient(settings, host)
        self.link = link or SshLink(self.client)
        self.tree, self.rel_cwd = job_place(tree)
        self.returns = list(returns)
        self.forward_stdin = forward_stdin
        self.options = options_of(host)
        self.remote_tree_spec = remote_tree_spec(self.options.work_root, self.tree)
        self.remote_tree = ""
        self.sync_mark = os.urandom(8).hex()
        self._walker: threading.Thread | None = None
        self._walked: list[tuple[Walk | None, str | None, Loaded | None]] = []
        self._saver: threading.Thread | None = None
        self._copy: CopyState | None = None
        self._probes: list[str] | None = None
        self.go_payload = b""  # with G: the new sync's token (and paths) for the agent's manifest
        self.sync_how = ""  # "skip", "paths" or "full", once synced
        # Without -s the peer's shell would read the remote paths: refuse what it would interpret.
        self.protect_args = protects_args(settings.state_dir)
        self.rsync = Rsync(host.name, self.link.rsync_argv, self.protect_args)
        if not self.protect_args:
            for path in self.returns:
                self._check_unprotected(path, f"--return {path!r}")
            self._check_unprotected(self.rel_cwd, f"the job's directory {self.rel_cwd!r} in the tree")

    def _check_unprotected(self, path: str, what: str) -> None:
        if shell_unsafe(path):
            raise UsageError(f"{what}: the local rsync cannot protect it from the peer's shell (no -s, "
                             "rsync older than 3.0): use a path of letters, digits and _-.,/:@+% only, "
                             "or a newer rsync; nothing ran")

    # -- step 3: toolchain, and the work directory made ready in the same round trip --
    @property
    def probes(self) -> list[str]:
        """The probes this job needs: those of the programs it runs, and ``toolchain_probes``."""
        if self._probes is None:
            from dispatch.guards.toolchain import probes_for

            self._probes = probes_for(self.request.argv, os.path.join(self.tree, self.rel_cwd),
                                      self.settings.toolchain_probes, self.settings.toolchain_programs)
        return self._probes

    def prepare_spec(self) -> PrepareSpec:
        """What the agent checks first, in the run session itself: probes and the work directory."""
        from dispatch.guards.toolchain import selector_files

        made = work_claim(self.tree, self.request.session)
        claim: WorkClaim = {"session": made["session"], "purpose": made["purpose"]}
        return {"probes": self.probes, "workdir": self.remote_tree_spec,
                "owner": claim, "job_dir": self.rel_cwd,
                "toolchain_files": selector_files(self.tree, self.rel_cwd),
                # The agent checks its copy against the manifest of the last sync (hosts/syncstate).
                "copy": {"excludes": list(self.settings.sync_excludes)}}

    def check_prepared(self, answer: object) -> None:
        """Step 3 (toolchain, 247) and the start of step 4 (work directory, 252)."""
        remote = checked_prepared(answer, self.host.name)
        here = probe_here(self.probes, self.settings.state_dir, os.path.join(self.tree, self.rel_cwd))
        differences = compare(here, remote["probes"], self.host.name)
        if differences:
            for line in differences:
                self.say(f"toolchain: {line}")
            raise ToolchainMismatchError(
                f"the toolchain on {self.host.name} differs from this host's ({len(differences)} "
                "line(s) above); nothing was synced or run")
        if "workdir" not in remote:
            raise SyncFailedError(f"cannot prepare the work directory on {self.host.name}: "
                                  f"{remote.get('workdir_error', 'no answer')}")
        if not self.protect_args:
            self._check_unprotected(remote["workdir"], f"the work directory {remote['workdir']!r} on "
                                                       f"{self.host.name}")
        self.remote_tree = remote["workdir"]
        self._copy = remote.get("copy")

    # -- step 4: sync --
    def stop_sync(self) -> None:
        self.rsync.stop()

    def _sync_options(self) -> list[str]:
        return tree_sync_options(self.settings.sync_excludes)

    def _start_walk(self) -> None:
        """This tree's walk and the record of the last sync, read in a thread while the agent
        starts and checks its copy."""
        if self._walker is None:
            self._walker = threading.Thread(target=self._walk_and_load, daemon=True)
            self._walker.start()

    def _walk_and_load(self) -> None:
        from dispatch.hosts.ssh import syncstate

        try:
            record = syncstate.record_path(self.settings.state_dir, self.host.name, tree_id(self.tree))
            loaded = syncstate.load(record)
            walked = walk(self.tree, list(self.settings.sync_excludes),
                          loaded[1] if loaded is not None else None)
            self._walked.append((walked, record, loaded))
        except Exception:  # any doubt: no walk, the full rsync
            self._walked.append((None, None, None))

    def sync(self) -> None:
        """Step 4: no rsync when neither this tree nor the peer's copy changed since the last sync;
        only the changed files when just they changed here; else the full rsync."""
        from dispatch.hosts.ssh import syncstate

        self._start_walk()
        assert self._walker is not None
        self._walker.join()
        walked, record, loaded = self._walked[0] if self._walked else (None, None, None)
        options = self._sync_options()
        key = json.dumps([self.host.name, self.options.ssh, self.remote_tree, self.protect_args,
                          options])
        try:
            how, paths = syncstate.plan(loaded, key, walked, self._copy)
        except Exception:  # a record that parses but makes no sense: any doubt is the full rsync
            how, paths = "full", []
        self.sync_how = how
        if how == "skip":
            if record is not None and walked is not None and walked.fresh and loaded is not None:
                # The same record with the listings this walk had to read: the next walk reuses them.
                self._save(record, key, str(loaded[0]["token"]), walked)
            return
        token = os.urandom(8).hex()
        if record is not None:
            syncstate.forget(record)  # a sync that fails leaves no record: the next one is full
        # The mark in the remote rsync's environment lets the agent stop it if the session drops.
        mark = f"--rsync-path=env {SYNC_MARK}={self.sync_mark} rsync"
        progress = os.isatty(2)
        if how == "paths":
            self.rsync.run([mark, "--files-from=-", "--from0", *options,
                            f"{self.tree}/", f"{self.options.ssh}:{self.remote_tree}/"], "sync", PEER_SYNC,
                           stdin="\0".join(paths).encode("utf-8", "surrogateescape"), progress=progress)
        else:
            self.rsync.run([mark, "--delete", *options,
                            f"{self.tree}/", f"{self.options.ssh}:{self.remote_tree}/"], "sync", PEER_SYNC,
                           progress=progress)
        if record is None or walked is None:
            return
        self.go_payload = json.dumps({"token": token, "paths": paths if how == "paths" else None}
                                     ).encode()
        self._save(record, key, token, walked)

    def _save(self, record: str, key: str, token: str, walked: Walk) -> None:
        """The record is written while the job starts (it is only for the next run); run() waits."""
        self._saver = threading.Thread(target=_save_record, args=(record, key, token, walked),
                                       daemon=True)
        self._saver.start()

    def bring_back(self) -> bool:
        """``--return`` paths back (relative to the job's directory), each failure said; whether
        any failed."""
        remote_dir = os.path.join(self.remote_tree, self.rel_cwd)
        return bool(self.returns) and self.rsync.bring_back(
            self.returns, f"{self.options.ssh}:{remote_dir}", os.path.join(self.tree, self.rel_cwd),
            PEER_RETURN, self.say)

    # -- steps 5-7: the run --
    def spec(self) -> bytes:
        """The agent's spec (``RunSpec``), sent as the session's first frame."""
        prepare = self.prepare_spec()
        prepare["sync_mark"] = self.sync_mark
        spec = RunSpec(request=self.request, cwd=os.path.join(self.remote_tree_spec, self.rel_cwd),
                       cap_if_none=self.options.peer_memory_cap, stdin=self.forward_stdin,
                       fallback=json.loads(self.client.fallback()), prepare=prepare,
                       alert_wait_after=self.settings.alert_wait_after,
                       status_interval=self.settings.status_interval)
        return json.dumps(spec.to_dict()).encode()

    def run(self) -> Outcome:
        try:
            try:
                try:
                    outcome = self._session()
                finally:
                    if self._saver is not None:
                        self._saver.join()
            except ConnectionLostError:
                self.bring_back()  # best effort: the peer may still be reachable
                raise
        except HostrunError as exc:
            exc.host = self.host.name  # for the result file
            if isinstance(exc, PeerUnreachableError):
                self._alert(alertlog.for_unreachable(
                    self.host.name, self.request.label or default_label(self.request.argv),
                    self.request.session, self.request.argv, str(exc), self.request))
            raise
        # The peer's agent does not alert (its alert file is nobody's): its verdicts are ours to say.
        self._alert(alertlog.for_outcome(outcome, self.request.session, peer=self.host.name,
                                         request=self.request))
        ran = outcome.outcome not in _NOT_RUN_OUTCOMES and outcome.booking_kind is not None
        if ran and self.bring_back():  # even after a failed job
            returns_failed(outcome)
        if ran:  # the peer's agent wrote its own row in the peer's ledger; this is ours
            from dispatch.local.history import record_peer_run

            record_peer_run(self.settings, outcome, self.request, self.say)
        return outcome

    def _alert(self, record: Alert | None) -> None:
        alertlog.write(self.settings.alerts_path, record, self.say)

    def _session(self) -> Outcome:
        """One SSH session for steps 3-7 (``peersession.AgentSession``). The agent first probes and
        prepares the work directory (frame ``P``); we compare, rsync while heartbeating, then say go
        (``G``) or abort (``X``). Folding the probe into the run session saves an ssh round trip and
        an agent start.

        A peer without this agent gets it once, and the session is opened again. A session that could
        not connect (nothing came from the agent) is tried again when the failure is transient, by
        the rule of every ssh command (``transport.retry_transient``), within twice
        ``report_timeout``."""
        deadline = time.monotonic() + self.settings.report_timeout * 2
        sent = False

        def session() -> Outcome:
            nonlocal sent
            while True:
                try:
                    return self._session_once()
                except AgentMissing:
                    if sent:
                        raise PeerUnreachableError(f"peer {self.host.name}: the agent sent there does "
                                                   "not start (exit 97 after installing it)") from None
                    self.link.send_agent()
                    sent = True

        return retry_transient(session, deadline)

    def _session_once(self) -> Outcome:
        proc = self.link.open_agent()
        self._start_walk()
        return AgentSession(self, proc).run()


def _save_record(record: str, key: str, token: str, walked: Walk) -> None:
    from dispatch.hosts.ssh import syncstate

    try:
        syncstate.save(record, key, token, walked)
    except OSError:
        pass  # no record: the next run syncs in full


def checked_prepared(answer: object, host: str) -> PrepareReply:
    """The agent's ``P`` frame, from the peer: an object whose ``probes`` is an object, ``workdir``
    (or ``workdir_error``) a text, ``copy`` absent or ``{"token", "clean"}``; else SyncFailedError
    naming what is wrong, one line."""
    def bad(what: str) -> SyncFailedError:
        return SyncFailedError(f"{host}'s agent answered the prepare step with {what}; nothing was "
                               "synced or run")

    if not isinstance(answer, dict):
        raise bad("something that is not an object")
    if not isinstance(answer.get("probes"), dict):
        raise bad("no probes object")
    for key in ("workdir", "workdir_error"):
        if key in answer and not isinstance(answer[key], str):
            raise bad(f"a {key} that is not a text")
    copy = answer.get("copy")
    if copy is not None and not (isinstance(copy, dict) and isinstance(copy.get("clean"), bool)
                                 and isinstance(copy.get("token"), (str, type(None)))):
        raise bad("a copy that is not {token, clean}")
    checked: PrepareReply = answer  # type: ignore[assignment]  # the fields it reads, checked above
    return checked
