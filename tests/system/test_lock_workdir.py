"""The workspace lock (``hostrun lock``) and work-directory ownership (``hostrun workdir``).

Real processes throughout: contenders are real ``hostrun lock`` processes, a holder is SIGKILLed for
real, pid reuse is a live process with a recorded start time that differs from its real one, and
"open" means a real process with its cwd or an open file inside the directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.procinfo import start_time
from dispatch.guards import lock, workdirs
from tests.conftest import wait_for
from tests.support.lockcli import Cli
from tests.support.lockcli import cli as cli  # the fixture


@pytest.fixture
def background() -> Iterator[Any]:
    """Start helper processes (``sleep`` and the like); all killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kw)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def holder_script(tmp: Path, name: str) -> list[str]:
    """A command that says it started (writing its pid), then waits until the test releases it."""
    script = (f'echo $$ > "{tmp}/{name}.pid"; while [ ! -e "{tmp}/{name}.release" ]; do sleep 0.05; '
              f'done; echo {name} >> "{tmp}/order"')
    return ["sh", "-c", script]


def started(tmp: Path, name: str) -> int:
    return int(wait_for(lambda: (tmp / f"{name}.pid").exists() and (tmp / f"{name}.pid").read_text().strip()))


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# ---------------------------------------------------------------------------------------------------
# hostrun lock


