"""``hostrun workdir clean`` run by root over a tree another (real) user controls.

Whatever that user swaps in, root removes nothing outside the claimed directory: a claimed directory
(or a directory above it) replaced by a symbolic link at the worst moment, a symlinked owner file, or
an owner file naming root's session that the other user wrote. The "worst moment" is made
deterministic by hooking ``workdirs.openers``, which clean calls for every directory (the first
check) and again for the one it is about to remove (right before removing it); the swap itself is
done by the other user, for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatch.guards import workdirs
from tests.conftest import ON_CI, OtherUser
from tests.support.lockcli import Cli
from tests.support.lockcli import cli as cli  # the fixture

SESSION = "root-session"


def _tree(top: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(content)


def _snapshot(top: Path) -> dict[str, str]:
    """Every file below ``top`` with its content, and every directory (as "")."""
    found = {}
    for current, dirs, files in os.walk(top):
        for name in dirs:
            found[os.path.relpath(os.path.join(current, name), top) + "/"] = ""
        for name in files:
            path = os.path.join(current, name)
            found[os.path.relpath(path, top)] = Path(path).read_text()
    return found


@pytest.fixture
def victim(tmp_path: Path) -> Callable[[Path], dict[str, str]]:
    """A root tree that looks exactly like a claimed directory of root's session (the best bait)."""

    def make(top: Path) -> dict[str, str]:
        _tree(top, {"precious.txt": "root's data", "deep/er/file": "more of it"})
        workdirs.claim(str(top), "root's own other tree", SESSION)
        return _snapshot(top)

    return make


@pytest.mark.parametrize("moment", [1, 2], ids=["at-first-check", "right-before-removal"])
@pytest.mark.parametrize("swapped", ["build", "work"], ids=["claimed-dir", "dir-above-it"])
def test_a_directory_swapped_for_a_link_is_never_followed(other_user: OtherUser, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, victim: Any,
                                                           moment: int, swapped: str) -> None:
    work = other_user.home / "work"
    work.mkdir()
    other_user.chown(work)  # the other user's directory; root's claimed build tree inside it
    claimed = work / "build"
    workdirs.claim(str(claimed), "root's build", SESSION)
    _tree(claimed, {"out.o": "object", "sub/f": "y"})
    # The link's target: for "build" the victim itself; for "work" a directory holding a "build".
    target = tmp_path / "victim" if swapped == "build" else tmp_path / "victim-parent"
    victim_root = target if swapped == "build" else target / "build"
    before = victim(victim_root)

    real_openers = workdirs.openers
    calls: list[list[str]] = []

    def hooked(directories: list[str], *args: Any, **kw: Any) -> Any:
        calls.append(list(directories))
        if len(calls) == moment:  # the other user strikes now
            moved = work / (swapped + ".moved") if swapped == "build" else other_user.home / "work.moved"
            place = claimed if swapped == "build" else work
            other_user.run(["mv", str(place), str(moved)])
            other_user.run(["ln", "-s", str(target), str(place)])
        return real_openers(directories, *args, **kw)

    monkeypatch.setattr(workdirs, "openers", hooked)
    result = workdirs.clean(str(other_user.home), SESSION)
    assert len(calls) >= moment  # the hook did run at the moment under test
    assert _snapshot(victim_root) == before  # nothing of root's other tree went
    assert (work if swapped == "work" else claimed).is_symlink()
    (verdict,) = result["directories"]
    if moment == 1:  # swapped before clean opened it: nothing is removed, and it says why
        assert verdict["action"] == "kept"
        assert "symbolic link" in verdict["reason"]


def test_root_clean_in_another_users_tree_removes_only_its_own_claim(other_user: OtherUser,
                                                                     tmp_path: Path, victim: Any,
                                                                     cli: Cli) -> None:
    """End to end: what the other user planted before root's ``clean`` is left as it is."""
    work = other_user.home / "work"
    work.mkdir()
    elsewhere = tmp_path / "root-tree"
    before = victim(elsewhere)
    # An owner file naming root's session, written by the other user (as if they had made it).
    _tree(work / "bait", {".hostrun-owner": json.dumps({"session": SESSION, "created": 1.0}),
                          "theirs.txt": "the other user's file"})
    # An owner file that is a link to a real owner file of root's session.
    (work / "linked-owner").mkdir()
    (work / "linked-owner" / ".hostrun-owner").symlink_to(elsewhere / ".hostrun-owner")
    (work / "linked-owner" / "theirs.txt").write_text("also theirs")
    # A claimed-looking directory that is a link to root's tree.
    (work / "swapped").symlink_to(elsewhere)
    other_user.chown(work)
    # Root's own claim in that tree: the only thing that may go.
    workdirs.claim(str(work / "mine"), "root's build", SESSION)
    _tree(work / "mine", {"out.o": "x", "sub/f": "y"})
    planted = {name: _snapshot(work / name) for name in ("bait", "linked-owner")}

    done = cli.run("workdir", "clean", str(work), "--json", session=SESSION)
    assert done.returncode == 0, done.stderr
    verdicts = {Path(d["path"]).name: d for d in json.loads(done.stdout)["directories"]}
    assert verdicts["mine"]["action"] == "removed"
    assert not (work / "mine").exists()
    assert verdicts["bait"]["action"] == "kept"
    assert f"owned by uid {other_user.uid}" in verdicts["bait"]["reason"]
    assert "linked-owner" not in verdicts and "swapped" not in verdicts  # not claims at all
    for name, snapshot in planted.items():
        assert _snapshot(work / name) == snapshot, name
    assert (work / "swapped").is_symlink()
    assert _snapshot(elsewhere) == before
    # The other user's claim, however it names the session, is not root's to act on: a dry run says
    # the same, and the human form names the reason.
    dry = cli.run("workdir", "clean", str(work), "--dry-run", session=SESSION)
    assert f"kept {work / 'bait'}: its owner file is owned by uid {other_user.uid}" in dry.stdout


