"""``hostrun --peer -- CMD`` end to end: real sshd peers, real rsync, real cgroups on the peer side.

The peer is a real ``sshd`` on a loopback address (or inside a network namespace the test creates, to
cut the link); it has its own hostrun config, ledger and slice cgroup, and its work root is a
directory on this machine, so the tests can look at what the job did there. Teardown checks that
nothing is left running in the peer's slice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import MiB
from tests.conftest import Hostrun, _stop_masters, pid_alive, wait_for
from tests.support.fakerustup import FakeRustup
from tests.support.peers import PY, TOP, make_tree, peer_bookings, remote_tree, setup


def test_build_like_job_runs_on_the_peer_and_returns_its_result(hostrun: Hostrun, peers: Any,
                                                                 tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "r.json"
    build = ("mkdir -p target && cat ../src/main.txt > target/app && echo built-on-peer; "
             "echo to-stderr >&2; pwd")
    proc = hostrun.run("--peer", "-m", "100M", "--label", "build", "--return", "target/app",
                       "--result-file", str(out), "--", "sh", "-c", build, cwd=tree / "src")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "built-on-peer" and "to-stderr" in proc.stderr and "to-stderr" not in proc.stdout
    assert lines[1] == str(remote_tree(peer) / "src")  # same relative directory as here
    assert (tree / "src" / "target" / "app").read_text() == "fn main\n"  # brought back
    r = json.loads(out.read_text())
    assert r["host"] == "peer1" and r["exit_code"] == 0 and r["booking_kind"] == "cap"
    assert r["cap_bytes"] == 100 * MiB
    # The peak went to the peer's own peak table, never to ours.
    con = sqlite3.connect(peer.state_dir / "ledger.sqlite3")
    assert [row[0] for row in con.execute("SELECT label FROM peaks")] == ["build"]
    con.close()
    local_db = hostrun.state_dir / "ledger.sqlite3"
    if local_db.exists():
        con = sqlite3.connect(local_db)
        assert con.execute("SELECT COUNT(*) FROM peaks").fetchone()[0] == 0
        con.close()


def test_incremental_sync_changes_adds_deletes_and_ignores(hostrun: Hostrun, peers: Any,
                                                           tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree).returncode == 0
    copy = remote_tree(peer)
    assert (copy / "README").read_text() == "readme v1\n"
    assert not (copy / "target").exists() and not (copy / "debug.log").exists()
    assert not (copy / ".git").exists()
    (tree / "README").write_text("readme v2\n")
    (tree / "src" / "new.txt").write_text("added\n")
    (tree / "src" / "main.txt").unlink()
    (tree / "target" / "more.bin").write_text("still ignored\n")
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree).returncode == 0
    assert (copy / "README").read_text() == "readme v2\n"
    assert (copy / "src" / "new.txt").read_text() == "added\n"
    assert not (copy / "src" / "main.txt").exists()
    assert not (copy / "target").exists()


def test_exit_codes_pass_through_from_the_peer(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    for script, code in (("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", 128 + 15)):
        proc = hostrun.run("--peer", "-m", "64M", "--", "sh", "-c", script, cwd=tree)
        assert proc.returncode == code, (script, proc.stderr)


def test_own_cap_on_the_peer_is_250(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "r.json"
    proc = hostrun.run("--peer", "-m", "100M", "--result-file", str(out), "--", PY, "-c",
                       "x = bytearray(300 << 20)", cwd=tree)
    assert proc.returncode == ExitCode.OWN_CAP, proc.stderr
    r = json.loads(out.read_text())
    assert r["outcome"] == "own-cap" and r["host"] == "peer1" and r["counters"]["oom_kill"] >= 1


def test_slice_full_on_the_peer_is_254(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path, slice="300M")
    peer.write_peer_config("300M", extra='gamble_size = "50M"')
    ready = tmp_path / "ready"
    a = hostrun.popen("--peer", "--label", "a", "--", PY, "-c",
                      f"import time, pathlib; x = bytearray(200 << 20); x[::4096] = b'x' * len(x[::4096]);"
                      f" pathlib.Path({str(ready)!r}).touch(); time.sleep(4)", cwd=tree)
    wait_for(ready.exists, timeout=30)
    b = hostrun.run("--peer", "--label", "b", "--", PY, "-c",
                    "import time; x = bytearray(150 << 20); x[::4096] = b'x' * len(x[::4096]); "
                    "time.sleep(0.5)", cwd=tree)
    a.wait(timeout=60)
    assert sorted([a.returncode, b.returncode]) == [0, ExitCode.SLICE_FULL], (a.returncode, b.stderr)


def test_toolchain_mismatch_is_247_and_shows_the_lines(hostrun: Hostrun, peers: Any,
                                                       tmp_path: Path) -> None:
    """FAKE toolchains: scripts named rustc (and a tool found only on the peer) first on PATH."""
    def fake_bin(name: str, tools: dict[str, str]) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for tool, text in tools.items():
            (directory / tool).write_text(f"#!/bin/sh\nprintf '{text}'\n")
            (directory / tool).chmod(0o755)
        return directory

    there = fake_bin("peerbin", {"rustc": "rustc 1.99.0-peer (fake)\\nhost: x86_64\\n",
                                 "onlypeer": "v1\\n"})
    here = fake_bin("herebin", {"rustc": "rustc 1.95.0 (fake)\\nhost: x86_64\\n"})
    peer, tree = setup(hostrun, peers, tmp_path,
                       extra_env={"PATH": f"{there}:/usr/local/bin:/usr/bin:/bin"})
    env = {**os.environ, "PATH": f"{here}:{os.environ['PATH']}"}
    hostrun.configure(top='enable_across_machines = true\ntoolchain_probes = ["rustc -Vv"]',
                      peers=peer.host_table())
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "should-not-exist", cwd=tree, env=env)
    assert proc.returncode == ExitCode.TOOLCHAIN_MISMATCH, proc.stderr
    assert ("toolchain: rustc -Vv: here 'rustc 1.95.0 (fake)' / peer1 'rustc 1.99.0-peer (fake)'"
            in proc.stderr)
    assert "host: x86_64" not in proc.stderr  # equal lines are not shown
    work = peer.home / "hostrun-work"
    # nothing synced: at most the work directory's owner file (the probe claims what it creates)
    assert not work.exists() or all({p.name for p in d.iterdir()} <= {".hostrun-owner"}
                                    for d in work.iterdir())
    hostrun.configure(top='enable_across_machines = true\ntoolchain_probes = ["onlypeer -V", '
                          '"absent-everywhere -V"]', peers=peer.host_table())
    proc = hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree, env=env)
    assert proc.returncode == ExitCode.TOOLCHAIN_MISMATCH
    assert "onlypeer -V: found only peer1" in proc.stderr and "absent-everywhere" not in proc.stderr


def test_unwritable_work_root_is_252(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path, host_extra='work_root = "/proc/hostrun-cannot"')
    proc = hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree)
    assert proc.returncode == ExitCode.SYNC_FAILED
    assert "work directory" in proc.stderr


def test_argv_arrives_intact_on_the_peer(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "argv.json"
    tricky = ["a b", "it's", 'say "hi"', "line1\nline2", "$(touch /tmp/pwned-peer)", "`id`",
              "ünïcødé ✓", "*", ";", "&&", "--", ""]
    code = f"import json, sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))"
    proc = hostrun.run("--peer", "-m", "64M", "--", PY, "-c", code, *tricky, cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == tricky
    assert not Path("/tmp/pwned-peer").exists()


def test_ctrl_c_stops_the_remote_job(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    pidfile = tmp_path / "remote.pid"
    proc = hostrun.popen("--peer", "-m", "64M", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300",
                         cwd=tree)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30)
    pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    wait_for(lambda: not pid_alive(pid), timeout=10)
    wait_for(lambda: peer_bookings(peer) == [], timeout=10)


def test_sigkill_of_local_hostrun_stops_the_remote_job(hostrun: Hostrun, peers: Any,
                                                       tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    pidfile = tmp_path / "remote.pid"
    proc = hostrun.popen("--peer", "-m", "64M", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300",
                         cwd=tree)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30)
    pid = int(pidfile.read_text())
    assert peer_bookings(peer)
    proc.kill()
    proc.wait()
    started = time.monotonic()
    wait_for(lambda: not pid_alive(pid), timeout=40)
    assert time.monotonic() - started < 30  # heartbeats stop: the agent stops it within ~15 s
    wait_for(lambda: peer_bookings(peer) == [], timeout=15)


def test_second_job_queues_on_the_peers_ledger(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path, slice="300M")
    marks = tmp_path / "marks"
    first = hostrun.popen("--peer", "-m", "200M", "--label", "first", "--", "sh", "-c",
                          f"echo first-start >> {marks}; sleep 2; echo first-end >> {marks}", cwd=tree)
    wait_for(lambda: marks.exists(), timeout=30)
    second = hostrun.run("--peer", "-m", "200M", "--label", "second", "--", "sh", "-c",
                         f"echo second >> {marks}", cwd=tree)
    first.wait(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert marks.read_text().split() == ["first-start", "first-end", "second"]
    assert "peer1: waiting: 200 MiB needed" in second.stderr


def test_stdin_is_forwarded_only_when_asked(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    _, tree = setup(hostrun, peers, tmp_path)
    fed = hostrun.run("--peer", "--stdin", "-m", "64M", "--", "sh", "-c", "cat; echo done", cwd=tree,
                      input="line one\nline two\n")
    assert fed.returncode == 0 and fed.stdout == "line one\nline two\ndone\n"
    closed = hostrun.run("--peer", "-m", "64M", "--", "sh", "-c", "cat; echo done", cwd=tree,
                         input="not forwarded\n")
    assert closed.returncode == 0 and closed.stdout == "done\n"


def test_cut_link_is_251_and_nothing_is_left_on_the_peer(hostrun: Hostrun, peers: Any,
                                                         tmp_path: Path) -> None:
    from tests.support.sshd import NetNs

    ns = NetNs(7)
    ns.create()
    try:
        peer = peers("peer1", ns.address, netns=ns.name)
        hostrun.configure(top=TOP, peers=peer.host_table())
        tree = make_tree(tmp_path)
        pidfile = tmp_path / "remote.pid"
        proc = hostrun.popen("--peer", "-m", "64M", "--", "sh", "-c",
                             f"echo $$ > {pidfile}; exec sleep 300", cwd=tree)
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30)
        pid = int(pidfile.read_text())
        ns.cut()
        proc.wait(timeout=60)
        assert proc.returncode == ExitCode.CONNECTION_LOST, proc.stderr.read()  # type: ignore[union-attr]
        wait_for(lambda: not pid_alive(pid), timeout=30)
        wait_for(lambda: peer_bookings(peer) == [], timeout=15)
    finally:
        ns.delete()


RUSTC = 'enable_across_machines = true\ntoolchain_probes = ["rustc -Vv"]'


def rustup_pair(hostrun: Hostrun, peers: Any, tmp_path: Path, here: dict[str, str],
                there: dict[str, str]) -> tuple[Any, Path, FakeRustup, dict[str, str]]:
    """A FAKE rustup (tests/support/fakerustup.py) on each host, default toolchain "stable": the peer's on its
    login PATH, ours in the environment hostrun is run with (returned)."""
    ours = FakeRustup(tmp_path / "here", "stable", here)
    theirs = FakeRustup(tmp_path / "there", "stable", there)
    peer, tree = setup(hostrun, peers, tmp_path, extra_env=theirs.env("/usr/local/bin:/usr/bin:/bin"))
    hostrun.configure(top=RUSTC, peers=peer.host_table())
    env = {k: v for k, v in os.environ.items() if k != "RUSTUP_TOOLCHAIN"}
    return peer, tree, theirs, {**env, **ours.env(os.environ["PATH"])}


def test_switched_or_broken_rustup_toolchain_on_the_peer_is_247(hostrun: Hostrun, peers: Any,
                                                                 tmp_path: Path) -> None:
    """The peer's rustc proxy never changes; what it selects does (`rustup default`, a toolchain
    removed): each change is seen on the next run, not hidden by the cached probe output."""
    stable, beta = "rustc 1.80.0 (fake)", "rustc 1.81.0-beta (fake)"
    peer, tree, theirs, env = rustup_pair(hostrun, peers, tmp_path, {"stable": stable},
                                          {"stable": stable, "beta": beta})
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree, env=env).returncode == 0
    theirs.set_default("beta")
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "switched", cwd=tree, env=env)
    assert proc.returncode == ExitCode.TOOLCHAIN_MISMATCH, proc.stderr
    assert f"toolchain: rustc -Vv: here {stable!r} / peer1 {beta!r}" in proc.stderr
    assert not (remote_tree(peer) / "switched").exists()
    theirs.set_default("stable")
    assert hostrun.run("--peer", "-m", "64M", "--", "true", cwd=tree, env=env).returncode == 0
    shutil.rmtree(theirs.home / "toolchains" / "stable")
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "broken", cwd=tree, env=env)
    assert proc.returncode == ExitCode.TOOLCHAIN_MISMATCH, proc.stderr
    assert "peer1 \"error: toolchain 'stable' is not installed\"" in proc.stderr
    assert not (remote_tree(peer) / "broken").exists()


def test_rust_toolchain_file_in_the_tree_applies_on_the_peer_before_the_first_sync(
        hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    """The tree pins 1.82.0; the peer's default ("stable") prints the same version, but the peer
    lacks the pinned toolchain: the peer's probe must run in the job's directory of its copy, with the
    tree's rust-toolchain.toml there, although that copy has never been synced."""
    version = "rustc 1.82.0 (fake)"
    peer, tree, theirs, env = rustup_pair(hostrun, peers, tmp_path,
                                          {"stable": version, "1.82.0": version}, {"stable": version})
    (tree / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "1.82.0"\n')
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "pinned", cwd=tree / "src", env=env)
    assert proc.returncode == ExitCode.TOOLCHAIN_MISMATCH, proc.stderr
    assert f"toolchain: rustc -Vv: here {version!r} / peer1 \"error: toolchain '1.82.0' is not " \
           "installed\"" in proc.stderr
    assert not (remote_tree(peer) / "src" / "pinned").exists()
    theirs.install("1.82.0", version)
    proc = hostrun.run("--peer", "-m", "64M", "--", "rustc", "-V", cwd=tree / "src", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == version  # the job ran on the pinned toolchain there too


def test_a_default_cap_above_peer_memory_cap_gives_way_to_it(hostrun: Hostrun, peers: Any,
                                                             tmp_path: Path) -> None:
    """Without ``-m``, our ``default_cap`` for the peer above its ``peer_memory_cap``: the job runs
    there under ``peer_memory_cap`` (the one peer-cap rule), where ``--peer`` used to exit 249."""
    _peer, tree = setup(hostrun, peers, tmp_path,
                        host_extra='default_cap = "200M"\npeer_memory_cap = "100M"')
    out = tmp_path / "r.json"
    proc = hostrun.run("--peer", "--result-file", str(out), "--", "true", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert (r["host"], r["booking_kind"], r["cap_bytes"]) == ("peer1", "cap", 100 * MiB)


def test_a_state_dir_with_a_space_a_quote_and_a_percent_reaches_the_peer(hostrun: Hostrun, peers: Any,
                                                                       tmp_path: Path) -> None:
    """The ControlMaster socket lives in ``<state_dir>/ssh``: a name ssh's option parser would cut
    (space) or expand (%) must still work, not be blamed on the peer as 246. The directory is short
    (under /tmp) so the socket path stays within the 108-byte limit and the state dir's own ``ssh/``
    is used, not the /tmp fallback."""
    import tempfile

    odd = Path(tempfile.mkdtemp(prefix="st ate'q%", dir="/tmp"))
    try:
        hostrun.state_dir = odd / "state"
        _, tree = setup(hostrun, peers, tmp_path)
        proc = hostrun.run("--peer", "-m", "64M", "--", "cat", "README", cwd=tree)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "readme v1\n"
        assert [p.name for p in (odd / "state" / "ssh").iterdir()]  # its master socket is there
    finally:
        _stop_masters(odd / "state")
        shutil.rmtree(odd, ignore_errors=True)


def test_a_suspended_controller_gets_251_and_is_told_why(hostrun: Hostrun, peers: Any,
                                                         tmp_path: Path) -> None:
    """hostrun stopped (SIGSTOP, as Ctrl-Z stops it) for longer than the agent's silence limit while
    its job runs on the peer: the agent rightly stops the job; once resumed, hostrun exits 251 (the
    link was lost, for the job's purposes) and says what happened, instead of the job's 143."""
    from dispatch.agent.frames import SILENCE_LIMIT
    from dispatch.core.exitcodes import outcome_name

    peer, tree = setup(hostrun, peers, tmp_path)
    out = tmp_path / "r.json"
    proc = hostrun.popen("--peer", "-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                         "touch started; sleep 120", cwd=tree)
    def started() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"hostrun ended early: {proc.returncode} {proc.communicate()}")
        return any((t / "started").exists() for t in (peer.home / "hostrun-work").glob("*"))

    wait_for(started, timeout=60, interval=0.2)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(SILENCE_LIMIT + 6)  # the agent's watchdog stops the job after SILENCE_LIMIT
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.CONNECTION_LOST, stderr
    assert "the peer stopped the job: no word from this hostrun" in stderr
    r = json.loads(out.read_text())
    assert r["exit_code"] == 251 and r["outcome"] == outcome_name(251)
    assert peer_bookings(peer) == []


def test_requeue_travels_with_the_job_to_the_peer(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    """``--requeue`` reaches the peer's ledger: a first run there is booked as a gamble at half its
    cap (oom_score_adj 1000, seen from inside the job); without it, at its cap (0)."""
    _, tree = setup(hostrun, peers, tmp_path)
    show = [PY, "-c", "print(open('/proc/self/oom_score_adj').read().strip())"]
    for args, adj, kind in ((("--requeue",), "1000", "gamble"), ((), "0", "cap")):
        out = tmp_path / "r.json"
        proc = hostrun.run("--peer", "-m", "200M", "--label", f"rq{len(args)}", *args,
                           "--result-file", str(out), "--", *show, cwd=tree)
        assert proc.returncode == 0, proc.stderr
        r = json.loads(out.read_text())
        assert (proc.stdout.strip(), r["booking_kind"], r["requeued"]) == (adj, kind, 0)
        assert r["booked_bytes"] == (100 if args else 200) * MiB


def test_a_misspelt_backend_in_the_peers_own_file_is_refused_there(hostrun: Hostrun, peers: Any,
                                                                   tmp_path: Path) -> None:
    """The peer's agent reads the peer's own file without the controller's pydantic check: a
    misspelt ``backend`` there used to be taken for cgroup1 silently. The one backend registry
    refuses it on the peer too, naming the value and the known backends; nothing runs."""
    peer, tree = setup(hostrun, peers, tmp_path)
    text = peer.peer_config.read_text()
    peer.peer_config.write_text(text.replace("[hosts.local]\n", '[hosts.local]\nbackend = "cgroupv2"\n'))
    proc = hostrun.run("--peer", "-m", "64M", "--", "touch", "ran-on-the-peer", cwd=tree)
    assert proc.returncode == ExitCode.NOT_RUN, proc.stderr
    assert ("hosts.local.backend = 'cgroupv2' is not a cap backend (known: shared, systemd, cgroup2, "
            "cgroup1, none)") in proc.stderr, proc.stderr
    assert not list(peer.root.rglob("ran-on-the-peer"))
