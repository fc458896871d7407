"""The phases of a peer run (``dispatch.hosts.ssh.peerrun.PeerRun``) against a fake peer
(tests/support/fakepeer.py).

Real: ``PeerRun`` itself, the frames and wire records, a subprocess playing the agent, rsync copying
locally, the controller's toolchain probe and its ledger's history row in a temporary state dir.
Fake: ssh (the session is a local subprocess) and the agent's behaviour (scripted). No sshd, no
root, no cgroups: ``pytest -m "not system"`` runs these. The same phases against real sshd peers:
tests/system/test_peer_run.py and tests/system/test_peer_failures.py.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from dispatch.agent.frames import Frame
from dispatch.agent.wire import RunSpec
from dispatch.core.errors import (
    ConnectionLostError,
    PeerAuthError,
    SyncFailedError,
    ToolchainMismatchError,
)
from dispatch.core.exitcodes import SIGNAL_BASE, ExitCode
from tests.support.fakepeer import LOST_MESSAGE, Script
from tests.support.phases import ARGV, PROBE, Driver, source_tree


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return source_tree(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def sigint_guard() -> Iterator[list[int]]:
    """A SIGINT that PeerRun did not take stays here (noted) instead of interrupting pytest."""
    leaked: list[int] = []

    def note(sig: int, _frame: FrameType | None) -> None:
        leaked.append(sig)

    old = signal.signal(signal.SIGINT, note)
    try:
        yield leaked
    finally:
        signal.signal(signal.SIGINT, old)


def test_happy_path_passes_the_exit_code_and_keeps_stdout_and_stderr_apart(
        tmp_path: Path, tree: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = Script(stdout="to stdout\n", stderr="to stderr\n",
                    result={"exit_code": 3, "outcome": "exit", "booking_kind": "cap"})
    drive = Driver(tmp_path, tree, script)
    outcome = drive()
    assert outcome.exit_code == 3
    out, err = capfd.readouterr()
    assert (out, err) == ("to stdout\n", "to stderr\n")
    assert (drive.peer_tree / "sub" / "main.c").read_text() == "int main(void) { return 0; }\n"
    assert drive.link.kinds() == [Frame.SPEC, Frame.GO]
    spec = RunSpec.from_dict(json.loads(drive.link.received()[0][1]))
    assert spec.request.argv == ARGV
    assert spec.cwd.endswith("/sub")


def test_the_outcome_comes_from_the_result_frame_with_this_sides_host_label_and_argv(
        tmp_path: Path, tree: Path) -> None:
    """The peer's numbers are taken; the names this host's records are keyed by are not."""
    result = {"exit_code": 0, "outcome": "exit", "host": "the-peers-own-name", "label": "from-peer",
              "peak_bytes": 123456789, "booking_kind": "cap", "cap_bytes": 1 << 30}
    outcome = Driver(tmp_path, tree, Script(result=result))()
    assert (outcome.host, outcome.peak_bytes) == ("fake", 123456789)
    assert outcome.label == "build" and outcome.label != result["label"]
    assert (outcome.cap_bytes, outcome.booking_kind, outcome.argv) == (1 << 30, "cap", ARGV)


def test_toolchain_mismatch_is_247_and_nothing_follows_the_abort(tmp_path: Path, tree: Path) -> None:
    script = Script(probes={PROBE: {"found": True, "output": "faketool 0.9"}})
    drive = Driver(tmp_path, tree, script)
    with pytest.raises(ToolchainMismatchError) as info:
        drive()
    assert info.value.exit_code == ExitCode.TOOLCHAIN_MISMATCH
    assert info.value.host == "fake"
    assert f"toolchain: {PROBE}: here 'faketool 1.0' / fake 'faketool 0.9'" in drive.lines
    assert drive.link.rsyncs == []  # nothing synced
    assert drive.link.received()[-1][0] == Frame.ABORT  # nothing after X, not even a beat
    assert drive.link.kinds() == [Frame.SPEC, Frame.ABORT]


def test_sync_failure_is_252_with_rsyncs_first_complaint_and_aborts(tmp_path: Path, tree: Path) -> None:
    cause = 'rsync: [receiver] mkdir "/peer/tree" failed: No space left on device (28)'
    script = Script(sync_error=f"{cause}\nrsync error: error in file IO (code 11) at main.c(791)\n")
    drive = Driver(tmp_path, tree, script)
    with pytest.raises(SyncFailedError) as info:
        drive()
    assert info.value.exit_code == ExitCode.SYNC_FAILED
    assert str(info.value) == f"sync with fake failed (rsync exit 23): {cause}"
    assert drive.link.kinds() == [Frame.SPEC, Frame.ABORT]


def test_a_missing_agent_is_sent_once_and_the_session_opened_again(tmp_path: Path, tree: Path) -> None:
    drive = Driver(tmp_path, tree, Script(missing_first=True))
    outcome = drive()
    assert outcome.exit_code == 0
    assert (drive.link.agents_sent, drive.link.opened) == (1, 2)
    assert drive.link.kinds() == [Frame.SPEC, Frame.GO]  # the first session got nothing it read


def test_a_transient_connect_failure_is_retried(tmp_path: Path, tree: Path) -> None:
    script = Script(refuse_first="ssh: connect to host fakepeer port 22: Connection refused\n")
    drive = Driver(tmp_path, tree, script)
    assert drive().exit_code == 0
    assert drive.link.opened == 2


def test_an_authentication_failure_is_246_at_once(tmp_path: Path, tree: Path) -> None:
    script = Script(refuse_first="root@fakepeer: Permission denied (publickey).\n")
    drive = Driver(tmp_path, tree, script)
    with pytest.raises(PeerAuthError) as info:
        drive()
    assert info.value.exit_code == ExitCode.PEER_UNREACHABLE
    assert drive.link.opened == 1


def test_the_link_dying_after_go_is_251_and_returns_are_still_tried(tmp_path: Path, tree: Path) -> None:
    drive = Driver(tmp_path, tree, Script(after_go="die"), returns=["target/out.txt"])
    with pytest.raises(ConnectionLostError) as info:
        drive()
    assert info.value.exit_code == ExitCode.CONNECTION_LOST
    assert LOST_MESSAGE in str(info.value)
    assert any("--relative" in call for call in drive.link.rsyncs)


def test_silence_after_go_is_251(tmp_path: Path, tree: Path) -> None:
    def shorten(drive: Driver, line: str) -> None:
        # Only once the job runs: a short limit from the start would race the fake's start-up.
        if line.endswith("going silent"):
            drive.run.silence_limit = 0.3

    drive = Driver(tmp_path, tree, Script(after_go="silent"), on_line=shorten)
    with pytest.raises(ConnectionLostError) as info:
        drive()
    assert info.value.exit_code == ExitCode.CONNECTION_LOST
    assert Frame.GO in drive.link.kinds()


def test_sigint_during_the_job_is_forwarded_as_a_frame(tmp_path: Path, tree: Path,
                                                        sigint_guard: list[int]) -> None:
    def interrupt(_drive: Driver, line: str) -> None:
        if line.endswith("waiting for a signal"):
            signal.raise_signal(signal.SIGINT)  # a Ctrl-C on the controller

    drive = Driver(tmp_path, tree, Script(wait_signal=True), on_line=interrupt)
    outcome = drive()
    assert sigint_guard == []  # PeerRun took it
    assert (Frame.SIGNAL, str(int(signal.SIGINT)).encode()) in drive.link.received()
    assert f"fake: got signal {int(signal.SIGINT)}" in drive.lines
    assert outcome.exit_code == SIGNAL_BASE + signal.SIGINT


def test_returns_are_copied_back_after_a_failed_job(tmp_path: Path, tree: Path) -> None:
    script = Script(files={"target/report.txt": "made on the peer\n"},
                    result={"exit_code": 1, "outcome": "exit", "booking_kind": "cap"})
    drive = Driver(tmp_path, tree, script, returns=["target/report.txt"])
    outcome = drive()
    assert outcome.exit_code == 1  # the job's failure, not a --return one
    assert (tree / "sub" / "target" / "report.txt").read_text() == "made on the peer\n"


def test_sigint_during_the_sync_aborts_and_nothing_runs(tmp_path: Path, tree: Path,
                                                        sigint_guard: list[int]) -> None:
    drive = Driver(tmp_path, tree, Script(sync_error="rsync: never reached\n"))

    def interrupt() -> None:  # in the sync's thread, before its rsync starts
        signal.raise_signal(signal.SIGINT)
        drive.link.wait_for(Frame.ABORT)  # the sync "lasts" until the controller gave up on it

    drive.link.on_rsync = interrupt
    outcome = drive()
    assert sigint_guard == []
    assert (outcome.exit_code, outcome.outcome) == (SIGNAL_BASE + signal.SIGINT, "signal")
    assert outcome.message is not None and "nothing ran" in outcome.message
    assert drive.link.kinds() == [Frame.SPEC, Frame.ABORT]


def test_a_return_that_fails_after_a_good_job_is_252(tmp_path: Path, tree: Path) -> None:
    cause = 'rsync: [sender] link_stat "/peer/tree/sub/./out.bin" failed: No such file or directory (2)'
    script = Script(return_error=f"{cause}\nrsync error: some files/attrs were not transferred (code 23)\n")
    drive = Driver(tmp_path, tree, script, returns=["out.bin"])
    outcome = drive()
    assert (outcome.exit_code, outcome.outcome) == (ExitCode.SYNC_FAILED, ExitCode.SYNC_FAILED.outcome)
    assert f"error: --return out.bin with fake failed (rsync exit 23): {cause}" in drive.lines
