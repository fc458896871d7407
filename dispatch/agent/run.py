"""The agent's side of ``hostrun --peer``: run one job on this (the peer) machine, framed.

Runs under the peer's own ledger, slice and peak table, through the same ``run_local`` as a local
job. The job's stdout and stderr go through pipes that are pumped into frames on the agent's stdout;
control frames (heartbeats, signals, stdin) come on its stdin. If they stop — the controller was
killed, the link was cut, the machine froze — for ``SILENCE_LIMIT`` seconds, or stdin closes, the
agent stops the job itself: nothing is left running or booked on the peer when anything breaks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from dispatch.agent.frames import HEARTBEAT, SILENCE_LIMIT, SYNC_MARK, Frame, FrameReader, FrameWriter
from dispatch.agent.wire import RunSpec, error_result, result_of
from dispatch.core.fdio import write_all

MYPY = False
if MYPY:
    from typing import Any

    from dispatch.agent.prepareshape import GoToken, PrepareSpec
    from dispatch.agent.treestate import Walk
    from dispatch.core.alertshape import WaitFigures
    from dispatch.core.settings import Settings


class _Link:
    """Reads control frames; notices when the controller is gone."""

    def __init__(self, fd: int, stdin_fd: int | None) -> None:
        self.fd = fd
        self.stdin_fd = stdin_fd
        self.last_seen = time.monotonic()
        self.lost = threading.Event()
        self.decided = threading.Event()  # the controller said go (G) or abort (X), or went away
        self.go = False
        self.silent_for = 0.0  # set when the watchdog stopped the job: how long the controller was silent
        self.go_payload = b""  # what the controller says with go (``treestate.save_after_go``)

    def read_loop(self) -> None:
        reader = FrameReader()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                self.lost.set()
                self.decided.set()
                return
            self.last_seen = time.monotonic()
            for kind, payload in reader.feed(data):
                if kind == Frame.GO:
                    self.go = True
                    self.go_payload = payload
                    self.decided.set()
                elif kind == Frame.ABORT:
                    self.decided.set()
                elif kind == Frame.SIGNAL:
                    os.kill(os.getpid(), int(payload))
                elif kind == Frame.DATA and self.stdin_fd is not None:
                    try:  # whole: a signal handled mid-write may cut a pipe write short
                        write_all(self.stdin_fd, payload)
                    except OSError:
                        pass  # the job closed its stdin: the rest is dropped, as a pipe would
                elif kind == Frame.EOF and self.stdin_fd is not None:
                    os.close(self.stdin_fd)
                    self.stdin_fd = None

    def watchdog(self, done: threading.Event) -> None:
        """Stop the job when the controller is gone: SIGTERM (forwarded to the job), then a second
        signal a moment later, which makes the runner kill the job's whole cgroup at once."""
        while not done.wait(0.5):
            if self.lost.is_set() or time.monotonic() - self.last_seen > SILENCE_LIMIT:
                self.silent_for = max(0.001, time.monotonic() - self.last_seen)
                os.kill(os.getpid(), signal.SIGTERM)
                if done.wait(2.0):
                    return
                os.kill(os.getpid(), signal.SIGTERM)
                return


def _pump(fd: int, kind: bytes, writer: FrameWriter) -> None:
    broken = False
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            os.close(fd)
            return
        if not broken:  # once the controller is gone, keep draining so the job never blocks
            try:
                writer.send(kind, data)
            except OSError:
                broken = True


def _stop_sync(mark: str) -> None:
    """Kill the rsync server of this run's sync, if it still runs: the session dropped (or the
    controller aborted) mid-sync. It runs under the controller's master connection, not under this
    session, so its end is not ours; the controller marked it with ``SYNC_MARK=<mark>`` in its
    environment (its forks inherit it). Only this user's processes are looked at."""
    if not mark:
        return
    needle = f"{SYNC_MARK}={mark}".encode()
    uid = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not readable
            continue