def test_an_owner_file_others_can_write_or_with_other_links_is_not_trusted(tmp_path: Path) -> None:
    """Root's own files, but ones another user could have changed (or a hard link to a claim
    elsewhere): not a claim clean acts on."""
    for name, change in (("writable", lambda p: p.chmod(0o666)),
                         ("linked", lambda p: os.link(p, tmp_path / "other-link"))):
        d = tmp_path / name
        workdirs.claim(str(d), "p", SESSION)
        (d / "f").write_text("keep")
        change(d / ".hostrun-owner")
    result = workdirs.clean(str(tmp_path), SESSION)
    reasons = {Path(d["path"]).name: (d["action"], d["reason"]) for d in result["directories"]}
    assert reasons["writable"] == ("kept", "its owner file is writable by others; not trusted")
    assert reasons["linked"] == ("kept", "its owner file has other hard links; not trusted")
    assert (tmp_path / "writable" / "f").exists() and (tmp_path / "linked" / "f").exists()


def test_removal_stays_inside_through_links_and_stops_at_mount_points(tmp_path: Path) -> None:
    """Links inside a claimed directory are removed, never followed; a mount point inside keeps it."""
    outside = tmp_path / "outside"
    _tree(outside, {"a": "1", "d/b": "2"})
    mine = tmp_path / "root" / "mine"
    workdirs.claim(str(mine), "p", SESSION)
    _tree(mine, {"x/y/z": "3"})
    (mine / "x" / "to-dir").symlink_to(outside)
    (mine / "to-file").symlink_to(outside / "a")
    result = workdirs.clean(str(tmp_path / "root"), SESSION)
    assert [d["action"] for d in result["directories"]] == ["removed"]
    assert not mine.exists()
    assert _snapshot(outside) == {"a": "1", "d/": "", "d/b": "2"}


@pytest.mark.system  # mounts a tmpfs: root, though it uses no system fixture
def test_a_mount_point_inside_keeps_the_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        problem = "mounting a tmpfs needs root and mount(8)"
        if ON_CI:
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)  # only off CI: with CI=true the line above fails instead
    mine = tmp_path / "root" / "mine"
    workdirs.claim(str(mine), "p", SESSION)
    (mine / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(mine / "mnt")], check=True)
    try:
        (mine / "mnt" / "kept").write_text("on the mount")
        (verdict,) = workdirs.clean(str(tmp_path / "root"), SESSION)["directories"]
        assert verdict["action"] == "kept"
        assert verdict["reason"] == f"it contains a mount point, {mine / 'mnt'}"
        assert (mine / "mnt" / "kept").exists()
    finally:
        subprocess.run(["umount", str(mine / "mnt")], check=True)


def test_a_subdirectory_swapped_for_a_link_during_removal_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: Any) -> None:
    """The swap comes while the tree is being removed: the link is refused, not descended into."""
    from dispatch.guards import fdtree

    before = victim(tmp_path / "victim")
    mine = tmp_path / "root" / "mine"
    workdirs.claim(str(mine), "p", SESSION)
    _tree(mine, {"sub/inner/f": "x"})
    real_open_child = fdtree._open_child

    def swapping(parent_fd: int, name: str, seen: os.stat_result, dev: int) -> int:
        if name == "inner":  # listed and stat'ed as a directory; now a link takes its place
            os.rename(mine / "sub" / "inner", mine / "inner.moved")
            (mine / "sub" / "inner").symlink_to(tmp_path / "victim")
        return real_open_child(parent_fd, name, seen, dev)

    monkeypatch.setattr(fdtree, "_open_child", swapping)
    (verdict,) = workdirs.clean(str(tmp_path / "root"), SESSION)["directories"]
    assert verdict["action"] == "kept" and verdict["reason"].startswith("could not remove it: ")
    assert _snapshot(tmp_path / "victim") == before
    assert (mine / ".hostrun-owner").exists()  # still claimed: the next clean tries again


