"""``hostrun --peer -- CMD``: the peer driver's seven steps (docs/design.md, "A peer run").

1. ``enable_across_machines`` must be on (248), 2. the cap within the peer's ``peer_memory_cap``
(249) — both in ``dispatch.hosts.peers``; 3. the toolchain probes agree on both hosts (247); 4. the tree is
rsynced to a stable per-tree directory under the peer's work root, over the same ControlMaster (252),
unless neither the tree nor the peer's copy changed since the last sync (``dispatch.hosts.syncstate``);
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
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from dispatch.agent.frames import HEARTBEAT, SILENCE_LIMIT, SYNC_MARK, Frame, FrameReader, encode
from dispatch.agent.treestate import walk
from dispatch.agent.wire import RunSpec, outcome_of
from dispatch.core.errors import (
    ConnectionLostError,
    HostrunError,
    PeerUnreachableError,
    SyncFailedError,
    ToolchainMismatchError,
    UsageError,
)
from dispatch.core.exitcodes import SIGNAL_BASE
from dispatch.core.fdio import forward
from dispatch.core.outcome import Outcome
from dispatch.core.settings import HostSettings, Settings
from dispatch.guards.toolchain import compare, probe_here
from dispatch.hosts import bundle as agent
from dispatch.hosts.peer import _RUN, AGENT_MISSING, PeerClient
from dispatch.hosts.remotetree import job_place, remote_tree_spec, returns_failed, rsync_failure, tree_id
from dispatch.hosts.sshkeys import options_of
from dispatch.hosts.sync import PROTECT_ARGS, die_with_parent, protects_args, shell_unsafe, tree_sync_options
from dispatch.hosts.transport import RETRIES, backoff, classify, is_transient
from dispatch.local import alertlog
from dispatch.local.booking import default_label
from dispatch.local.signals import FORWARDED

MYPY = False
if MYPY:
    from typing import Any, Protocol

    from dispatch.agent.treestate import Walked
    from dispatch.core.request import RunRequest
    from dispatch.hosts.syncstate import Loaded

    class PeerLink(Protocol):
        """What ``PeerRun`` does to its peer (``SshLink`` for real; tests/support/fakepeer.py for a fake)."""

        def open_agent(self) -> subprocess.Popen[bytes]: ...
        def send_agent(self) -> None: ...
        def rsync_argv(self, options: list[str], args: list[str]) -> list[str]: ...

RETURN_TIMEOUT = 300.0
# The peer refused or never started the job: nothing of this run to bring back.
_NOT_RUN_OUTCOMES = ("never-fits", "not-run", "usage", "error")


class _AgentMissing(Exception):
    """The peer lacks this version of the agent (the session exited 97 before saying anything)."""


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
        return ["rsync", *options, "-e", self.client.ssh.rsync_rsh(), *args]


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
        self._rsync_proc: subprocess.Popen[str] | None = None
        self.sync_mark = os.urandom(8).hex()
        self._walker: threading.Thread | None = None
        self._walked: list[tuple[Walked | None, str | None, Loaded | None]] = []
        self._saver: threading.Thread | None = None
        self._copy: dict[str, Any] | None = None
        self._probes: list[str] | None = None
        self.go_payload = b""  # with G: the new sync's token (and paths) for the agent's manifest
        self.sync_how = ""  # "skip", "paths" or "full", once synced
        # Without -s the peer's shell would read the remote paths: refuse what it would interpret.
        self.protect_args = protects_args(settings.state_dir)
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

    def prepare_spec(self) -> dict[str, Any]:
        """What the agent checks first, in the run session itself: probes and the work directory."""
        from dispatch.guards.workdirs import fallback_session

        owner = {"session": self.request.session or fallback_session(),
                 "purpose": f"hostrun --peer sync target of {socket.gethostname()}:{self.tree}"}
        from dispatch.guards.toolchain import selector_files

        return {"probes": self.probes, "workdir": self.remote_tree_spec,
                "owner": owner, "job_dir": self.rel_cwd,
                "toolchain_files": selector_files(self.tree, self.rel_cwd),
                # The agent checks its copy against the manifest of the last sync (hosts/syncstate).
                "copy": {"excludes": list(self.settings.sync_excludes)}}

    def check_prepared(self, remote: dict[str, Any]) -> None:
        """Step 3 (toolchain, 247) and the start of step 4 (work directory, 252)."""
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
    def _rsync(self, args: list[str], what: str, stdin: bytes | None = None) -> None:
        show_progress = os.isatty(2) and what == "sync"
        options = ["-a", *(["--info=progress2"] if show_progress else []),
                   *([PROTECT_ARGS] if self.protect_args else [])]
        argv = self.link.rsync_argv(options, args)
        try:
            # Its own session (a Ctrl-C for hostrun must not cut it mid-file), but killed with us.
            proc = subprocess.Popen(argv, stdout=None if show_progress else subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    stdin=None if stdin is None else subprocess.PIPE,
                                    preexec_fn=die_with_parent())
        except OSError as exc:
            raise SyncFailedError(f"{what}: cannot run rsync: {exc.strerror}") from None
        self._rsync_proc = proc
        try:
            _, stderr = proc.communicate(
                None if stdin is None else stdin.decode("utf-8", "surrogateescape"),
                timeout=None if what == "sync" else RETURN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise SyncFailedError(f"{what} with {self.host.name}: no progress within "
                                  f"{RETURN_TIMEOUT:g} s") from None
        finally:
            self._rsync_proc = None
        if proc.returncode != 0:
            raise rsync_failure(what, self.host.name, proc.returncode, stderr)

    def _stop_rsync(self) -> None:
        proc = self._rsync_proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def _sync_options(self) -> list[str]:
        return tree_sync_options(self.settings.sync_excludes)

    def _start_walk(self) -> None:
        """This tree's walk and the record of the last sync, read in a thread while the agent
        starts and checks its copy."""
        if self._walker is None:
            self._walker = threading.Thread(target=self._walk_and_load, daemon=True)
            self._walker.start()

    def _walk_and_load(self) -> None:
        from dispatch.hosts import syncstate

        try:
            walked = walk(self.tree, list(self.settings.sync_excludes))
            record = syncstate.record_path(self.settings.state_dir, self.host.name, tree_id(self.tree))
            self._walked.append((walked, record, syncstate.load(record, walked)))
        except Exception:  # any doubt: no walk, the full rsync
            self._walked.append((None, None, None))

    def sync(self) -> None:
        """Step 4: no rsync when neither this tree nor the peer's copy changed since the last sync;
        only the changed files when just they changed here; else the full rsync."""
        from dispatch.hosts import syncstate

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
            return
        token = os.urandom(8).hex()
        if record is not None:
            syncstate.forget(record)  # a sync that fails leaves no record: the next one is full
        # The mark in the remote rsync's environment lets the agent stop it if the session drops.
        mark = f"--rsync-path=env {SYNC_MARK}={self.sync_mark} rsync"
        if how == "paths":
            self._rsync([mark, "--files-from=-", "--from0", *options,
                         f"{self.tree}/", f"{self.options.ssh}:{self.remote_tree}/"], "sync",
                        stdin="\0".join(paths).encode("utf-8", "surrogateescape"))
        else:
            self._rsync([mark, "--delete", *options,
                         f"{self.tree}/", f"{self.options.ssh}:{self.remote_tree}/"], "sync")
        if record is None or walked is None:
            return
        self.go_payload = json.dumps({"token": token, "paths": paths if how == "paths" else None}
                                     ).encode()
        # The record is written while the job starts (it is only for the next run); run() waits.
        self._saver = threading.Thread(target=_save_record, args=(record, key, token, walked),
                                       daemon=True)
        self._saver.start()

    def bring_back(self) -> list[str]:
        """Copy ``--return`` paths back (relative to the job's directory); returns the failures."""
        failures = []
        local_dir = os.path.join(self.tree, self.rel_cwd)
        remote_dir = os.path.join(self.remote_tree, self.rel_cwd)
        for path in self.returns:
            try:
                self._rsync(["--relative", f"{self.options.ssh}:{remote_dir}/./{path}", f"{local_dir}/"],
                            f"--return {path}")
            except SyncFailedError as exc:
                failures.append(str(exc))
        return failures

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
                self._bring_back_and_say()  # best effort: the peer may still be reachable
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
        failures = self._bring_back_and_say() if ran else []  # even after a failed job
        if failures:
            returns_failed(outcome)
        if ran:  # the peer's agent wrote its own row in the peer's ledger; this is ours
            from dispatch.local.history import record_peer_run

            record_peer_run(self.settings, outcome, self.request, self.say)
        return outcome

    def _wait_alert(self, payload: bytes) -> None:
        """The job has waited long in the peer's queue: the alert is ours to say and file."""
        try:
            figures = alertlog.checked_figures(json.loads(payload))
        except ValueError:
            figures = None
        if figures is None:
            self.say(f"warning: {self.host.name} sent a wait alert that is not one; ignored")
            return
        record = alertlog.for_wait(
            figures, host=self.host.name, label=self.request.label or default_label(self.request.argv),
            session=self.request.session, argv=self.request.argv, peer=True)
        self.say(f"alert: {record['message']}")
        self._alert(record)

    def _alert(self, record: dict[str, Any] | None) -> None:
        if record is not None:
            alertlog.write(self.settings.alerts_path, record, self.say)

    def _bring_back_and_say(self) -> list[str]:
        failures = self.bring_back() if self.returns else []
        for failure in failures:
            self.say(f"error: {failure}")
        return failures

    def _session(self) -> Outcome:
        """One SSH session for steps 3-7. The agent first probes and prepares the work directory
        (frame ``P``); we compare, rsync while heartbeating, then say go (``G``) or abort (``X``).
        Folding the probe into the run session saves an ssh round trip and an agent start.

        A session that could not connect (nothing came from the agent) is tried again when the
        failure is transient, as ``SshTransport.run`` does: at most ``RETRIES`` times, full jitter, within
        twice ``report_timeout``."""
        deadline = time.monotonic() + self.settings.report_timeout * 2
        attempt = 0
        sent = False
        while True:
            try:
                return self._session_once()
            except _AgentMissing:
                if sent:
                    raise PeerUnreachableError(f"peer {self.host.name}: the agent sent there does not "
                                               "start (exit 97 after installing it)") from None
                self.link.send_agent()
                sent = True
            except PeerUnreachableError as exc:
                if not is_transient(exc) or attempt >= RETRIES or time.monotonic() >= deadline:
                    raise
                attempt += 1
                time.sleep(backoff(attempt, deadline))

    def _session_once(self) -> Outcome:
        proc = self.link.open_agent()
        self._start_walk()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        pending: list[int] = []
        old = {sig: signal.signal(sig, lambda s, _f: pending.append(s)) for sig in FORWARDED}
        lock = threading.Lock()

        # The spec first: it may be megabytes, so a thread writes it and the loop below never waits on
        # a stalled peer. Until it is written, nothing else is sent (the agent reads nothing else yet).
        spec = encode(Frame.SPEC, self.spec())
        spec_sent = threading.Event()

        def send_spec() -> None:
            with lock:
                try:
                    proc.stdin.write(spec)  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except (BrokenPipeError, ValueError, OSError):
                    pass  # the session ended: its exit status says why
                finally:
                    spec_sent.set()

        writer = threading.Thread(target=send_spec, daemon=True)
        writer.start()

        def send(kind: bytes, payload: bytes = b"") -> None:
            if not spec_sent.is_set():
                return
            with lock:
                try:
                    proc.stdin.write(encode(kind, payload))  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except (BrokenPipeError, ValueError, OSError):
                    pass

        result: dict[str, Any] | None = None
        ssh_errors = b""
        reader = FrameReader()
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        heard = False
        garbled = ""
        started = last_beat = last_heard = last_loop = time.monotonic()
        lost = False
        phase = "prepare"  # -> "sync" -> "run"
        syncing: threading.Thread | None = None
        sync_error: list[BaseException] = []
        try:
            while sel.get_map():
                # While rsync runs, nothing comes from the agent for up to 2 s: poll often, so "go" is
                # sent as soon as rsync ends, not at the next heartbeat.
                for key, _ in sel.select(timeout=0.01 if phase == "sync" else 0.5):
                    data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    if key.data == "err":
                        ssh_errors = (ssh_errors + data)[-4096:]
                        continue
                    last_heard = time.monotonic()
                    heard = True
                    try:
                        frames = reader.feed(data)
                    except ValueError as exc:  # not the agent talking: give up as on a dead link
                        garbled, lost = str(exc), True
                        proc.kill()
                        break
                    for kind, payload in frames:
                        if kind == Frame.OUT:
                            forward(1, payload)
                        elif kind == Frame.ERR:
                            forward(2, payload)
                        elif kind == Frame.MSG:
                            self.say(f"{self.host.name}: {payload.decode(errors='replace')}")
                        elif kind == Frame.ALERT:
                            self._wait_alert(payload)
                        elif kind == Frame.RESULT:
                            result = json.loads(payload)
                        elif kind == Frame.PROBE and phase == "prepare":
                            try:
                                self.check_prepared(json.loads(payload))
                            except HostrunError:
                                send(Frame.ABORT)
                                raise
                            phase = "sync"
                            syncing = threading.Thread(target=_capture, args=(self.sync, sync_error),
                                                       daemon=True)
                            syncing.start()
                if garbled:
                    break
                now = time.monotonic()
                if now - last_loop > HEARTBEAT * 2:
                    last_heard = now  # we were stopped (Ctrl-Z, a frozen host), not the link
                last_loop = now
                if phase == "sync" and syncing is not None and not syncing.is_alive():
                    if sync_error:
                        send(Frame.ABORT)
                        raise sync_error[0]
                    send(Frame.GO, self.go_payload)
                    phase = "run"
                    if self.forward_stdin:
                        threading.Thread(target=_forward_stdin, args=(send,), daemon=True).start()
                while pending:
                    sig = pending.pop(0)
                    if phase != "run":  # before the job started: nothing ran, stop here
                        send(Frame.ABORT)
                        return Outcome(exit_code=SIGNAL_BASE + sig, outcome="signal",
                                       host=self.host.name, label=self.request.label or "",
                                       argv=list(self.request.argv),
                                       message="interrupted before the job started on the peer; "
                                               "nothing ran")
                    send(Frame.SIGNAL, str(sig).encode())
                if now - last_beat >= HEARTBEAT:
                    send(Frame.BEAT)
                    last_beat = now
                if phase == "prepare" and now - started > self.settings.report_timeout * 2:
                    proc.kill()
                    raise PeerUnreachableError(f"peer {self.host.name}: the agent did not answer "
                                               f"within {self.settings.report_timeout * 2:g} s")
                if now - last_heard > self.silence_limit and result is None:
                    lost = True  # the agent beats every 2 s: a silent link is a dead one
                    proc.kill()
                    break  # don't wait for EOF: a ControlMaster may hold ssh's pipes open
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sel.close()
            if writer.is_alive():  # still stuck writing the spec: end the session, which frees it
                proc.kill()
                writer.join(10)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
            if syncing is not None and syncing.is_alive():
                self._stop_rsync()  # interrupted or failed during the sync: stop it too
            proc.wait()
        if result is None and phase == "prepare" and proc.returncode == AGENT_MISSING:
            raise _AgentMissing
        if result is None:
            text = ssh_errors.decode(errors="replace")
            why = [garbled] if garbled else text.strip().splitlines()[-1:] or ["no answer"]
            if not heard and proc.returncode == 255:
                raise classify(self.host.name, text)  # ssh could not connect: nothing started there
            if (lost or proc.returncode == 255) and phase != "run":
                raise PeerUnreachableError(f"peer {self.host.name}: the connection broke before the job "
                                           f"started ({why[0]}); nothing ran")
            if lost or proc.returncode == 255:
                raise ConnectionLostError(
                    f"the connection to {self.host.name} broke during the run ({why[0]}); the agent "
                    "there stops the job and releases its booking on its own")
            raise PeerUnreachableError(f"peer {self.host.name}: the agent ended without a result "
                                       f"(exit {proc.returncode}): {why[0]}")
        return outcome_of(result, self.host.name, self.request)


def _save_record(record: str, key: str, token: str, walked: Walked) -> None:
    from dispatch.hosts import syncstate

    try:
        syncstate.save(record, key, token, walked)
    except OSError:
        pass  # no record: the next run syncs in full


def _capture(work: Callable[[], None], errors: list[BaseException]) -> None:
    try:
        work()
    except BaseException as exc:
        errors.append(exc)


def _forward_stdin(send: Callable[[bytes, bytes], None]) -> None:
    while True:
        try:
            data = os.read(0, 65536)
        except OSError:
            data = b""
        if not data:
            send(Frame.EOF, b"")
            return
        send(Frame.DATA, data)