class _Session:
    """This run's end of the link: the frames out (the job's output, hostrun's lines, alerts, beats,
    the result) and the control frames in (``_Link``), with the threads that move them. Opening it
    points this process's stdin, stdout and stderr at the job's pipes, which ``run_local`` hands on."""

    def __init__(self, spec: RunSpec) -> None:
        self.writer = FrameWriter(os.dup(1))
        control_fd = os.dup(0)
        stdin_w = _job_stdin(spec.stdin)
        self.pumps = _pump_outputs(self.writer)
        self.link = _Link(control_fd, stdin_w)
        self.done = threading.Event()
        self.background: threading.Thread | None = None  # the copy's manifest being written
        threading.Thread(target=self.link.read_loop, daemon=True).start()
        threading.Thread(target=self.link.watchdog, args=(self.done,), daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.done.wait(HEARTBEAT):
            try:
                self.writer.send(Frame.BEAT)
            except OSError:
                return

    def say(self, line: str) -> None:
        try:
            self.writer.send(Frame.MSG, line.encode())
        except OSError:
            pass

    def alert(self, figures: WaitFigures) -> None:
        try:
            self.writer.send(Frame.ALERT, json.dumps(figures).encode())
        except OSError:
            pass

    def join_background(self) -> None:
        if self.background is not None:
            self.background.join()
            self.background = None

    def wait_for_go(self) -> bool:
        """Whether the controller said go; False after an abort, or once it went away or silent."""
        link = self.link
        while not link.decided.wait(0.5):
            if time.monotonic() - link.last_seen > SILENCE_LIMIT:
                break
        return link.go

    def end_output(self) -> None:
        """The job is over: stop the beats and the watchdog, and close our copies of the pipes'
        write ends, so the pumps see EOF once the job's are gone too (its cgroup was emptied by
        run_local)."""
        self.done.set()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)

    def join_pumps(self) -> None:
        for thread in self.pumps:
            thread.join(timeout=10)

    def send_result(self, result: dict[str, Any]) -> int:
        """The last frame, after all the job's output: 0, or 1 when the controller is gone."""
        try:
            self.writer.send(Frame.RESULT, json.dumps(result).encode())
        except OSError:
            return 1
        sys.stdout.flush()
        return 0


def _job_stdin(from_controller: bool) -> int | None:
    """The job's stdin on fd 0: a pipe the link writes ``D`` frames into (its write end returned),
    or /dev/null."""
    if from_controller:
        stdin_r, stdin_w = os.pipe()
        os.dup2(stdin_r, 0)
        os.close(stdin_r)
        return stdin_w
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return None


def _pump_outputs(writer: FrameWriter) -> list[threading.Thread]:
    """Fds 1 and 2 become pipes whose contents go out as ``O`` and ``E`` frames, one thread each."""
    pumps = []
    for target, kind in ((1, Frame.OUT), (2, Frame.ERR)):
        read_end, write_end = os.pipe()
        os.dup2(write_end, target)
        os.close(write_end)
        thread = threading.Thread(target=_pump, args=(read_end, kind, writer), daemon=True)
        thread.start()
        pumps.append(thread)
    return pumps


def run_job(spec: RunSpec) -> int:
    """Run the job ``spec`` describes under this peer's ledger and caps, framed on stdout: with
    ``prepare``, the probes first and the wait for the controller's go; then the run; the result
    last. Exit 0 once the result is sent (or nothing ran), 1 when it could not be."""
    session = _Session(spec)
    settings = None
    if spec.prepare is not None:
        settings = _prepare(spec, spec.prepare, session)
        if settings is None:
            return 0  # aborted (toolchain, sync, Ctrl-C) or the controller went away: nothing ran
    result = _run_here(spec, settings, session)
    session.join_background()  # the manifest, written while the job ran
    session.join_pumps()
    if session.link.silent_for and not session.link.lost.is_set():
        _stopped_for_silence(result, session.link.silent_for)
    return session.send_result(result)


