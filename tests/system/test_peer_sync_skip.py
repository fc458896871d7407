"""Skip-if-unchanged sync (dispatch/hosts/ssh/syncstate.py, dispatch/agent/treestate.py) on the fake peer:
the real ``PeerRun``, the real agent-side copy check and manifest, the real rsync copying locally.

rsync is skipped only when this tree AND the peer's copy are as the last sync left them; a change
here of known files sends just them; anything else is the full rsync.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dispatch.agent import treestate
from dispatch.agent.frames import Frame
from dispatch.agent.treestate import MANIFEST, Walk, walk
from tests.conftest import Hostrun, OtherUser
from tests.support.fakepeer import Script
from tests.support.peers import remote_tree, rsync_logger, setup, syncs
from tests.support.phases import Driver, source_tree


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return source_tree(tmp_path, monkeypatch)


def run(tmp_path: Path, tree_dir: Path, script: Script | None = None) -> Driver:
    drive = Driver(tmp_path, tree_dir, script or Script())
    assert drive().exit_code == 0
    return drive


def how(drive: Driver) -> str:
    """What the run did: "skip", "paths" (--files-from) or "full" (--delete)."""
    if not drive.link.rsyncs:
        return "skip"
    (argv,) = drive.link.rsyncs
    return "paths" if "--files-from=-" in argv else "full"


def same(tree_dir: Path, copy: Path) -> None:
    """The copy holds exactly the tree's files (what the sync manages: here, all of them)."""
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and not p.name.startswith(".hostrun-")}
    assert files(copy) == files(tree_dir)


def test_nothing_changed_on_either_side_skips_rsync(tmp_path: Path, tree: Path) -> None:
    first = run(tmp_path, tree)
    assert how(first) == "full"
    second = run(tmp_path, tree)
    assert how(second) == "skip"
    # The fake's frame log is shared by both runs: the second go says nothing (no new sync).
    first_go, second_go = [p for k, p in second.link.received() if k == Frame.GO]
    assert json.loads(first_go)["token"] and second_go == b""
    same(tree, second.peer_tree)
    # The records are private: the peer's manifest, the controller's record in its 0700 directory.
    manifest = os.lstat(second.peer_tree / MANIFEST)
    assert stat.S_IMODE(manifest.st_mode) == 0o600
    records = tmp_path / "state" / "peer-sync"
    assert stat.S_IMODE(os.lstat(records).st_mode) == 0o700
    (record,) = records.iterdir()
    assert stat.S_IMODE(os.lstat(record).st_mode) == 0o600
    # Writing the manifest left the copy's top directory as rsync made it (the tree's time).
    assert os.stat(second.peer_tree).st_mtime_ns == os.stat(tree).st_mtime_ns


