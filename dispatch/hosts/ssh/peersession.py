"""The controller's side of one peer run session, the mirror of the agent's (``dispatch.agent.run``;
docs/design.md, "The wire protocol").

The session goes through three phases: *prepare* (the spec is sent, the agent answers ``P``), *sync*
(rsync runs in a thread while both sides beat; ``G`` when it is done, ``X`` when it failed) and *run*
(the job's ``O``/``E``/``M``/``A`` frames, our ``S``/``D``/``Z``, until ``R``). Each frame kind the
agent sends has its handler; the timers (heartbeats, the prepare deadline, silence) are checked
between reads; and when the session ends without a result, ``failure`` says what that was: the
agent missing (97), ssh's own failure, a link lost before or after go, or an agent that ended early.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable

from dispatch.agent.frames import HEARTBEAT, Frame, FrameReader, encode
from dispatch.agent.wire import outcome_of
from dispatch.core.errors import ConnectionLostError, HostrunError, PeerUnreachableError
from dispatch.core.exitcodes import SIGNAL_BASE
from dispatch.core.fdio import forward, write_all
from dispatch.core.outcome import Outcome
from dispatch.hosts.ssh.peer import AGENT_MISSING
from dispatch.hosts.ssh.remotetree import pump_stdin
from dispatch.hosts.ssh.transport import SSH_FAILED, classify
from dispatch.local import alertlog
from dispatch.local.admission.booking import default_label
from dispatch.local.run.signals import FORWARDED

MYPY = False
if MYPY:
    import subprocess
    from typing import Any, Protocol

    from dispatch.core.request import RunRequest
    from dispatch.core.settings import HostSettings, Settings

    class SessionOwner(Protocol):
        """What a session asks of its run (``peerrun.PeerRun``): the steps around the wire."""

        settings: Settings
        host: HostSettings
        request: RunRequest
        say: Callable[[str], None]
        silence_limit: float
        forward_stdin: bool
        go_payload: bytes

        def spec(self) -> bytes: ...
        def check_prepared(self, remote: dict[str, Any]) -> None: ...
        def sync(self) -> None: ...
        def stop_sync(self) -> None: ...

PREPARE, SYNC, RUN = "prepare", "sync", "run"


class AgentMissing(Exception):
    """The peer lacks this version of the agent (the session exited 97 before saying anything)."""


class AgentSession:
    """One ssh session with the agent, from the spec to the result (or the failure)."""

    def __init__(self, owner: SessionOwner, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.owner = owner
        self.proc = proc
        self.host = owner.host.name
        self.stdin_fd = proc.stdin.fileno()
        self.lock = threading.Lock()  # one frame at a time, and none after the pipe is closed
        self.closed = False
        self.spec_sent = threading.Event()  # nothing else is sent before (the agent reads nothing else)
        self.writer: threading.Thread | None = None
        self.signals: list[int] = []  # caught here, forwarded or ending the run between reads
        self.phase = PREPARE
        self.syncing: threading.Thread | None = None
        self.synced = threading.Event()  # set as the sync thread's last act (it may not have exited)
        self.sync_error: list[BaseException] = []
        # The sync thread's end wakes the loop at once (a byte on this pipe): "go" follows rsync,
        # or the decision not to rsync, without waiting for a frame or a poll's timeout.
        self.wake: tuple[int, ...] = os.pipe()
        self.reader = FrameReader()
        self.result: dict[str, Any] | None = None
        self.ssh_errors = b""  # the end of ssh's stderr: its reason when it fails
        self.heard = False  # anything came from the agent
        self.garbled = ""  # why the stream is not the agent's
        self.lost = False  # the link judged dead (silence, garbage)
        self.started = self.last_beat = self.last_heard = self.last_loop = time.monotonic()
        self.handlers: dict[bytes, Callable[[bytes], None]] = {
            Frame.OUT: lambda payload: forward(1, payload),
            Frame.ERR: lambda payload: forward(2, payload),
            Frame.MSG: self._on_message, Frame.ALERT: self._on_alert,
            Frame.RESULT: self._on_result, Frame.PROBE: self._on_probe,
        }

    # -- sending --
    def _send_spec(self, spec: bytes) -> None:
        """The spec, from a thread: it may be megabytes, and the loop must never wait on a stalled
        peer."""
        try:
            self._write(Frame.SPEC, spec)
        finally:
            self.spec_sent.set()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        """A frame, once the spec is out (from the loop or the stdin pump)."""
        if self.spec_sent.is_set():
            self._write(kind, payload)

    def _write(self, kind: bytes, payload: bytes) -> None:
        """One whole frame; a session that ended takes nothing (its exit status says why), and once
        its pipe is closed nothing is written to the number it had."""
        with self.lock:
            if self.closed:
                return
            try:
                write_all(self.stdin_fd, encode(kind, payload))
            except OSError:
                pass

    # -- the session --
    def run(self) -> Outcome:
        """The session to its end: the outcome from ``R``, or the run interrupted before the job
        started; a session that ended without a result raises what ``failure`` makes of it."""
        old = {sig: signal.signal(sig, lambda s, _f: self.signals.append(s)) for sig in FORWARDED}
        self.writer = threading.Thread(target=self._send_spec, args=(self.owner.spec(),), daemon=True)
        self.writer.start()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ, "out")  # type: ignore[arg-type]
        sel.register(self.proc.stderr, selectors.EVENT_READ, "err")  # type: ignore[arg-type]
        sel.register(self.wake[0], selectors.EVENT_READ, "wake")
        try:
            interrupted = self._loop(sel)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sel.close()
            with self.lock:  # the sync thread writes to it under the lock, never after this
                for fd in self.wake:
                    os.close(fd)
                self.wake = ()
            self._teardown()
        if interrupted is not None:
            return interrupted
        if self.result is None:
            raise self.failure()
        return outcome_of(self.result, self.host, self.owner.request)

    def _loop(self, sel: selectors.BaseSelector) -> Outcome | None:
        """Read and handle frames, and between reads keep the timers, until both pipes close or the
        link is dead; an Outcome when a signal ended the run before the job started."""
        while len(sel.get_map()) > 1:  # the agent's pipes, besides the wake pipe
            for key, _ in sel.select(timeout=0.5):
                self._read(sel, key)
                if self.garbled:
                    return None
            now = time.monotonic()
            if now - self.last_loop > HEARTBEAT * 2:
                self.last_heard = now  # we were stopped (Ctrl-Z, a frozen host), not the link
            self.last_loop = now
            if self.phase == SYNC and self.synced.is_set():
                self._after_sync()
            interrupted = self._forward_signals()
            if interrupted is not None:
                return interrupted
            if now - self.last_beat >= HEARTBEAT:
                self.send(Frame.BEAT)
                self.last_beat = now
            self._check_prepare_deadline(now)
            if now - self.last_heard > self.owner.silence_limit and self.result is None:
                self.lost = True  # the agent beats every 2 s: a silent link is a dead one
                self.proc.kill()
                return None  # don't wait for EOF: a ControlMaster may hold ssh's pipes open
        return None

    def _read(self, sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        """One read from ssh's stdout (the agent's frames) or stderr (ssh's own words), or the sync
        thread's wake-up."""
        data = os.read(key.fd, 65536)
        if key.data == "wake":
            return
        if not data:
            sel.unregister(key.fileobj)
            return
        if key.data == "err":
            self.ssh_errors = (self.ssh_errors + data)[-4096:]
            return
        self.last_heard = time.monotonic()
        self.heard = True
        try:
            frames = self.reader.feed(data)
        except ValueError as exc:  # not the agent talking: give up as on a dead link
            self.garbled, self.lost = str(exc), True
            self.proc.kill()
            return
        for kind, payload in frames:
            handler = self.handlers.get(kind)
            if handler is not None:  # a kind we do not expect is ignored
                handler(payload)

    # -- the frames the agent sends --
    def _on_message(self, payload: bytes) -> None:
        self.owner.say(f"{self.host}: {payload.decode(errors='replace')}")

    def _on_result(self, payload: bytes) -> None:
        self.result = json.loads(payload)

    def _on_probe(self, payload: bytes) -> None:
        """Step 3 answered: compare (247 or the work directory's 252 abort the run), then sync."""
        if self.phase != PREPARE:
            return
        try:
            self.owner.check_prepared(json.loads(payload))
        except HostrunError:
            self.send(Frame.ABORT)
            raise
        self.phase = SYNC
        self.syncing = threading.Thread(target=self._sync, daemon=True)
        self.syncing.start()

    def _on_alert(self, payload: bytes) -> None:
        """The job has waited long in the peer's queue: the alert is ours to say and file."""
        owner, request = self.owner, self.owner.request
        try:
            figures = alertlog.checked_figures(json.loads(payload))
        except ValueError:
            figures = None
        if figures is None:
            owner.say(f"warning: {self.host} sent a wait alert that is not one; ignored")
            return
        record = alertlog.for_wait(
            figures, host=self.host, label=request.label or default_label(request.argv),
            session=request.session, argv=request.argv, peer=True)
        owner.say(f"alert: {record['message']}")
        alertlog.write(owner.settings.alerts_path, record, owner.say)

    def _sync(self) -> None:
        """Step 4 in its thread; its end wakes the loop (unless the session is over)."""
        _capture(self.owner.sync, self.sync_error)
        self.synced.set()
        with self.lock:
            if self.wake:
                os.write(self.wake[1], b"s")

    # -- between reads --
    def _after_sync(self) -> None:
        """The sync ended: abort with its failure (252), or go (and start pumping stdin)."""
        if self.sync_error:
            self.send(Frame.ABORT)
            raise self.sync_error[0]
        self.send(Frame.GO, self.owner.go_payload)
        self.phase = RUN
        if self.owner.forward_stdin:
            threading.Thread(target=pump_stdin, args=(lambda data: self.send(Frame.DATA, data),
                                                      lambda: self.send(Frame.EOF)),
                             daemon=True).start()

    def _forward_signals(self) -> Outcome | None:
        """Signals caught since the last turn, as ``S`` frames; before the job started, the first
        one aborts the run instead (nothing ran there): its Outcome, 128+N."""
        while self.signals:
            sig = self.signals.pop(0)
            if self.phase != RUN:
                self.send(Frame.ABORT)
                request = self.owner.request
                return Outcome(exit_code=SIGNAL_BASE + sig, outcome="signal", host=self.host,
                               label=request.label or "", argv=list(request.argv),
                               message="interrupted before the job started on the peer; nothing ran")
            self.send(Frame.SIGNAL, str(sig).encode())
        return None

    def _check_prepare_deadline(self, now: float) -> None:
        limit = self.owner.settings.report_timeout * 2
        if self.phase == PREPARE and now - self.started > limit:
            self.proc.kill()
            raise PeerUnreachableError(f"peer {self.host}: the agent did not answer within {limit:g} s")

    # -- the end --
    def _teardown(self) -> None:
        """However the session ended: the spec writer freed, the pipes closed, a sync still running
        stopped, ssh reaped."""
        proc = self.proc
        if self.writer is not None and self.writer.is_alive():  # stuck writing the spec: end the
            proc.kill()  # session, which frees it
            self.writer.join(10)
        held = self.lock.acquire(timeout=10)  # a frame half written to a stuck peer: close anyway
        self.closed = True
        if held:
            self.lock.release()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
        if self.syncing is not None and self.syncing.is_alive():
            self.owner.stop_sync()  # interrupted or failed during the sync: stop it too
        proc.wait()

    def failure(self) -> Exception:
        """What a session that ended without a result was: the agent missing (sent, then tried
        again), ssh unable to connect (246, by ssh's reason), the link lost before go (246, nothing
        ran) or after it (251), or an agent that ended on its own (246)."""
        code = self.proc.returncode
        if self.phase == PREPARE and code == AGENT_MISSING:
            return AgentMissing()
        text = self.ssh_errors.decode(errors="replace")
        why = [self.garbled] if self.garbled else text.strip().splitlines()[-1:] or ["no answer"]
        if not self.heard and code == SSH_FAILED:
            return classify(self.host, text)  # ssh could not connect: nothing started there
        if (self.lost or code == SSH_FAILED) and self.phase != RUN:
            return PeerUnreachableError(f"peer {self.host}: the connection broke before the job "
                                        f"started ({why[0]}); nothing ran")
        if self.lost or code == SSH_FAILED:
            return ConnectionLostError(
                f"the connection to {self.host} broke during the run ({why[0]}); the agent "
                "there stops the job and releases its booking on its own")
        return PeerUnreachableError(f"peer {self.host}: the agent ended without a result "
                                    f"(exit {code}): {why[0]}")


def _capture(work: Callable[[], None], errors: list[BaseException]) -> None:
    try:
        work()
    except BaseException as exc:
        errors.append(exc)