def _prepare(spec: RunSpec, prepare: PrepareSpec, session: _Session) -> Settings | None:
    """Steps 3-4 in this same session: report probes and the work directory, then wait while the
    controller compares and syncs (it keeps beating), for go or abort. The peer's settings once it
    said go; None when it did not."""
    from dispatch.agent.prepare import probe

    prepared = probe(prepare)
    walked = None
    copy = prepare.get("copy")
    if isinstance(copy, dict) and "workdir" in prepared:  # is the copy as the last sync left it?
        from dispatch.agent.treestate import check_copy

        try:
            prepared["copy"], walked = check_copy(prepared["workdir"], list(copy.get("excludes") or []))
        except Exception:  # any doubt about the copy: the controller then rsyncs in full
            prepared["copy"] = {"token": None, "clean": False}
    session.writer.send(Frame.PROBE, json.dumps(prepared).encode())
    # While the controller compares and syncs: load what the run needs (off the critical path),
    # and keep the listings the check had to read in the manifest.
    if walked is not None:
        from dispatch.agent.treestate import keep_listings

        session.background = threading.Thread(
            target=keep_listings, args=(prepared["workdir"], prepared["copy"], walked), daemon=True)
        session.background.start()
    import dispatch.local.run.runner  # noqa: F401
    from dispatch.agent.prepare import peer_settings

    settings, _notes = peer_settings(spec.fallback or {})
    if not session.wait_for_go():
        session.join_background()
        session.done.set()
        _stop_sync(str(prepare.get("sync_mark") or ""))
        return None
    if isinstance(copy, dict) and "workdir" in prepared and session.link.go_payload:
        _record_copy(prepared["workdir"], list(copy.get("excludes") or []), walked, session)
    return settings


def _record_copy(workdir: str, excludes: list[str], walked: Walk | None, session: _Session) -> None:
    """The copy's manifest after a sync: taken now, before the job runs; written while it runs."""
    from dispatch.agent.treestate import state_after_go, write_manifest

    try:
        go: GoToken = json.loads(session.link.go_payload)  # each field checked where it is read
    except ValueError:
        go = {}
    session.join_background()  # one writer of the manifest at a time
    state = state_after_go(workdir, excludes, walked, go if isinstance(go, dict) else {})
    if state is not None:
        session.background = threading.Thread(target=write_manifest, args=(workdir, *state),
                                              daemon=True)
        session.background.start()


def _run_here(spec: RunSpec, settings: Settings | None, session: _Session) -> dict[str, Any]:
    """The job through ``run_local``, under the peer's cap rule and the controller's alert and status
    settings: its result frame's payload (an error's, when hostrun itself failed)."""
    from dispatch.agent.prepare import peer_settings
    from dispatch.local.admission.booking import peer_cap
    from dispatch.local.run.localrun import run_local

    if settings is None:
        settings, _notes = peer_settings(spec.fallback or {})
    result: dict[str, Any]
    try:
        os.chdir(os.path.expanduser(spec.cwd))
        # The peer's default_cap (its own, else the controller's), bounded by the peer_memory_cap
        # the controller set for this peer ("cap_if_none"): the rule the controller checked.
        request = spec.request._replace(
            cap=peer_cap(spec.request.cap, settings.local.default_cap, spec.cap_if_none))
        # The controller alerts: from the outcome, and on a long wait here from the figures sent.
        # The waiting lines are shown there too: the controller's interval, when it sent one.
        settings = settings._replace(alert_wait_after=spec.alert_wait_after,
                                     status_interval=spec.status_interval or settings.status_interval)
        result = result_of(run_local(settings, request, session.say, alerts=False,
                                     wait_alert=session.alert))
    except Exception as exc:
        result = error_result(exc)
    finally:
        session.end_output()
    return result


def _stopped_for_silence(result: dict[str, Any], silent_for: float) -> None:
    """We stopped the job because the controller went silent, and yet it is still there to read
    this: it was suspended (Ctrl-Z, SIGSTOP) or the link stalled. Say so, with the code for a broken
    link, not the SIGTERM the job died of."""
    from dispatch.core.exitcodes import ExitCode, outcome_name

    result.update(exit_code=int(ExitCode.CONNECTION_LOST),
                  outcome=outcome_name(ExitCode.CONNECTION_LOST),
                  message=(f"the peer stopped the job: no word from this hostrun for "
                           f"{silent_for:.0f}s (over {SILENCE_LIMIT:.0f}s: was it suspended, "
                           f"or the link stalled?); the job's own status was "
                           f"{result.get('exit_code')}"))
