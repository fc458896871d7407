"""``hostrun --peer`` at its edges (issue 8): connection failures before the job started, rsync's
argument handling, hostrun SIGKILLed during the sync, non-UTF-8 arguments, very long argument lists.

Real sshd peers, real rsync and real cgroups, as in ``test_peer_run``. Where a test needs to see or
slow down what hostrun starts, it puts a wrapper first on hostrun's PATH that records its call and
``exec``s the real program, so the real ssh or rsync still does the work.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun, pid_alive, wait_for
from tests.support.peers import PY, peer_bookings, remote_tree, setup
from tests.support.sshd import descendants, free_port, keygen

REAL_SSH = shutil.which("ssh") or "/usr/bin/ssh"
REAL_RSYNC = shutil.which("rsync") or "/usr/bin/rsync"


def wrapper_bin(directory: Path, name: str, body: str) -> Path:
    """A directory holding one executable shell script ``name``, to put first on PATH."""
    directory.mkdir(exist_ok=True)
    script = directory / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return directory


def counting_ssh(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``ssh`` logs one line per start and then runs the real ssh."""
    log = tmp_path / "ssh-calls.log"
    directory = wrapper_bin(tmp_path / "sshwrap", "ssh", f'echo call >> "{log}"\nexec {REAL_SSH} "$@"')
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}, log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("hostrun: error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


# -- item 7: failures before anything ran are 246 with the real cause, after the transport's retries --

def test_refused_port_is_246_after_retries(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    closed = free_port("127.0.0.2")  # nothing listens there: every connection is refused
    peer, tree = setup(hostrun, peers, tmp_path, host_extra=f"port = {closed}")
    env, log = counting_ssh(tmp_path)
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "ran", cwd=tree, env=env)
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    line = one_error_line(proc.stderr)
    assert "Connection refused" in line and "broke during the run" not in line, line
    assert calls(log) == 6  # the first try and 5 retries: a refused connection is transient
    assert not (tree / "ran").exists() and not (peer.home / "hostrun-work").exists()
    assert peer_bookings(peer) == []


def test_wrong_key_is_246_without_retry(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    (peer.root / "authorized_keys").write_text(keygen(tmp_path / "someone-else") + "\n")
    env, log = counting_ssh(tmp_path)
    proc = hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree, env=env)
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    line = one_error_line(proc.stderr)
    assert "authentication failed" in line and "Permission denied" in line, line
    assert calls(log) == 1  # retrying cannot help
    assert peer_bookings(peer) == []


def test_unknown_host_key_is_246_without_retry(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    peer.known_hosts.write_text("")
    env, log = counting_ssh(tmp_path)
    proc = hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree, env=env)
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    line = one_error_line(proc.stderr)
    assert "host key not known or changed" in line and "Host key verification failed" in line, line
    assert calls(log) == 1
    assert not (peer.home / "hostrun-work").exists()


def test_sshd_gone_after_a_run_is_246(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    """The first run leaves a master connection; sshd then stops (its sessions with it)."""
    peer, tree = setup(hostrun, peers, tmp_path)
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree).returncode == 0
    peer.stop()
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "ran-after-stop", cwd=tree)
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    line = one_error_line(proc.stderr)
    assert "Connection refused" in line and "broke during the run" not in line, line
    assert not (remote_tree(peer) / "ran-after-stop").exists()


# -- item 5: --return paths are never run through the peer's shell --

def test_return_path_with_shell_metacharacters_under_rsync_old_args(hostrun: Hostrun, peers: Any,
                                                                     tmp_path: Path) -> None:
    """RSYNC_OLD_ARGS=1 gives rsync 3.1.3-3.2.3's argument handling: unprotected, a remote path went
    through the peer's login shell. hostrun passes -s, so the name is only a name."""
    peer, tree = setup(hostrun, peers, tmp_path)
    marker = f"hostrun-pwned-{uuid.uuid4().hex[:8]}"
    name = f"a b;touch {marker}"
    env = {**os.environ, "RSYNC_OLD_ARGS": "1"}
    proc = hostrun.run("--peer", "-m", "64M", "--return", name, "--", "sh", "-c",
                       'printf made-on-peer > "$1"', "sh", name, cwd=tree, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tree / name).read_text() == "made-on-peer"  # brought back, under its literal name
    for where in (Path(pwd.getpwuid(os.getuid()).pw_dir), peer.home, remote_tree(peer), tree,
                  Path.cwd()):
        assert not (where / marker).exists(), f"the peer's shell ran 'touch {marker}' in {where}"