def test_two_contenders_second_waits_naming_the_holder_then_runs(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    first = cli.popen("lock", str(work), "--", *holder_script(tmp_path, "A"), session="alpha",
                      stderr=tmp_path / "a.err")
    started(tmp_path, "A")
    second = cli.popen("lock", str(work), "--", "sh", "-c", f'echo B >> "{tmp_path}/order"',
                       session="beta", stderr=tmp_path / "b.err")
    # The waiter names the holder at once, then again every status_interval (0.5 s here).
    wait_for(lambda: text(tmp_path / "b.err").count(" holds ") >= 3)
    lines = [ln for ln in text(tmp_path / "b.err").splitlines() if " holds " in ln]
    assert lines[0].startswith(f"hostrun: session alpha, pid {first.pid} holds {work} since ")
    assert lines[0].endswith(f": sh -c '{holder_script(tmp_path, 'A')[2]}'")
    assert second.poll() is None and text(tmp_path / "order") == ""
    (tmp_path / "A.release").touch()
    assert first.wait(timeout=20) == 0
    assert second.wait(timeout=20) == 0
    assert text(tmp_path / "order") == "A\nB\n"
    assert not os.path.exists(lock.lock_paths(str(work)).record)  # released: no record left
    assert "took over" not in text(tmp_path / "b.err")


def test_holder_sigkilled_waiter_takes_over_promptly(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    first = cli.popen("lock", str(work), "--", *holder_script(tmp_path, "A"), session="alpha",
                      stderr=tmp_path / "a.err")
    orphan = started(tmp_path, "A")
    second = cli.popen("lock", str(work), "--", "sh", "-c", f'echo B >> "{tmp_path}/order"',
                       session="beta", stderr=tmp_path / "b.err")
    wait_for(lambda: " holds " in text(tmp_path / "b.err"))
    try:
        killed_at = time.monotonic()
        first.send_signal(signal.SIGKILL)
        assert second.wait(timeout=10) == 0
        assert time.monotonic() - killed_at < 3  # the kernel dropped the flock with the process
        err = text(tmp_path / "b.err")
        # (a zombie until this test reaps it: "has exited"; reaped: "is gone")
        assert (f"took over {work}: the recorded holder is gone (pid {first.pid} has exited)" in err
                or f"took over {work}: the recorded holder is gone (pid {first.pid} is gone)" in err)
        assert "session alpha" in err
        # The SIGKILLed holder's command was orphaned, not killed: the new holder is told.
        assert f"warning: its command, pid {orphan}, is still running" in err
        assert text(tmp_path / "order") == "B\n"
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_stale_record_with_reused_pid_is_taken_over(cli: Cli, tmp_path: Path, background: Any) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    live = background(["sleep", "60"])
    real_start = start_time(live.pid)
    assert real_start is not None
    paths = lock.lock_paths(str(work))
    # A record left by a crash, naming a pid that now belongs to another (live) process.
    lock.write_record(paths.record, lock.Holder(
        pid=live.pid, start=real_start - 7, session="ghost", command="make old", since=time.time() - 3600,
        host=os.uname().nodename, boot_id=lock.boot_id(), dir=paths.dir))
    status = json.loads(cli.run("lock", "--status", "--json", str(work)).stdout)
    assert status["state"] == "stale" and status["holder"]["session"] == "ghost"
    assert "now belongs to another process" in status["holder_gone"]
    done = cli.run("lock", "--wait", "5", str(work), "--", "touch", str(tmp_path / "ran"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()
    assert f"took over {work}: the recorded holder is gone (pid {live.pid} now belongs to another " \
           f"process (start time {real_start}, recorded {real_start - 7}))" in done.stderr
    assert "session ghost" in done.stderr and "make old" in done.stderr


def test_record_of_a_live_holder_is_respected_even_with_the_flock_free(cli: Cli, tmp_path: Path,
                                                                      background: Any) -> None:
    """The same live pid with its true start time is a holder: wait for it (the lock file was
    removed under it), and --wait gives up with 78 (nothing ran)."""
    work = tmp_path / "ws"
    work.mkdir()
    live = background(["sleep", "60"])
    paths = lock.lock_paths(str(work))
    lock.write_record(paths.record, lock.Holder(
        pid=live.pid, start=start_time(live.pid) or 0, session="keeper", command="make", since=time.time(),
        host=os.uname().nodename, boot_id=lock.boot_id(), dir=paths.dir))
    done = cli.run("lock", "--wait", "1", str(work), "--", "touch", str(tmp_path / "ran"))
    assert done.returncode == 78
    assert f"session keeper, pid {live.pid} holds {work}" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_wait_timeout_exits_78_without_running(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    first = cli.popen("lock", str(work), "--", *holder_script(tmp_path, "A"), session="alpha",
                      stderr=tmp_path / "a.err")
    started(tmp_path, "A")
    began = time.monotonic()
    done = cli.run("lock", "--wait", "1s", str(work), "--", "touch", str(tmp_path / "ran"), session="beta")
    elapsed = time.monotonic() - began
    assert done.returncode == 78  # nothing ran; 253 would say a job ran past its max runtime
    assert 1.0 <= elapsed < 10
    assert not (tmp_path / "ran").exists()
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hostrun: error: gave up after waiting 1 s (--wait) for {work}: session alpha, "
                           f"pid {first.pid} holds {work} since ")
    assert last.endswith("the command did not run")
    (tmp_path / "A.release").touch()
    assert first.wait(timeout=20) == 0


def test_status_human_and_json(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    free = cli.run("lock", "--status", str(work))
    assert free.returncode == 0 and free.stdout == f"{work} is free\n"
    first = cli.popen("lock", str(work), "--", *holder_script(tmp_path, "A"), session="alpha",
                      stderr=tmp_path / "a.err")
    child = started(tmp_path, "A")
    record = lock.lock_paths(str(work)).record
    wait_for(lambda: getattr(lock.read_record(record), "child", 0))  # the record names the command
    human = cli.run("lock", "--status", str(work))
    assert human.returncode == 0
    first_line, second_line = human.stdout.splitlines()
    assert first_line.startswith(f"session alpha, pid {first.pid} holds {work} since ")
    assert first_line.endswith(f": sh -c '{holder_script(tmp_path, 'A')[2]}'")
    assert second_line == f"  its command runs as pid {child}"
    data = json.loads(cli.run("lock", "--status", "--json", str(work)).stdout)
    assert data["state"] == "held" and data["flock_held"] is True and data["dir"] == str(work)
    assert data["lock_file"] == str(work / ".hostrun-lock")
    holder = data["holder"]
    assert holder["pid"] == first.pid and holder["session"] == "alpha" and holder["child"] == child
    assert holder["start"] == start_time(first.pid)
    assert holder["command"] == f"sh -c '{holder_script(tmp_path, 'A')[2]}'"
    assert data["holder_gone"] is None and data["command_running"] is True
    (tmp_path / "A.release").touch()
    assert first.wait(timeout=20) == 0
    after = json.loads(cli.run("lock", "--status", "--json", str(work)).stdout)
    assert after["state"] == "free" and after["holder"] is None


def test_status_takes_its_options_in_any_order(cli: Cli, tmp_path: Path) -> None:
    """``lock --status DIR --json`` as docs/cli.md and docs/guards.md write it (issue 27, item 2)."""
    work = tmp_path / "ws"
    work.mkdir()
    for words in (["--status", str(work), "--json"], ["--status", "--json", str(work)],
                  [str(work), "--status", "--json"], ["--json", str(work), "--status"]):
        done = cli.run("lock", *words)
        assert done.returncode == 0, (words, done.stderr)
        assert json.loads(done.stdout)["state"] == "free", words
    for words in (["--status", str(work), "true"], ["--status", str(work), "--", "true"],
                  ["--status", "--wait", "1s", str(work)], ["--status", str(work), "--bogus"]):
        refused = cli.run("lock", *words)
        assert refused.returncode == 2 and refused.stdout == "", (words, refused.stdout)
        assert len(refused.stderr.splitlines()) == 1, (words, refused.stderr)
    # Without "--", a --status after the command's first word is the command's own.
    passed = cli.run("lock", str(work), "sh", "-c", 'echo "$1"', "sh", "--status")
    assert passed.returncode == 0 and passed.stdout == "--status\n", passed.stderr


def test_exit_code_passes_through_and_the_lock_is_released(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    assert cli.run("lock", str(work), "--", "sh", "-c", "exit 7").returncode == 7
    assert cli.run("lock", str(work), "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    missing = cli.run("lock", str(work), "--", "no-such-command-hostrun")
    assert missing.returncode == 127 and "cannot run 'no-such-command-hostrun'" in missing.stderr
    assert cli.run("lock", str(work), "true").returncode == 0  # without "--" too
    assert json.loads(cli.run("lock", "--status", "--json", str(work)).stdout)["state"] == "free"
    assert cli.run("lock", str(work)).returncode == 2  # no command
    assert cli.run("lock", "--wait", "soon", str(work), "--", "true").returncode == 2
    assert cli.run("lock", str(tmp_path / "absent"), "--", "true").returncode == 2


def test_signals_are_forwarded_to_the_command(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    script = (f'trap \'echo got-$1 > "{tmp_path}/sig"; exit 5\' TERM; echo $$ > "{tmp_path}/C.pid"; '
              "while :; do sleep 0.05; done")
    proc = cli.popen("lock", str(work), "--", "sh", "-c", script, stderr=tmp_path / "c.err")
    started(tmp_path, "C")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 5  # the command's own exit status, after it handled SIGTERM
    assert text(tmp_path / "sig").startswith("got")


def test_nested_lock_of_the_same_dir_runs_inside_the_holder(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    inner = " ".join(cli.argv("lock", "--wait", "3", str(work), "--", "touch", str(tmp_path / "inner")))
    done = cli.run("lock", str(work), "--", "sh", "-c", inner)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "inner").exists()
    assert "is held by an enclosing 'hostrun lock'" in done.stderr


def test_lock_files_live_in_dot_git_of_a_checkout(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    paths = lock.lock_paths(str(tmp_path / "repo"))
    assert paths.lock == str(tmp_path / "repo" / ".git" / "hostrun-lock")
    assert paths.record == paths.lock + ".json"
    (tmp_path / "plain").mkdir()
    assert lock.lock_paths(str(tmp_path / "plain")).lock == str(tmp_path / "plain" / ".hostrun-lock")


# ---------------------------------------------------------------------------------------------------
# hostrun workdir


def listing(cli: Cli, root: Path, session: str | None = "tester") -> dict[str, Any]:
    done = cli.run("workdir", "list", str(root), "--json", session=session)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_claim_and_list_owner_purpose_age_size_and_open_by(cli: Cli, tmp_path: Path,
                                                            background: Any) -> None:
    root = tmp_path / "work"
    claimed = cli.run("workdir", "claim", str(root / "a"), "--purpose", "build A", session="s1")
    assert claimed.returncode == 0, claimed.stderr
    assert claimed.stdout == f"claimed {root / 'a'} for session s1: build A\n"
    assert cli.run("workdir", "claim", str(root / "b" / "c"), "--purpose", "bench C",
                   session="s2").returncode == 0
    (root / "unowned").mkdir()
    (root / "a" / "data.bin").write_bytes(os.urandom(300_000))
    (root / "b" / "c" / "log.txt").write_text("x" * 5000)
    owner_file = root / "a" / ".hostrun-owner"
    assert oct(owner_file.stat().st_mode & 0o777) == "0o644"
    assert json.loads(owner_file.read_text())["session"] == "s1"

    sleeper = background(["sleep", "60"], cwd=root / "a")
    with open(root / "b" / "c" / "log.txt", "rb") as fh:
        reader = background(["sleep", "60"], stdin=fh)
    wait_for(lambda: os.readlink(f"/proc/{reader.pid}/exe").endswith("sleep"))  # exec'd
    wait_for(lambda: os.readlink(f"/proc/{sleeper.pid}/exe").endswith("sleep"))
    time.sleep(0.2)
    data = listing(cli, root, session="s1")
    rows = {Path(d["path"]).relative_to(root).as_posix(): d for d in data["directories"]}
    assert set(rows) == {"a", "b/c"}
    a, c = rows["a"], rows["b/c"]
    assert a["session"] == "s1" and a["purpose"] == "build A" and a["mine"] is True
    assert c["session"] == "s2" and c["purpose"] == "bench C" and c["mine"] is False
    assert 0 <= a["age_s"] < 60 and a["host"] == os.uname().nodename
    assert a["size_bytes"] >= 300_000 and a["size_complete"] is True
    assert c["size_bytes"] >= 4096
    assert a["open"] is True
    assert {"pid": sleeper.pid, "comm": "sleep", "how": "cwd", "path": str(root / "a")} in a["open_by"]
    assert c["open"] is True
    assert {"pid": reader.pid, "comm": "sleep", "how": "fd 0", "path": str(root / "b" / "c" / "log.txt")} \
        in c["open_by"]
    assert data["unclaimed"] == [str(root / "unowned")]
    # The human table names the same things.
    human = cli.run("workdir", "list", str(root), session="s1")
    assert human.returncode == 0
    for piece in ("s1 (you)", "build A", "s2", "bench C", f"pid {sleeper.pid}", "cwd"):
        assert piece in human.stdout
    sleeper.kill()
    reader.kill()
    sleeper.wait()
    reader.wait()
    after = {Path(d["path"]).name: d for d in listing(cli, root)["directories"]}
    assert after["a"]["open"] is False and after["c"]["open"] is False


def test_claim_refuses_another_sessions_directory(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "w"
    assert cli.run("workdir", "claim", str(work), "--purpose", "mine", session="s1").returncode == 0
    before = (work / ".hostrun-owner").read_text()
    taken = cli.run("workdir", "claim", str(work), "--purpose", "theirs", session="s2")
    assert taken.returncode == 78
    assert "already claimed by session s1 (mine;" in taken.stderr
    assert (work / ".hostrun-owner").read_text() == before
    again = cli.run("workdir", "claim", str(work), "--purpose", "mine, renamed", session="s1")
    assert again.returncode == 0 and again.stdout.startswith("updated the claim on")
    owner = workdirs.read_owner(str(work))
    assert owner is not None and owner.purpose == "mine, renamed"
    assert owner.created == json.loads(before)["created"]


def test_claim_without_hostrun_session_uses_the_terminal_session(cli: Cli, tmp_path: Path) -> None:
    one = cli.run("workdir", "claim", str(tmp_path / "x"), "--purpose", "p", session=None)
    two = cli.run("workdir", "claim", str(tmp_path / "y"), "--purpose", "p", session=None)
    assert one.returncode == 0 and two.returncode == 0
    sid = os.getsid(0)
    expected = f"sid-{sid}-{start_time(sid) or 0}"
    x, y = workdirs.read_owner(str(tmp_path / "x")), workdirs.read_owner(str(tmp_path / "y"))
    assert x is not None and y is not None
    assert x.session == y.session == expected  # stable across calls from one session
    assert "no HOSTRUN_SESSION" in one.stderr
    # clean never guesses who is asking.
    refused = cli.run("workdir", "clean", str(tmp_path), session=None)
    assert refused.returncode == 2 and "HOSTRUN_SESSION" in refused.stderr
    assert (tmp_path / "x").exists() and (tmp_path / "y").exists()
    # Saying who you are explicitly is enough.
    done = cli.run("workdir", "clean", str(tmp_path), "--session", expected, session=None)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_clean_removes_only_own_idle_directories(cli: Cli, tmp_path: Path, background: Any) -> None:
    root = tmp_path / "work"
    for name, session in (("mine-idle", "me"), ("mine-open", "me"), ("mine-fd", "me"),
                          ("theirs", "other"), ("nest/mine-deep", "me"), ("mine-with-theirs", "me")):
        assert cli.run("workdir", "claim", str(root / name), "--purpose", f"p-{name}",
                       session=session).returncode == 0
        (root / name / "file.txt").write_text(name)
    assert cli.run("workdir", "claim", str(root / "mine-with-theirs" / "inner"), "--purpose", "inner",
                   session="other").returncode == 0
    (root / "unclaimed" / "sub").mkdir(parents=True)
    (root / "unclaimed" / "sub" / "f").write_text("keep me")
    cwd_holder = background(["sleep", "60"], cwd=root / "mine-open")
    with open(root / "mine-fd" / "file.txt", "rb") as fh:
        fd_holder = background(["sleep", "60"], stdin=fh)
    for proc in (cwd_holder, fd_holder):
        wait_for(lambda p=proc: os.readlink(f"/proc/{p.pid}/exe").endswith("sleep"))

    dry = cli.run("workdir", "clean", str(root), "--dry-run", "--json", session="me")
    assert dry.returncode == 0, dry.stderr
    planned = {Path(d["path"]).relative_to(root).as_posix(): d["action"]
               for d in json.loads(dry.stdout)["directories"]}
    assert planned == {"mine-idle": "would-remove", "nest/mine-deep": "would-remove", "mine-open": "kept",
                       "mine-fd": "kept", "theirs": "kept", "mine-with-theirs": "kept"}
    assert (root / "mine-idle").exists()  # a dry run removes nothing

    done = cli.run("workdir", "clean", str(root), session="me")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert not (root / "mine-idle").exists() and not (root / "nest" / "mine-deep").exists()
    assert (root / "nest").exists()  # only the claimed directory itself goes
    for kept in ("mine-open", "mine-fd", "theirs", "mine-with-theirs", "mine-with-theirs/inner",
                 "unclaimed/sub/f"):
        assert (root / kept).exists(), kept
    assert f"removed {root / 'mine-idle'} (session me: p-mine-idle)" in out
    assert f"kept {root / 'theirs'}: owned by session other (p-theirs; claimed " in out
    assert f"kept {root / 'mine-open'}: open: pid {cwd_holder.pid} (sleep) cwd" in out
    assert f"kept {root / 'mine-fd'}: open: pid {fd_holder.pid} (sleep) fd 0" in out
    assert (f"kept {root / 'mine-with-theirs'}: it contains {root / 'mine-with-theirs' / 'inner'}, "
            "claimed by session other") in out
    assert "left alone (unclaimed): unclaimed" in out

    # The other session's clean removes nothing of ours, even what is idle.
    theirs = cli.run("workdir", "clean", str(root), "--json", session="other")
    verdicts = {Path(d["path"]).name: d for d in json.loads(theirs.stdout)["directories"]}
    assert verdicts["theirs"]["action"] == "removed"
    assert verdicts["mine-open"]["action"] == "kept"
    assert verdicts["mine-open"]["reason"].startswith("owned by session me")
    assert (root / "mine-open").exists() and (root / "mine-fd").exists()

    # Once nothing has them open, ours go too; unclaimed ones never do.
    cwd_holder.kill()
    fd_holder.kill()
    cwd_holder.wait()
    fd_holder.wait()
    assert cli.run("workdir", "clean", str(root), session="me").returncode == 0
    assert not (root / "mine-open").exists() and not (root / "mine-fd").exists()
    assert (root / "mine-with-theirs" / "inner").exists()
    assert (root / "unclaimed" / "sub" / "f").read_text() == "keep me"


def test_agent_probe_claims_the_peer_work_dir_for_the_controller(tmp_path: Path, monkeypatch: Any,
                                                                 capsys: Any) -> None:
    from dispatch.agent import main as agentmain

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = tmp_path / "hostrun-work" / "tree-123"
    spec = {"probes": [], "workdir": str(target),
            "owner": {"session": "controller-1", "purpose": "hostrun --peer sync target of a:/src"}}
    assert agentmain.main(["probe", "--spec", json.dumps(spec)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["workdir"] == str(target)
    assert answer["workdir_owner"] == {"session": "controller-1", "claimed_now": True}
    owner = workdirs.read_owner(str(target))
    assert owner is not None and owner.session == "controller-1"
    assert owner.purpose == "hostrun --peer sync target of a:/src"
    # A second controller session syncing the same tree leaves the first claim in place.
    spec["owner"] = {"session": "controller-2", "purpose": "other"}
    assert agentmain.main(["probe", "--spec", json.dumps(spec)]) == 0
    assert json.loads(capsys.readouterr().out)["workdir_owner"] == {"session": "controller-1",
                                                                   "claimed_now": False}


def test_peer_sync_target_is_claimed_and_the_claim_survives_the_sync(hostrun: Any, peers: Any,
                                                                      tmp_path: Path) -> None:
    """A real ``--peer`` run: the agent claims the work directory for the controller's session, and
    ``rsync --delete`` neither removes that owner file nor sends the tree's own one."""
    from tests.support.peers import remote_tree, setup

    peer, tree = setup(hostrun, peers, tmp_path)
    assert workdirs.claim(str(tree), "the local checkout", "local-owner")[2]
    for _ in range(2):  # the second sync runs against a copy that already holds the owner file
        proc = hostrun.run("--peer", "-m", "64M", "--session", "ctl-7", "--", "true", cwd=tree)
        assert proc.returncode == 0, proc.stderr
    copy = remote_tree(peer)
    owner = workdirs.read_owner(str(copy))
    assert owner is not None and owner.session == "ctl-7"
    assert owner.purpose == f"hostrun --peer sync target of {os.uname().nodename}:{tree}"
    assert (copy / "README").exists()
    listed = workdirs.list_claimed(str(peer.home / "hostrun-work"), session="ctl-7")
    rows = [(d["path"], d["session"], d["mine"]) for d in listed["directories"]]
    assert rows == [(str(copy), "ctl-7", True)]


def test_the_note_on_hidden_processes_says_what_root_could_not_see() -> None:
    """A normal user is told root could inspect the others' processes; root, that it was refused
    even so (so running it as root would not help)."""
    user = workdirs.hidden_note(3, euid=1000)
    assert user.startswith("note: 3 processes could not be inspected") and "as root they can be" in user
    root = workdirs.hidden_note(3, euid=0)
    assert "even to root" in root and "as root they can be" not in root
