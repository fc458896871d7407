"""``hostrun lock DIR`` against a co-writer of DIR: a real second local user (fixture ``other_user``)
who owns DIR and plants whatever it likes at the names the lock uses, while root takes the lock.

The lock is meant for a directory several users write, so its files are planted ground. Before,
root's ``hostrun lock DIR -- true`` followed a symlink at ``DIR/.hostrun-lock`` and made its target
(``/etc/shadow`` in the report; a root file of the test's here) mode 0666, created a missing target
0666, hung on a FIFO at the record's name, and renamed a file the co-writer had planted at the
atomic writer's predictable temporary name into place as the record.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.guards import lock
from tests.conftest import OtherUser
from tests.support.lockcli import Cli
from tests.support.lockcli import cli as cli  # the fixture

RACE_RUNS = 25


@pytest.fixture
def shared_dir(other_user: OtherUser) -> Iterator[Path]:
    """DIR: the other user's directory (0755) under /tmp, which root, the victim here, locks."""
    d = Path(tempfile.mkdtemp(prefix="hostrun-lockdir-", dir="/tmp"))
    os.chown(d, other_user.uid, other_user.gid)
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A stand-in for ``/etc/shadow``: root's, mode 0600."""
    f = tmp_path / "shadow"
    f.write_text("root:$6$secret:19000:0:99999:7:::\n")
    os.chmod(f, 0o600)
    return f


def unchanged(path: Path, text: str = "root:$6$secret:19000:0:99999:7:::\n") -> None:
    st = os.lstat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, oct(st.st_mode)
    assert path.read_text() == text


