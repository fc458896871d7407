"""The walk that decides whether ``hostrun --peer`` rsyncs (dispatch/agent/treestate.py) reuses the
listings of directories that did not change (same inode, ctime, mtime and rules) and still stats
every file: no change may be missed because of it.

First the walk alone, each change against a walk with no listings to reuse; then end to end over a
real sshd peer with the real agent, after waiting out ``RACY_NS`` so that both sides really reuse
their listings (checked in the record and the manifest).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatch.agent import treestate
from dispatch.agent.treestate import MANIFEST, walk
from tests.conftest import Hostrun
from tests.support.peers import remote_tree, rsync_logger, setup, syncs


def make(root: Path) -> None:
    for rel, text in (("a/one.c", "one\n"), ("a/b/two.c", "two two\n"), ("a/b/c/three.c", "3\n"),
                      ("top.c", "top\n"), ("target/out.o", "built\n"), ("a/x.log", "log\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text("target/\n*.log\n")
    os.symlink("one.c", root / "a" / "link")


def same_size_edit(path: Path, text: str) -> None:
    """New content of the same size, its mtime in the same second as before (1 ns later)."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))


def retarget(link: Path, target: str) -> None:
    link.unlink()
    os.symlink(target, link)


def replace_dir(root: Path) -> None:
    """a/b/c swapped for another directory of the same name and the same files."""
    (root / "a" / "b" / "c2").mkdir()
    (root / "a" / "b" / "c2" / "three.c").write_text("3\n")
    os.rename(root / "a" / "b" / "c", root / "a" / "b" / "old")
    os.rename(root / "a" / "b" / "c2", root / "a" / "b" / "c")