def test_a_job_that_edits_a_synced_file_on_the_peer_makes_the_next_run_sync_it(
        tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    edited = run(tmp_path, tree, Script(files={"main.c": "edited on the peer\n"}))
    assert (edited.peer_tree / "sub" / "main.c").read_text() == "edited on the peer\n"
    again = run(tmp_path, tree)
    assert how(again) == "full"
    same(tree, again.peer_tree)
    assert how(run(tmp_path, tree)) == "skip"


def test_a_job_that_adds_a_file_to_the_copy_makes_the_next_run_delete_it(
        tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    run(tmp_path, tree, Script(files={"stray.o": "new on the peer\n"}))
    again = run(tmp_path, tree)
    assert how(again) == "full"
    assert not (again.peer_tree / "sub" / "stray.o").exists()


def test_build_output_in_an_ignored_directory_on_the_peer_still_skips(
        tmp_path: Path, tree: Path) -> None:
    (tree / ".gitignore").write_text("target/\n*.log\n")
    run(tmp_path, tree)
    run(tmp_path, tree, Script(files={"target/app": "built\n", "build.log": "log\n"}))
    again = run(tmp_path, tree)
    assert how(again) == "skip"
    assert (again.peer_tree / "sub" / "target" / "app").read_text() == "built\n"


def test_files_changed_here_are_sent_alone_then_the_next_run_skips(tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    (tree / "sub" / "main.c").write_text("int main(void) { return 1; }\n")
    (tree / "sub" / "new.c").write_text("untracked, new\n")
    changed = run(tmp_path, tree)
    assert how(changed) == "paths"
    same(tree, changed.peer_tree)
    assert how(run(tmp_path, tree)) == "skip"


def test_a_file_changed_here_during_the_run_is_synced_next_time(tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    (tree / "sub" / "main.c").write_text("first edit\n")
    drive = Driver(tmp_path, tree, Script())

    def edit_again() -> None:  # after this tree's walk, as rsync starts
        (tree / "sub" / "main.c").write_text("second edit, during the sync, longer\n")

    drive.link.on_rsync = edit_again
    assert drive().exit_code == 0
    again = run(tmp_path, tree)
    assert how(again) != "skip"
    assert (again.peer_tree / "sub" / "main.c").read_text() == "second edit, during the sync, longer\n"


def test_a_file_deleted_here_is_deleted_there(tmp_path: Path, tree: Path) -> None:
    (tree / "sub" / "old.c").write_text("to be deleted\n")
    run(tmp_path, tree)
    (tree / "sub" / "old.c").unlink()
    again = run(tmp_path, tree)
    assert how(again) == "full"
    assert not (again.peer_tree / "sub" / "old.c").exists()
    same(tree, again.peer_tree)


def test_a_gitignore_change_syncs_what_it_no_longer_ignores(tmp_path: Path, tree: Path) -> None:
    (tree / ".gitignore").write_text("*.log\n")
    (tree / "sub" / "build.log").write_text("was ignored\n")
    first = run(tmp_path, tree)
    assert not (first.peer_tree / "sub" / "build.log").exists()
    (tree / ".gitignore").write_text("*.tmp\n")
    again = run(tmp_path, tree)
    assert how(again) == "full"
    assert (again.peer_tree / "sub" / "build.log").read_text() == "was ignored\n"


def test_a_change_to_an_ignored_file_here_still_skips(tmp_path: Path, tree: Path) -> None:
    (tree / ".gitignore").write_text("target/\n")
    (tree / "target").mkdir()
    (tree / "target" / "out").write_text("1\n")
    run(tmp_path, tree)
    (tree / "target" / "out").write_text("2, built here\n")
    assert how(run(tmp_path, tree)) == "skip"


def test_a_damaged_or_foreign_manifest_on_the_peer_means_the_full_sync(tmp_path: Path, tree: Path) -> None:
    first = run(tmp_path, tree)
    manifest = first.peer_tree / MANIFEST
    manifest.write_text("{not json")
    assert how(run(tmp_path, tree)) == "full"
    assert how(run(tmp_path, tree)) == "skip"
    os.chmod(manifest, 0o644)  # writable by no one else, but readable: not private, not trusted
    assert how(run(tmp_path, tree)) == "full"
    header, walked = treestate.loads((first.peer_tree / MANIFEST).read_bytes()) or ({}, None)
    assert walked is not None
    header["token"] = "someone-elses"
    (first.peer_tree / MANIFEST).unlink()
    (first.peer_tree / MANIFEST).write_bytes(treestate.dumps(header, walked))
    os.chmod(first.peer_tree / MANIFEST, 0o600)
    assert how(run(tmp_path, tree)) == "full"  # not the controller's last sync


def test_a_damaged_record_here_means_the_full_sync(tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    (record,) = (tmp_path / "state" / "peer-sync").iterdir()
    record.write_bytes(b"garbage")
    assert how(run(tmp_path, tree)) == "full"
    assert how(run(tmp_path, tree)) == "skip"


def test_a_failed_sync_leaves_no_record(tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    (tree / "sub" / "main.c").write_text("changed\n")
    failing = Driver(tmp_path, tree, Script(sync_error="rsync: boom\n"))
    try:
        failing()
    except Exception:
        pass
    assert list((tmp_path / "state" / "peer-sync").iterdir()) == []
    assert how(run(tmp_path, tree)) == "full"


def test_an_ignore_rule_the_walk_cannot_follow_never_sends_listed_paths(
        tmp_path: Path, tree: Path) -> None:
    """rsync's --files-from reads no .gitignore: with a rule the walk does not understand, a change
    here is the full sync, which leaves the ignored file where it is."""
    (tree / ".gitignore").write_text("sub/*.log\n")
    (tree / "sub" / "build.log").write_text("1\n")
    run(tmp_path, tree)
    (tree / "sub" / "build.log").write_text("2, still ignored\n")
    again = run(tmp_path, tree)
    assert how(again) == "full"
    assert not (again.peer_tree / "sub" / "build.log").exists()


# -- the same over a real sshd peer, with the real agent (tests/system/test_peer_run.py's set-up) --

def test_real_peer_skips_resyncs_what_the_job_edited_and_sends_only_changed_files(
        hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, top = setup(hostrun, peers, tmp_path)
    env, log = rsync_logger(tmp_path)

    def peer_run(*argv: str) -> str:
        proc = hostrun.run("--peer", "-m", "64M", "--", *argv, cwd=top, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    peer_run("true")
    assert syncs(log) == ["full"]
    copy = remote_tree(peer)
    assert stat.S_IMODE(os.lstat(copy / MANIFEST).st_mode) == 0o600
    peer_run("sh", "-c", "echo edited-on-the-peer > README")  # nothing changed: no rsync
    assert syncs(log) == ["full"]
    assert peer_run("cat", "README") == "readme v1\n"  # the copy was not clean: the full rsync
    assert syncs(log) == ["full", "full"]
    (top / "README").write_text("readme v2\n")
    assert peer_run("cat", "README") == "readme v2\n"
    assert syncs(log) == ["full", "full", "paths"]
    (top / ".gitignore").write_text("target/\n")  # debug.log no longer ignored
    assert peer_run("cat", "debug.log") == "ignored log\n"
    assert syncs(log) == ["full", "full", "paths", "full"]
    peer_run("true")
    assert syncs(log) == ["full", "full", "paths", "full"]


def test_a_manifest_or_record_another_user_owns_is_not_trusted(tmp_path: Path, tree: Path,
                                                              other_user: OtherUser) -> None:
    """0600 and well-formed, but not ours: as good as none (the full sync, then our own again)."""
    first = run(tmp_path, tree)
    other_user.chown(first.peer_tree / MANIFEST)
    assert how(run(tmp_path, tree)) == "full"
    assert os.lstat(first.peer_tree / MANIFEST).st_uid == os.getuid()  # replaced by ours
    assert how(run(tmp_path, tree)) == "skip"
    (record,) = (tmp_path / "state" / "peer-sync").iterdir()
    other_user.chown(record)
    assert how(run(tmp_path, tree)) == "full"
    assert how(run(tmp_path, tree)) == "skip"


def test_the_walk_excludes_only_what_rsync_surely_excludes(tmp_path: Path) -> None:
    """Plain names (with * and ?), anchored (/x) or directories only (x/): excluded as rsync does;
    anything else excludes nothing; a "!" line turns the .gitignore rules off."""
    root = tmp_path / "t"
    for rel in ("a.log", "src/b.log", "src/keep.c", "build/out", "src/build/out", "src/build2",
                "top/x", "src/top/x", "deep/sub/y.tmp", "data/z", ".git/HEAD", ".hostrun-owner",
                "weird/q"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text("*.log\nbuild/\n/top\n# comment\ndeep/sub\nwe?rd/\n")
    (root / "src" / ".gitignore").write_text("build?\n")
    walked = walk(str(root), ["/data/", "**/nothing"])
    assert walked is not None
    files = {rel for rel, entry in walked.entries().items() if entry[0] == "f"}
    assert files == {".gitignore", "src/.gitignore", "src/keep.c", "src/top/x", "deep/sub/y.tmp"}
    assert walked.exact is False  # "deep/sub" and "**/nothing" are not understood
    (root / "src" / ".gitignore").write_text("!keep.c\n")
    unruled = walk(str(root), ["/data/"])
    assert unruled is not None and "a.log" in unruled.entries() and "data/z" not in unruled.entries()
    assert not unruled.plain and not unruled.same_as(walked)


def test_changed_paths_too_long_for_the_go_frame_mean_the_full_sync(tmp_path: Path) -> None:
    from dispatch.agent.frames import MAX_PAYLOAD
    from dispatch.hosts.ssh import syncstate

    root = tmp_path / "t"
    (root / ("d" * 200)).mkdir(parents=True)
    names = [f"{'d' * 200}/{'n' * 200}{i:04d}" for i in range(900)]  # under MAX_PATHS, ~360 KB
    for name in names:
        (root / name).write_text("1")
    before = walk(str(root))
    assert before is not None
    record = syncstate.record_path(str(tmp_path), "peer", "tree")
    syncstate.save(record, "key", "token", before)
    for name in names:
        (root / name).write_text("22")
    after = walk(str(root))
    assert after is not None
    assert syncstate.MAX_PATHS_BYTES < 900 * 400 and syncstate.MAX_PATHS_BYTES < MAX_PAYLOAD
    clean = {"token": "token", "clean": True}
    assert syncstate.plan(syncstate.load(record), "key", after, clean) == ("full", [])
    top = f"{'d' * 200}/"
    one = names[0].rpartition("/")[2]
    one_changed = Walk(dict(before.content, **{top: (before.content[top][0], dict(
        before.content[top][1], **{one: after.content[top][1][one]}))}), {}, after.ignores, True)
    assert syncstate.plan(syncstate.load(record), "key", one_changed, clean) == ("paths", [names[0]])


def test_a_record_that_parses_but_makes_no_sense_means_the_full_sync(tmp_path: Path, tree: Path) -> None:
    run(tmp_path, tree)
    (record,) = (tmp_path / "state" / "peer-sync").iterdir()
    header, walked = treestate.loads(record.read_bytes()) or ({}, None)
    assert walked is not None
    walked.content["sub/"][1]["main.c"] = 2  # type: ignore[assignment]  # same token, nonsense
    record.write_bytes(treestate.dumps(header, walked))
    (tree / "sub" / "main.c").write_text("changed here\n")
    again = run(tmp_path, tree)
    assert how(again) == "full"
    same(tree, again.peer_tree)