def test_an_owner_file_moved_up_claims_nothing_there(other_user: OtherUser, tmp_path: Path,
                                                     cli: Cli) -> None:
    """root claims ``scratch/shared-build``, a directory the other user made in a sticky
    world-writable ``scratch``; the other user moves root's owner file up into ``scratch``. root's
    ``clean scratch`` must remove neither ``scratch`` (a third party's file is there) nor the
    other user's ``shared-build``: the owner file names the directory it was written for (device and
    inode), and a directory someone else owns in a world-writable parent is theirs to remove.

    One move, not a race in a loop: the owner file is read through the descriptor of the directory
    it sits in and compared with ``fstat`` of that same descriptor, so which directory it claims
    does not depend on timing (and once it sits in the sticky ``scratch``, root's file cannot be
    moved again by the other user). Before, the one move was enough: root's clean printed "removed"
    for ``scratch`` and the third party's file was gone."""
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="hostrun-scratch-", dir="/tmp"))
    try:
        os.chmod(scratch, 0o1777)
        third = scratch / "third-party.txt"
        third.write_text("someone else's work")
        build = scratch / "shared-build"
        other_user.run(["mkdir", "-m", "755", str(build)])
        done = cli.run("workdir", "claim", str(build), "--purpose", "shared build", session=SESSION)
        assert done.returncode == 0, done.stderr
        other_user.run(["mv", str(build / ".hostrun-owner"), str(scratch / ".hostrun-owner")])
        done = cli.run("workdir", "clean", str(scratch), "--json", session=SESSION)
        assert done.returncode == 0, done.stderr
        verdicts = {d["path"]: d for d in json.loads(done.stdout)["directories"]}
        assert verdicts[str(scratch)]["action"] == "kept"
        assert "was written for another directory" in verdicts[str(scratch)]["reason"]
        assert third.read_text() == "someone else's work" and build.is_dir()
        # root's claim put back where it was (by root: the sticky bit stops the other user now):
        # the directory is the other user's, in a parent anyone can write, so root's clean keeps
        # it too and says why.
        os.rename(scratch / ".hostrun-owner", build / ".hostrun-owner")
        done = cli.run("workdir", "clean", str(scratch), "--json", session=SESSION)
        (kept,) = json.loads(done.stdout)["directories"]
        assert kept["action"] == "kept" and f"belongs to uid {other_user.uid}" in kept["reason"]
        assert build.is_dir()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_peer_work_directory_claim_names_its_directory(tmp_path: Path) -> None:
    """The Slurm login node's inline claim (``slurmlogin.MAKE_DIR``) writes the owner file
    ``workdirs`` reads and trusts: same session, and bound to its directory."""
    import sys

    from dispatch.hosts.slurm.login import MAKE_DIR

    target = tmp_path / "work"
    done = subprocess.run([sys.executable, "-c", MAKE_DIR, str(target), SESSION, "slurm work"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(target)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        owner, untrusted = workdirs.read_owner_at(fd)
    finally:
        os.close(fd)
    assert owner is not None and owner.session == SESSION and owner.purpose == "slurm work"
    assert untrusted is None


def test_the_inline_claim_writes_the_owner_file_workdirs_writes(tmp_path: Path) -> None:
    """``slurmlogin.MAKE_DIR`` cannot import ``workdirs`` on the login node, so it copies its owner
    format: the same fields and the same bytes as ``workdirs`` writes for the same owner, 0644.
    A field added to, or a format changed in, either one alone fails here."""
    import socket
    import sys

    from dispatch.guards import workdirowner
    from dispatch.hosts.slurm.login import MAKE_DIR

    target = tmp_path / "work"
    subprocess.run([sys.executable, "-c", MAKE_DIR, str(target), SESSION, "slurm work"],
                   capture_output=True, check=True)
    written = (target / workdirs.OWNER_FILE).read_bytes()
    data = json.loads(written)
    assert set(data) == {*workdirs.Owner._fields, "created_at"}
    owner = workdirs.Owner(**{field: data[field] for field in workdirs.Owner._fields})
    here = target.stat()
    assert owner == owner._replace(session=SESSION, purpose="slurm work", host=socket.gethostname(),
                                   user=workdirowner._user(), pid=os.getpid(), dir_dev=here.st_dev,
                                   dir_ino=here.st_ino)
    assert (target / workdirs.OWNER_FILE).stat().st_mode & 0o7777 == 0o644
    twin = tmp_path / "twin"
    twin.mkdir()
    workdirowner._write_owner(str(twin), owner)
    assert (twin / workdirs.OWNER_FILE).read_bytes() == written