def one_line_refusal(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("where", ["plain", "git"])
def test_a_planted_symlink_at_the_lock_file_is_refused_and_its_target_untouched(
        cli: Cli, other_user: OtherUser, shared_dir: Path, secret: Path, tmp_path: Path,
        where: str) -> None:
    """``ln -s /etc/shadow DIR/.hostrun-lock`` (or ``DIR/.git/hostrun-lock`` in a checkout): root's
    run is refused in one line, the command does not run, and the target keeps mode 0600."""
    if where == "git":
        other_user.run(["mkdir", str(shared_dir / ".git")])
        planted = shared_dir / ".git" / "hostrun-lock"
    else:
        planted = shared_dir / ".hostrun-lock"
    other_user.run(["ln", "-s", str(secret), str(planted)])
    marker = tmp_path / "ran"
    proc = cli.run("lock", str(shared_dir), "--", "touch", str(marker))
    one_line_refusal(proc, str(planted), "symbolic link", "nothing ran")
    assert not marker.exists()
    unchanged(secret)
    assert os.path.islink(planted)  # refused, not removed: it is theirs


def test_a_dangling_symlink_at_the_lock_file_creates_nothing_at_its_target(
        cli: Cli, other_user: OtherUser, shared_dir: Path, tmp_path: Path) -> None:
    """A link to a missing path in root's own directory: before, root created that file, 0666."""
    target = tmp_path / "cron.d-entry"
    other_user.run(["ln", "-s", str(target), str(shared_dir / ".hostrun-lock")])
    proc = cli.run("lock", str(shared_dir), "--", "true")
    one_line_refusal(proc, "symbolic link")
    assert not os.path.lexists(target)


def test_a_fifo_at_the_record_or_the_lock_file_never_hangs(
        cli: Cli, other_user: OtherUser, shared_dir: Path) -> None:
    """A FIFO at the record's name: before, reading the record blocked for ever (no writer), in a
    run and in ``--status``. Now a FIFO record names nobody, and a FIFO lock file is refused."""
    other_user.run(["mkfifo", str(shared_dir / ".hostrun-lock.json")])
    done = cli.run("lock", str(shared_dir), "--", "true", timeout=30)
    assert done.returncode == 0, done.stderr
    status = cli.run("lock", "--status", str(shared_dir), timeout=30)
    assert status.returncode == 0 and "is free" in status.stdout, (status.stdout, status.stderr)
    record = shared_dir / ".hostrun-lock.json"
    # The run renamed its own record over the FIFO and removed it on release (renaming over a
    # name follows nothing): whatever is left there is not the co-writer's FIFO.
    assert not os.path.lexists(record) or not stat.S_ISFIFO(os.lstat(record).st_mode)
    record.unlink(missing_ok=True)
    os.unlink(shared_dir / ".hostrun-lock")
    other_user.run(["mkfifo", str(shared_dir / ".hostrun-lock")])
    one_line_refusal(cli.run("lock", str(shared_dir), "--", "true", timeout=30), "a FIFO")


def test_the_lock_file_root_creates_is_a_plain_0644_file_others_can_lock(
        cli: Cli, other_user: OtherUser, shared_dir: Path) -> None:
    """Mode 0644 whatever the umask: the other users of DIR open it read-only to lock it (flock
    needs no write access), and nobody but its owner can write it."""
    proc = subprocess.run(["sh", "-c", 'umask 077; exec "$@"', "sh",
                           *cli.argv("lock", str(shared_dir), "--", "true")],
                          capture_output=True, text=True, timeout=60, env=cli.env("tester"))
    assert proc.returncode == 0, proc.stderr
    st = os.lstat(shared_dir / ".hostrun-lock")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')")
    took = other_user.run(["/usr/bin/python3", "-c", probe,
                           str(shared_dir / ".hostrun-lock")])
    assert took.stdout.strip() == "locked"


def test_files_planted_at_the_record_writers_temporary_names_never_become_the_record(
        cli: Cli, other_user: OtherUser, shared_dir: Path, tmp_path: Path) -> None:
    """The atomic writer used ``RECORD.<pid>.tmp``, opened without ``O_EXCL``: a co-writer who
    plants files of its own at the next few hundred pids' names had root write the record into one
    of them and rename it into place, so the record was theirs to rewrite (and with hard links
    allowed, root would truncate and chmod whatever file they linked). Now the name is unguessable
    and created exclusively: the record root leaves is root's own file, none of the planted ones."""
    record = shared_dir / ".hostrun-lock.json"
    with open("/proc/sys/kernel/ns_last_pid") as fh:
        last = int(fh.read())
    # One process plants them all (a shell loop forking chmod would use up the pids it plants).
    plant = ("import os, sys\n"
             "for pid in range(int(sys.argv[2]) + 1, int(sys.argv[2]) + 400):\n"
             "    fd = os.open(f'{sys.argv[1]}.{pid}.tmp', os.O_CREAT | os.O_WRONLY, 0o666)\n"
             "    os.fchmod(fd, 0o666); os.close(fd)\n")
    other_user.run(["/usr/bin/python3", "-c", plant, str(record), str(last)])
    planted = {os.lstat(p).st_ino for p in shared_dir.glob(".hostrun-lock.json.*.tmp")}
    assert len(planted) == 399
    holder = tmp_path / "holder"
    proc = cli.popen("lock", str(shared_dir), "--", "sh", "-c",
                     f"touch {holder}; while [ -e {holder} ]; do sleep 0.05; done",
                     stderr=tmp_path / "err")
    try:
        for _ in range(600):
            if holder.exists() and os.path.lexists(record):
                break
            if proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        st = os.lstat(record)
        assert st.st_uid == 0 and st.st_ino not in planted and stat.S_IMODE(st.st_mode) == 0o644
        assert lock.read_record(str(record)) is not None
        # None of the planted files was written or renamed into place (even for a moment: the
        # record is rewritten once the command starts, so its final inode alone proves little).
        left = {p.name: os.lstat(p) for p in shared_dir.glob(".hostrun-lock.json.*.tmp")}
        assert len(left) == 399 and all(s.st_size == 0 and s.st_uid == other_user.uid
                                        for s in left.values()), sorted(left)[:3]
    finally:
        holder.unlink(missing_ok=True)
        proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "err").read_text()


def test_a_co_writer_flipping_the_lock_files_never_gets_root_to_touch_its_target(
        cli: Cli, other_user: OtherUser, shared_dir: Path, secret: Path) -> None:
    """While root takes the lock again and again, the co-writer flips the lock file and the record
    between a symlink to root's secret, a FIFO, a file of its own and nothing, as fast as a shell
    loop can. Every run either runs or is refused in one line (exit 2); none hangs, none prints a
    traceback, and the secret keeps its mode and content."""
    lockf, record = shared_dir / ".hostrun-lock", shared_dir / ".hostrun-lock.json"
    loop = (f"cd {shared_dir}; while :; do "
            f"ln -sfn {secret} {lockf.name}; ln -sfn {secret} {record.name}; "
            f"rm -f {lockf.name} {record.name}; mkfifo {record.name}; : > {lockf.name}; "
            f"rm -f {lockf.name} {record.name}; done")
    flipper = subprocess.Popen(["sh", "-c", loop], user=other_user.uid, group=other_user.gid,
                               extra_groups=[], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(RACE_RUNS):
            proc = cli.run("lock", str(shared_dir), "--", "true", timeout=60)
            assert "Traceback" not in proc.stderr, proc.stderr
            assert proc.returncode in (0, 2), (proc.returncode, proc.stderr)
            if proc.returncode == 2:
                one_line_refusal(proc, str(shared_dir))
    finally:
        flipper.kill()
        flipper.wait()
    unchanged(secret)