def test_return_path_refused_when_rsync_cannot_protect_it(hostrun: Hostrun, peers: Any,
                                                          tmp_path: Path) -> None:
    """FAKE rsync (this machine's rsync has -s): first on PATH, it behaves as the real one except that
    its --help lacks -s/--protect-args/--secluded-args, as an rsync older than 3.0 would."""
    peer, tree = setup(hostrun, peers, tmp_path)
    fake = wrapper_bin(tmp_path / "oldrsync", "rsync",
                       f'if [ "$1" = --help ]; then {REAL_RSYNC} --help | '
                       "grep -v -e --protect-args -e --secluded-args; exit 0; fi\n"
                       f'exec {REAL_RSYNC} "$@"')
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = hostrun.run("--peer", "-m", "64M", "--return", "a b;touch X", "--return", "plain.txt", "--",
                       "touch", "ran", cwd=tree, env=env)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    line = one_error_line(proc.stderr)
    assert "--return 'a b;touch X'" in line and "plain.txt" not in line, line
    assert not (peer.home / "hostrun-work").exists()  # nothing synced, nothing ran
    assert peer_bookings(peer) == []
    # A plain path is fine with that rsync.
    proc = hostrun.run("--peer", "-m", "64M", "--return", "plain.txt", "--", "touch", "plain.txt",
                       cwd=tree, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "plain.txt").exists()


# -- item 10: SIGKILL of hostrun during the sync leaves no rsync behind, here or on the peer --

def _argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[:-1]
    except OSError:
        return []


def test_sigkill_during_sync_leaves_no_rsync_here_or_on_the_peer(hostrun: Hostrun, peers: Any,
                                                                  tmp_path: Path) -> None:
    """The sync is slowed down by an rsync wrapper on hostrun's PATH that adds --bwlimit (the real
    rsync runs): 48 MiB of random data at 1 MB/s takes ~48 s, far longer than the bounds below."""
    peer, tree = setup(hostrun, peers, tmp_path)
    (tree / "big.bin").write_bytes(os.urandom(48 << 20))
    slow = wrapper_bin(tmp_path / "slowrsync", "rsync", f'exec {REAL_RSYNC} --bwlimit=1000 "$@"')
    env = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}
    proc = hostrun.popen("--peer", "-m", "64M", "--", "touch", "ran", cwd=tree, env=env)
    local: list[int] = []
    remote: list[int] = []

    def both_sides_syncing() -> bool:
        local[:] = [p for p in descendants(proc.pid) if _argv(p)[:1] in ([b"rsync"], [REAL_RSYNC.encode()])]
        local[:] = [*local, *(q for p in local for q in descendants(p))]
        remote[:] = [p for p in peer.pids() if b"--server" in _argv(p)[:3] and b"rsync" in _argv(p)[0]]
        return bool(local) and bool(remote)

    try:
        wait_for(both_sides_syncing, timeout=30)
        proc.kill()
        proc.wait()
        wait_for(lambda: not any(pid_alive(p) for p in local + remote), timeout=20)
        assert not (remote_tree(peer) / "ran").exists()
        # the agent runs as `python3 -I .cache/hostrun/agent-<name> run ...` (hosts.peer._RUN)
        wait_for(lambda: not [p for p in peer.pids() if b"hostrun/agent-" in b" ".join(_argv(p))],
                 timeout=20)
        assert peer_bookings(peer) == []
    finally:
        for pid in local + remote:  # only when the test failed: what this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- item 12: arguments that are not UTF-8 --

RAW = b"\xff\xfe"
DUMP = ("import os, sys; open(sys.argv[1], 'wb').write(b'\\0'.join(os.fsencode(a) for a in "
        "sys.argv[2:]))")


