"""A fake peer for ``hostrun --peer`` (``dispatch.hosts.ssh.peerrun.PeerRun``): no sshd, no root, no cgroups.

``FakeLink`` is a ``PeerLink`` (the seam ``SshLink`` fills for real). Its "session" is a local
subprocess running this file as a scripted agent: it reads the spec frame and decodes it with the
real ``RunSpec``, answers ``P`` with a prepared dict, beats, waits for ``G``/``X``, then does what its
``Script`` says (output, a result, dying, going silent, echoing forwarded signals); every frame the
controller sends is logged so that a test can see what was (not) sent. It speaks through
``dispatch.agent.frames`` and ``dispatch.agent.wire``, never bytes of its own. Its "rsync" is the
real rsync copying locally (the ``<ssh>:`` prefix of remote paths dropped, no remote shell), or a
scripted failure. The "peer" is a local directory.

What this does not cover (the sshd tests do: tests/system/test_peer_run.py, test_peer_failures.py): ssh
itself, the ControlMaster, the real agent (probing, the peer's ledger, caps), the bundle's install,
and rsync over ssh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as the fake agent: find this tree's dispatch
    sys.path.insert(0, str(ROOT))

from dispatch.agent.frames import Frame, FrameReader, FrameWriter, read_spec  # noqa: E402
from dispatch.agent.wire import RunSpec  # noqa: E402
from dispatch.core.exitcodes import SIGNAL_BASE  # noqa: E402

HOST_SSH = "fakepeer"  # the ``ssh`` destination of the fake host: remote paths are ``fakepeer:PATH``
SSH_LOST = 255  # what ssh exits with when the connection drops
LOST_MESSAGE = f"Connection to {HOST_SSH} closed by remote host."


@dataclass
class Script:
    """What the fake agent does. Defaults: a job that exits 0 with nothing to say."""

    probes: dict[str, dict[str, Any]] | None = None  # the P frame's probes; None: run them here too
    missing_first: bool = False  # exit 97 (agent missing) until ``send_agent`` was called
    refuse_first: str | None = None  # ssh's stderr for a first session that cannot connect (255)
    after_go: str = "result"  # "result", "die" (the link drops: ssh exits 255), "silent"
    stdout: str = ""
    stderr: str = ""
    files: dict[str, str] = field(default_factory=dict)  # written in the job's directory after go
    wait_signal: bool = False  # after go: wait for an S frame, say so, end as killed by it
    result: dict[str, Any] = field(default_factory=lambda: {
        "exit_code": 0, "outcome": "exit", "booking_kind": "cap", "peak_bytes": 1 << 20})
    beat: float = 0.1  # heartbeat period (the controller's silence limit may be shortened)
    sync_error: str | None = None  # rsync's stderr for a failing sync (exit 23)
    return_error: str | None = None  # the same for a failing --return copy


class FakeLink:
    """The fake's side in the test process: opens fake sessions, fakes rsync, records both."""

    def __init__(self, directory: Path, script: Script | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.script = script or Script()
        self.peer_root = self.dir / "peer"  # the peer's work root (set it as the host's work_root)
        self.peer_root.mkdir(exist_ok=True)
        self.log = self.dir / "frames.jsonl"
        self.opened = 0
        self.agents_sent = 0
        self.rsyncs: list[list[str]] = []
        self.on_rsync: Callable[[], None] | None = None  # called as each rsync starts (its thread)

    # -- PeerLink --
    def open_agent(self) -> subprocess.Popen[bytes]:
        self.opened += 1
        mode = "run"
        if self.script.missing_first and not self.agents_sent:
            mode = "missing"
        elif self.script.refuse_first is not None and self.opened == 1:
            mode = "refuse"
        script = self.dir / "script.json"
        script.write_text(json.dumps(asdict(self.script)))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.Popen([sys.executable, __file__, mode, str(script), str(self.log)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env=env)

    def send_agent(self) -> None:
        self.agents_sent += 1

    def rsync_argv(self, options: list[str], args: list[str]) -> list[str]:
        self.rsyncs.append([*options, *args])
        if self.on_rsync is not None:
            self.on_rsync()
        error = self.script.return_error if "--relative" in args else self.script.sync_error
        if error is not None:
            return [sys.executable, "-c", "import sys; sys.stderr.write(sys.argv[1]); sys.exit(23)", error]
        local = [arg.removeprefix(f"{HOST_SSH}:") for arg in args if not arg.startswith("--rsync-path=")]
        return ["rsync", *options, *local]

    # -- for the tests --
    def received(self) -> list[tuple[bytes, bytes]]:
        """The frames the controller sent, in order, the spec first (its payload as sent)."""
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [(entry["kind"].encode(), entry["payload"].encode("latin-1"))
                for entry in map(json.loads, lines)]

    def kinds(self) -> list[bytes]:
        return [kind for kind, _ in self.received() if kind != Frame.BEAT]

    def wait_for(self, kind: bytes, timeout: float = 10.0) -> bool:
        """Whether the controller sent a frame of ``kind`` within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while kind not in self.kinds():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


# -- the fake agent (this file run as a program) --

class _Control:
    """Reads the controller's frames after the spec, logs each, and notes go/abort/signals/EOF."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.decided = threading.Event()
        self.go = False
        self.go_payload = b""
        self.signals: list[int] = []
        self.signalled = threading.Event()
        self.closed = threading.Event()

    def record(self, kind: bytes, payload: bytes) -> None:
        with open(self.log, "a") as fh:
            fh.write(json.dumps({"kind": kind.decode(), "payload": payload.decode("latin-1")}) + "\n")

    def read_loop(self) -> None:
        reader = FrameReader()
        while True:
            data = os.read(0, 65536)
            if not data:
                self.closed.set()
                self.decided.set()
                return
            for kind, payload in reader.feed(data):
                self.record(kind, payload)
                if kind == Frame.GO:
                    self.go = True
                    self.go_payload = payload
                    self.decided.set()
                elif kind == Frame.ABORT:
                    self.decided.set()
                elif kind == Frame.SIGNAL:
                    self.signals.append(int(payload))
                    self.signalled.set()


def _agent(mode: str, script_path: str, log: str) -> int:
    script = Script(**json.loads(Path(script_path).read_text()))
    if mode == "missing":
        return 97  # as the real session's ``sh -c`` does: nothing read, nothing said
    if mode == "refuse":
        sys.stderr.write(script.refuse_first or "")
        return SSH_LOST
    control = _Control(log)
    raw = read_spec(0)
    control.record(Frame.SPEC, raw)
    spec = RunSpec.from_dict(json.loads(raw))  # what the real agent decodes, or this fails
    assert spec.prepare is not None
    writer = FrameWriter(1)
    quiet = threading.Event()

    def beat() -> None:
        while not quiet.wait(script.beat):
            writer.send(Frame.BEAT)

    threading.Thread(target=control.read_loop, daemon=True).start()
    threading.Thread(target=beat, daemon=True).start()
    workdir = os.path.join(os.path.dirname(log), "peer", os.path.basename(spec.prepare["workdir"]))
    os.makedirs(workdir, exist_ok=True)
    probes = script.probes
    if probes is None:
        from dispatch.guards.toolchain import probe_here

        probes = probe_here(spec.prepare["probes"], os.path.dirname(log), workdir)
    prepared: dict[str, Any] = {"probes": probes, "workdir": workdir}
    copy = spec.prepare.get("copy")
    walked = None
    if isinstance(copy, dict):  # the real agent's check of its copy and its manifest after go
        from dispatch.agent.treestate import check_copy, keep_listings, save_after_go

        prepared["copy"], walked = check_copy(workdir, list(copy.get("excludes") or []))
    writer.send(Frame.PROBE, json.dumps(prepared).encode())
    if isinstance(copy, dict):
        keep_listings(workdir, prepared["copy"], walked)
    control.decided.wait()
    if not control.go:  # aborted, or the controller went away: keep logging until it closes
        control.closed.wait(30)
        return 0
    if isinstance(copy, dict) and control.go_payload:
        save_after_go(workdir, list(copy.get("excludes") or []), walked, json.loads(control.go_payload))
    if script.after_go == "die":
        sys.stderr.write(LOST_MESSAGE + "\n")
        sys.stderr.flush()
        os._exit(SSH_LOST)
    if script.after_go == "silent":
        writer.send(Frame.MSG, b"going silent")
        quiet.set()
        control.closed.wait(30)
        return 0
    job_dir = os.path.join(workdir, spec.prepare["job_dir"])
    for rel, text in script.files.items():
        os.makedirs(os.path.dirname(os.path.join(job_dir, rel)), exist_ok=True)
        Path(job_dir, rel).write_text(text)
    if script.stdout:
        writer.send(Frame.OUT, script.stdout.encode())
    if script.stderr:
        writer.send(Frame.ERR, script.stderr.encode())
    result = dict(script.result)
    if script.wait_signal:
        writer.send(Frame.MSG, b"waiting for a signal")
        control.signalled.wait(10)
        number = control.signals[0] if control.signals else 0
        writer.send(Frame.MSG, f"got signal {number}".encode())
        result.update(exit_code=SIGNAL_BASE + number, outcome="signal")
    quiet.set()
    writer.send(Frame.RESULT, json.dumps(result).encode())
    return 0


if __name__ == "__main__":
    sys.exit(_agent(*sys.argv[1:4]))
