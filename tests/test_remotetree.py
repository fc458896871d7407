"""``dispatch.hosts.remotetree``: the one place the ssh peer and the Slurm login node take the tree,
the job's place in it, the name of its copy, an rsync failure's line and a failed ``--return``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatch.core.errors import SyncFailedError, UsageError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.outcome import Outcome
from dispatch.hosts.remotetree import (
    RETURN_FAILED,
    job_place,
    remote_tree_spec,
    returns_failed,
    rsync_failure,
    tree_id,
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