def test_non_utf8_arguments_run_byte_identical_here(hostrun: Hostrun, tmp_path: Path) -> None:
    out = tmp_path / "argv.bin"
    args = [os.fsdecode(RAW), os.fsdecode(b"caf\xe9 ok"), "plain"]
    proc = subprocess.run(hostrun.argv("-m", "64M", "--", PY, "-c", DUMP, str(out), *args),
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == b"\0".join([RAW, b"caf\xe9 ok", b"plain"])
    printed = subprocess.run(hostrun.argv("-m", "64M", "--", "printf", "%s", os.fsdecode(RAW)),
                             capture_output=True, timeout=60, check=False)
    assert printed.returncode == 0 and printed.stdout == RAW, printed.stderr
    # The program's own name as the label source: the default label is derived from it.
    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    program = os.path.join(os.fsencode(link_dir), RAW + b"-prog")
    os.symlink(shutil.which("true") or "/bin/true", program)
    named = subprocess.run(hostrun.argv("-m", "64M", "--", os.fsdecode(program), os.fsdecode(RAW)),
                           capture_output=True, timeout=60, check=False)
    assert named.returncode == 0, named.stderr
    assert b"Traceback" not in named.stderr + proc.stderr + printed.stderr
    import sqlite3

    con = sqlite3.connect(hostrun.state_dir / "ledger.sqlite3")
    try:
        labels = [row[0] for row in con.execute("SELECT label FROM peaks")]
    finally:
        con.close()
    assert any(label.startswith("\\xff\\xfe-prog-") for label in labels), labels


def test_non_utf8_arguments_run_byte_identical_on_the_peer(hostrun: Hostrun, peers: Any,
                                                           tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "argv.bin"
    args = [os.fsdecode(RAW), os.fsdecode(b"caf\xe9 \x80"), "it's", ""]
    proc = subprocess.run(hostrun.argv("--peer", "-m", "64M", "--", PY, "-c", DUMP, str(out), *args),
                          capture_output=True, timeout=60, check=False, cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert out.read_bytes() == b"\0".join([RAW, b"caf\xe9 \x80", b"it's", b""])


# -- item 14: long argument lists travel in the spec, not on ssh's command line --

COUNT = ("import hashlib, sys; open(sys.argv[1], 'w').write('%d %s' % (len(sys.argv) - 2, "
         "hashlib.sha256('\\0'.join(sys.argv[2:]).encode()).hexdigest()))")


def test_long_argument_list_runs_on_the_peer(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    """~1.2 MB of arguments: under both hosts' ARG_MAX (2 MiB here), far over one ssh argument's
    limit (128 KiB), where the spec used to travel."""
    import hashlib

    _, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "count.txt"
    args = [f"arg-{i:05d}-" + "x" * 90 for i in range(12000)]
    proc = hostrun.run("--peer", "-m", "64M", "--", PY, "-c", COUNT, str(out), *args, cwd=tree)
    assert proc.returncode == 0, proc.stderr
    digest = hashlib.sha256("\0".join(args).encode()).hexdigest()
    assert out.read_text() == f"{len(args)} {digest}"


def test_argument_list_over_the_peers_arg_max_is_126(hostrun: Hostrun, peers: Any,
                                                     tmp_path: Path) -> None:
    """3 MB of arguments: this hostrun is started with a 64 MiB stack limit (ARG_MAX 6 MiB), the peer's
    sshd has the usual 8 MiB (ARG_MAX 2 MiB), so the job's exec fails there: 126, as a local one."""
    peer, tree = setup(hostrun, peers, tmp_path)
    args = [f"arg-{i:05d}-" + "x" * 90 for i in range(30000)]

    def big_stack() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (64 << 20, 64 << 20))

    proc = subprocess.run(hostrun.argv("--peer", "-m", "64M", "--", PY, "-c", "pass", *args), cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False,
                          preexec_fn=big_stack)
    assert proc.returncode == 126, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Argument list too long" in proc.stderr
    assert peer_bookings(peer) == []