CHANGES: dict[str, Callable[[Path], Any]] = {
    "a file created in a kept directory": lambda r: (r / "a" / "b" / "new.c").write_text("new\n"),
    "a file deleted": lambda r: (r / "a" / "b" / "c" / "three.c").unlink(),
    "an edit that keeps the size and the mtime's second": lambda r: same_size_edit(
        r / "a" / "b" / "two.c", "two TWO\n"),
    "a directory created": lambda r: (r / "a" / "b" / "c" / "d").mkdir(),
    "a directory replaced by another of the same name": replace_dir,
    "a symlink retargeted": lambda r: retarget(r / "a" / "link", "b/two.c"),
    "a mode changed": lambda r: os.chmod(r / "top.c", 0o600),
    "a .gitignore edited": lambda r: (r / ".gitignore").write_text("target/\n*.lo?\n"),
    "a .gitignore edited in place, same size and mtime second": lambda r: same_size_edit(
        r / ".gitignore", "target/\n*.xyz\n"),
    "a .gitignore added below": lambda r: (r / "a" / ".gitignore").write_text("one.c\n"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_is_seen_by_a_walk_that_reuses_listings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    monkeypatch.setattr(treestate, "RACY_NS", 0)  # listings kept at once (no 2 s wait)
    root = tmp_path / "t"
    make(root)
    time.sleep(0.01)  # past the coarse clock tick of the last change
    before = walk(str(root))
    assert before is not None and {"", "a/", "a/b/", "a/b/c/"} <= set(before.listings)
    again = walk(str(root), (), before)
    assert again is not None and again.same_as(before) and again.fresh == 0
    CHANGES[change](root)
    cached, cold = walk(str(root), (), before), walk(str(root))
    assert cached is not None and cold is not None
    assert cached.content == cold.content and cached.ignores.keys() == cold.ignores.keys()
    assert not cached.same_as(before)


def test_a_file_created_in_an_ignored_directory_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treestate, "RACY_NS", 0)
    root = tmp_path / "t"
    make(root)
    time.sleep(0.01)
    before = walk(str(root))
    assert before is not None
    (root / "target" / "more.o").write_text("built again\n")
    (root / "a" / "y.log").write_text("log\n")
    after = walk(str(root), (), before)
    assert after is not None and after.same_as(before)


def test_a_listing_read_just_after_its_directory_changed_is_not_kept(tmp_path: Path) -> None:
    """A change in the same clock tick as the read would leave the ctime as it was: such a listing
    is read again next time."""
    root = tmp_path / "t"
    make(root)
    walked = walk(str(root))
    assert walked is not None and walked.listings == {}
    (root / "a" / "b" / "late.c").write_text("late\n")
    again = walk(str(root), (), walked)
    assert again is not None and "a/b/late.c" in again.entries()


def test_a_state_file_of_another_format_or_python_is_no_state(tmp_path: Path) -> None:
    root = tmp_path / "t"
    make(root)
    walked = walk(str(root))
    assert walked is not None
    data = treestate.dumps({"token": "t"}, walked)
    loaded = treestate.loads(data)
    assert loaded is not None and loaded[0] == {"token": "t"} and loaded[1].same_as(walked)
    magic = b"hostrun-tree-state\n"
    tag, _, body = data[len(magic):].partition(b"\n")
    assert treestate.loads(magic + b"3 2.7\n" + body) is None
    assert treestate.loads(magic + tag + b"\n" + body[:-5]) is None
    assert treestate.loads(b"{not it") is None


def test_real_peer_reuses_listings_on_both_sides_and_misses_no_change(
        hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, top = setup(hostrun, peers, tmp_path)
    (top / "src" / "deep").mkdir()
    (top / "src" / "deep" / "a.txt").write_text("aaaa\n")
    os.symlink("main.txt", top / "src" / "link")
    env, log = rsync_logger(tmp_path)

    def peer_run(*argv: str) -> str:
        proc = hostrun.run("--peer", "-m", "64M", "--", *argv, cwd=top, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def kept_on_both_sides() -> None:
        """Wait out RACY_NS, then one run that syncs nothing and keeps the listings on both sides."""
        count = len(syncs(log))
        time.sleep(treestate.RACY_NS / 1e9 + 0.2)
        peer_run("true")
        assert len(syncs(log)) == count  # no rsync
        (record,) = (hostrun.state_dir / "peer-sync").iterdir()
        for data in (record.read_bytes(), (remote_tree(peer) / MANIFEST).read_bytes()):
            loaded = treestate.loads(data)
            assert loaded is not None and {"src/", "src/deep/"} <= set(loaded[1].listings)

    peer_run("true")
    assert syncs(log) == ["full"]
    kept_on_both_sides()
    same_size_edit(top / "src" / "main.txt", "fn MAIN\n")
    assert peer_run("cat", "src/main.txt") == "fn MAIN\n"
    (top / "src" / "deep" / "new.txt").write_text("new\n")
    assert peer_run("cat", "src/deep/new.txt") == "new\n"
    (top / "target" / "more.bin").write_text("ignored\n")
    peer_run("true")
    assert syncs(log) == ["full", "paths", "paths"]
    assert not (remote_tree(peer) / "target" / "more.bin").exists()
    kept_on_both_sides()
    (top / "src" / "deep" / "a.txt").unlink()
    peer_run("test", "!", "-e", "src/deep/a.txt")
    retarget(top / "src" / "link", "../README")
    assert peer_run("cat", "src/link") == "readme v1\n"
    assert syncs(log)[-2:] == ["full", "full"]
    kept_on_both_sides()
    # Jobs that write into the copy, in directories whose listings the agent reuses.
    # Same size, mtime back to its second (rsync gave it the tree's nanoseconds; now .000000000).
    peer_run("sh", "-c", "s=$(stat -c %Y src/main.txt); printf 'fn PEER' | dd of=src/main.txt "
                         "conv=notrunc status=none; touch -d @$s src/main.txt")
    assert peer_run("cat", "src/main.txt") == "fn MAIN\n"
    kept_on_both_sides()
    peer_run("sh", "-c", "echo stray > src/deep/stray.txt")
    peer_run("test", "!", "-e", "src/deep/stray.txt")
    kept_on_both_sides()
    peer_run("ln", "-sfn", "deep", "src/link")
    assert peer_run("cat", "src/link") == "readme v1\n"
    assert syncs(log)[-3:] == ["full", "full", "full"]
    peer_run("true")
    assert syncs(log)[-3:] == ["full", "full", "full"]


def test_names_that_are_not_utf8_survive_the_state_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treestate, "RACY_NS", 0)
    root = tmp_path / "t"
    make(root)
    odd = os.fsdecode(b"caf\xe9.c")
    (root / "a" / odd).write_text("latin-1 name\n")
    time.sleep(0.01)
    walked = walk(str(root))
    assert walked is not None and f"a/{odd}" in walked.entries()
    loaded = treestate.loads(treestate.dumps({}, walked))
    assert loaded is not None and loaded[1].same_as(walked)
    again = walk(str(root), (), loaded[1])
    assert again is not None and again.same_as(walked) and again.fresh == 0
    (root / "a" / odd).write_text("latin-1 name, longer\n")
    changed = walk(str(root), (), loaded[1])
    assert changed is not None and not changed.same_as(walked)
