"""``dispatch.hosts.ssh.remotetree``: the one place the ssh peer and the Slurm login node take the tree,
the job's place in it, the name of its copy, an rsync failure's line and a failed ``--return``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatch.core.errors import SyncFailedError, UsageError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.outcome import Outcome
from dispatch.hosts.ssh.remotetree import (
    LOGIN_RSYNC,
    PEER_RETURN,
    PEER_SYNC,
    RETURN_FAILED,
    Limit,
    Rsync,
    job_place,
    pump_stdin,
    remote_tree_spec,
    returns_failed,
    rsync_failure,
    tree_id,
    work_claim,
)


def test_the_job_runs_at_the_same_place_in_the_copy(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "proj"
    (tree / "src" / "deep").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    monkeypatch.chdir(tree / "src" / "deep")
    assert job_place(None) == (str(tree), "src/deep")
    monkeypatch.chdir(tree)
    assert job_place(None) == (str(tree), "")
    monkeypatch.chdir(tree / "src")
    assert job_place(str(tree / "src")) == (str(tree / "src"), "")


def test_outside_the_tree_or_no_tree_is_a_usage_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(UsageError, match=r"outside the tree .*/a \(use --tree\)") as outside:
        job_place(str(tmp_path / "a"))
    assert outside.value.exit_code == ExitCode.USAGE
    with pytest.raises(UsageError, match=r"--tree .*/nope: not a directory"):
        job_place(str(tmp_path / "nope"))


def test_the_copy_has_a_stable_name_under_the_work_root(tmp_path: Path) -> None:
    name = tree_id(str(tmp_path / "proj"))
    assert name.startswith("proj-") and name == tree_id(str(tmp_path / "proj"))
    assert name != tree_id(str(tmp_path / "other" / "proj"))
    assert remote_tree_spec(None, str(tmp_path / "proj")) == f"~/hostrun-work/{name}"
    assert remote_tree_spec("/scratch/w/", str(tmp_path / "proj")) == f"/scratch/w/{name}"


def test_an_rsync_failure_names_its_first_complaint() -> None:
    err = rsync_failure("sync", "peer1", 23, "rsync: [sender] link_stat \"/x\" failed: No such file\n"
                                             "rsync error: some files could not be transferred (code 23)\n")
    assert isinstance(err, SyncFailedError) and err.exit_code == ExitCode.SYNC_FAILED
    assert str(err) == ('sync with peer1 failed (rsync exit 23): rsync: [sender] link_stat "/x" '
                        "failed: No such file")
    bare = rsync_failure("--return out", "c", 12, "")
    assert str(bare) == "--return out with c failed (rsync exit 12): exit 12"


def test_a_failed_return_turns_only_a_success_into_252() -> None:
    ok = Outcome(exit_code=0, outcome="exit", host="peer1", label="l", argv=["true"])
    returns_failed(ok)
    assert (ok.exit_code, ok.outcome, ok.message) == (252, "sync-failed", RETURN_FAILED)
    failed = Outcome(exit_code=3, outcome="exit", host="peer1", label="l", argv=["false"])
    returns_failed(failed)
    assert (failed.exit_code, failed.outcome, failed.message) == (3, "exit", None)


def test_the_timeout_rule_of_each_kind_and_direction() -> None:
    """What users see: a peer's sync unbounded, its --return 300 s; 3600 s with a login node."""
    assert PEER_SYNC.seconds is None
    assert PEER_RETURN == Limit(300.0, "no progress within")
    assert LOGIN_RSYNC == Limit(3600.0, "no end within")


def test_the_work_claim_names_the_session_and_whose_copy() -> None:
    claim = work_claim("/src/proj", "s1")
    assert claim == {"session": "s1",
                     "purpose": f"hostrun --peer sync target of {socket.gethostname()}:/src/proj"}
    assert work_claim("/src/proj", None)["session"]  # the fallback session


def _fake_rsync(code: str) -> Rsync:
    """An ``Rsync`` whose "rsync" is a Python one-liner; its options and args are its argv."""
    return Rsync("peer1", lambda options, args: [sys.executable, "-c", code, *options, *args], True)


def test_an_rsync_that_fails_or_overruns_is_one_252_line() -> None:
    failing = _fake_rsync("import sys; sys.stderr.write('rsync: nope\\n'); sys.exit(23)")
    with pytest.raises(SyncFailedError, match=r"^sync with peer1 failed \(rsync exit 23\): rsync: nope$"):
        failing.run(["a", "b"], "sync", PEER_SYNC)
    slow = _fake_rsync("import time; time.sleep(30)")
    with pytest.raises(SyncFailedError, match=r"^--return out with peer1: no progress within 0.2 s$"):
        slow.run(["a"], "--return out", Limit(0.2, "no progress within"))
    missing = Rsync("peer1", lambda options, args: ["/nonexistent/rsync"], True)
    with pytest.raises(SyncFailedError, match=r"^sync: cannot run rsync: No such file"):
        missing.run([], "sync", PEER_SYNC)


def test_an_unprotected_remote_path_is_refused_where_guarded() -> None:
    guarded = Rsync("c", lambda options, args: [sys.executable, "-c", "pass"], False,
                    guard=("login:", "the login node's shell"))
    with pytest.raises(SyncFailedError, match="cannot protect a remote path from the login node's shell"):
        guarded.run(["login:/w/a b"], "sync", LOGIN_RSYNC)
    guarded.run(["login:/w/plain", "/here/a b"], "sync", LOGIN_RSYNC)  # only remote paths count


def test_returns_are_each_tried_and_each_failure_said(tmp_path: Path) -> None:
    fails_on_b = _fake_rsync("import sys; sys.exit(23 if any(a.endswith('/./b') for a in sys.argv) else 0)")
    said: list[str] = []
    assert fails_on_b.bring_back(["a", "b", "c"], "peer1:/w", str(tmp_path), PEER_RETURN, said.append)
    assert said == ["error: --return b with peer1 failed (rsync exit 23): exit 23"]
    assert not fails_on_b.bring_back(["a", "c"], "peer1:/w", str(tmp_path), PEER_RETURN, said.append)


def test_stdin_is_pumped_until_eof_then_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    os.write(write, b"one two")
    os.close(write)
    saved = os.dup(0)
    os.dup2(read, 0)
    got: list[bytes] = []
    closed = threading.Event()
    try:
        pump_stdin(got.append, closed.set)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read)
    assert b"".join(got) == b"one two" and closed.is_set()

    def refuse(_data: bytes) -> None:
        raise BrokenPipeError
    read, write = os.pipe()
    os.write(write, b"x")
    saved = os.dup(0)
    os.dup2(read, 0)
    closed.clear()
    try:
        pump_stdin(refuse, closed.set)  # the session ended: the pump stops, close still runs
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read)
        os.close(write)
    assert closed.is_set()
