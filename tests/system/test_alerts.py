"""Alerts (issue 11): every kind from a real run (cgroups, the ledger, a real sshd peer), each with the
common fields; per-session read cursors; ``hostrun watch``.

Each kind is produced the way it happens: a job killed at its own cap (250) or in a full slice (254)
by the real kernel, a job waiting behind a real holder, a ``--peer`` run refused by a real sshd.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import Settings
from dispatch.core.units import MiB
from dispatch.local.alertlog import FIELDS, append, checked_figures, record
from dispatch.local.capacity import half_rule_cap
from dispatch.placement import alerts
from tests.conftest import Hostrun, wait_for
from tests.support.peers import setup
from tests.support.sshd import keygen

PY = sys.executable


def alert_records(hostrun: Hostrun) -> list[dict[str, Any]]:
    path = hostrun.state_dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_common(item: dict[str, Any]) -> None:
    missing = [f for f in FIELDS if f not in item]
    assert not missing, (missing, item)
    assert isinstance(item["pid"], int) and item["action"] and item["command"]


def test_own_cap_kill_alerts_with_the_half_rule_cap_once_per_session(hostrun: Hostrun) -> None:
    proc = hostrun.popen("-m", "100M", "--label", "hog", "--session", "s1", "--",
                         PY, "-c", "x = bytearray(300 << 20)")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.OWN_CAP, err
    (item,) = alert_records(hostrun)
    assert_common(item)
    assert item["kind"] == "own-cap" and item["host"] == "local" and item["label"] == "hog"
    assert item["session"] == "s1" and item["pid"] == proc.pid and item["exit_code"] == 250
    assert 90 * MiB <= item["peak"] <= 100 * MiB and item["cap"] == 100 * MiB
    assert item["suggested_cap"] == half_rule_cap(100 * MiB) == 512 * MiB
    assert item["action"] == ("hostrun -m 512M --label hog --session s1 -- "
                              f"{PY} -c 'x = bytearray(300 << 20)'")
    assert (hostrun.state_dir / "alerts.jsonl").stat().st_mode & 0o777 == 0o600
    # Delivered once to its session; another session does not see it.
    first = hostrun.run("alerts", "--session", "s1", "--unread")
    assert first.returncode == 0, first.stderr
    assert "own-cap [session s1]: job hog on local was killed at its own cap 100 MiB" in first.stdout
    assert "-m 512M" in first.stdout
    assert hostrun.run("alerts", "--session", "s1", "--unread").stdout == ""
    assert hostrun.run("alerts", "--session", "s2", "--unread", "--json").stdout.strip() == "[]"


def test_slice_full_kill_alerts_the_victim(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M", top='gamble_size = "50M"')
    ready = tmp_path / "big-ready"
    big = hostrun.popen("-m", "250M", "--label", "big", "--", PY, "-c",
                        f"import time, pathlib; x = bytearray(200 << 20); "
                        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(30)")
    try:
        wait_for(ready.exists, timeout=20)
        proc = hostrun.run("--label", "victim", "--", PY, "-c", "x = bytearray(150 << 20)",
                           env={**os.environ, "HOSTRUN_SESSION": "agent-7"})
        assert proc.returncode == ExitCode.SLICE_FULL, proc.stderr
    finally:
        big.terminate()
        big.wait(timeout=30)
    (item,) = [a for a in alert_records(hostrun) if a["label"] == "victim"]
    assert_common(item)
    assert item["kind"] == "slice-full" and item["session"] == "agent-7" and item["exit_code"] == 254
    assert item["action"].startswith("hostrun --label victim --session agent-7 -- ")


def test_long_wait_alerts_who_holds_the_room(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(slice="300M", top='alert_wait_after = "1s"')
    started, release = tmp_path / "started", tmp_path / "release"
    holder = hostrun.popen("-m", "250M", "--label", "holder", "--session", "builder", "--", "sh", "-c",
                           f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done")
    try:
        wait_for(started.exists, timeout=20)
        waiter = hostrun.popen("-m", "250M", "--label", "waiter", "--session", "agent", "--", "true")
        wait_for(lambda: any(a["kind"] == "waiting" for a in alert_records(hostrun)), timeout=30)
    finally:
        release.touch()
        holder.wait(timeout=30)
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0 and holder.returncode == 0
    (item,) = [a for a in alert_records(hostrun) if a["kind"] == "waiting"]  # once per wait
    assert_common(item)
    assert item["label"] == "waiter" and item["session"] == "agent" and item["pid"] == waiter.pid
    assert item["holders"] == [{"label": "holder", "session": "builder", "size": 250 * MiB,
                                "pid": holder.pid}]
    assert "the room is held by holder (builder, 250 MiB)" in item["message"]
    assert "alert: job waiter has waited" in err


def test_alert_file_that_cannot_be_written_is_one_warning_and_the_job_goes_on(hostrun: Hostrun,
                                                                             tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    hostrun.configure(top=f'alert_file = "{blocked}/alerts.jsonl"')
    proc = hostrun.run("-m", "100M", "--", PY, "-c", "x = bytearray(300 << 20)")
    assert proc.returncode == ExitCode.OWN_CAP
    warnings = [line for line in proc.stderr.splitlines() if "could not write the alert" in line]
    assert len(warnings) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_peer_that_refuses_alerts_peer_unreachable(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    (peer.root / "authorized_keys").write_text(keygen(tmp_path / "someone-else") + "\n")
    proc = hostrun.run("--peer", "--label", "remote", "--session", "s9", "-m", "64M", "--", "true",
                       cwd=tree)
    assert proc.returncode == ExitCode.PEER_UNREACHABLE, proc.stderr
    (item,) = alert_records(hostrun)
    assert_common(item)
    assert item["kind"] == "peer-unreachable" and item["host"] == "peer1" and item["session"] == "s9"
    assert "authentication failed" in item["error"]
    assert item["action"] == "hostrun -m 64M --label remote --session s9 -- true"  # its own -m kept


def test_peer_own_cap_is_alerted_by_the_controller(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    peer, tree = setup(hostrun, peers, tmp_path)
    # The job's interpreter by its path, the same on both sides (the peer is this machine): a bare
    # python3 is the login PATH's there, another version, and --peer would rightly refuse it (247).
    proc = hostrun.run("--peer", "--label", "hog", "-m", "100M", "--", sys.executable, "-c",
                       "x = bytearray(300 << 20)", cwd=tree)
    assert proc.returncode == ExitCode.OWN_CAP, proc.stderr
    (item,) = alert_records(hostrun)
    assert item["kind"] == "own-cap" and item["host"] == "peer1"
    assert item["action"].startswith(f"hostrun -m 512M --label hog --peer=peer1 -- {sys.executable}")
    assert not (peer.state_dir / "alerts.jsonl").exists()  # the peer's agent does not alert


# -- cursors --

def settings_for(tmp_path: Path) -> Settings:
    return Settings.default(state_dir=str(tmp_path / "state"))


def test_each_session_sees_its_alerts_once(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    path = settings.alerts_path
    append(path, record("own-cap", host="local", label="early-a", session="a", command="x",
                        action="y", message="m"))
    assert alerts.unread(settings, "b") == []  # b's cursor starts now
    append(path, record("own-cap", host="local", label="for-a", session="a", command="x",
                        action="y", message="m"))
    append(path, record("own-cap", host="local", label="for-b", session="b", command="x",
                        action="y", message="m"))
    append(path, record("waiting", host="local", label="for-all", session=None, command="x",
                        action="y", message="m"))
    # a had no cursor: everything addressed to it by name, and for-all only from its cursor's start
    assert [a["label"] for a in alerts.unread(settings, "a", mark=False)] == ["early-a", "for-a"]
    assert [a["label"] for a in alerts.unread(settings, "a")] == ["early-a", "for-a"]
    assert alerts.unread(settings, "a") == []
    assert [a["label"] for a in alerts.unread(settings, "b")] == ["for-b", "for-all"]
    assert alerts.unread(settings, "b") == []
    cursor = Path(alerts.cursor_path(settings, "b"))
    assert cursor.stat().st_mode & 0o777 == 0o600 and cursor.parent.stat().st_mode & 0o777 == 0o700
    # rotation: the new file is read from its start
    os.rename(path, path + ".1")
    append(path, record("own-cap", host="local", label="after-rotation", session="b", command="x",
                        action="y", message="m"))
    assert [a["label"] for a in alerts.unread(settings, "b")] == ["after-rotation"]


def test_session_names_with_slashes_stay_in_the_cursor_directory(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    path = Path(alerts.cursor_path(settings, "../../etc/x"))
    assert path.parent == tmp_path / "state" / "alert-cursors"
    alerts.unread(settings, "../../etc/x")
    assert path.exists()


def test_bad_session_name_is_usage_error(hostrun: Hostrun) -> None:
    proc = hostrun.run("alerts", "--unread", env={**os.environ, "HOSTRUN_SESSION": "a\x1bb"})
    assert proc.returncode == 2 and "control character" in proc.stderr and "Traceback" not in proc.stderr
    proc = hostrun.run("alerts", "--ack", env={k: v for k, v in os.environ.items()
                                               if k != "HOSTRUN_SESSION"})
    assert proc.returncode == 2 and "--ack needs a session" in proc.stderr


def test_concurrent_readers_of_one_session_split_never_duplicate(hostrun: Hostrun) -> None:
    path = str(hostrun.state_dir / "alerts.jsonl")
    hostrun.run("alerts", "--session", "s", "--ack")  # the cursor exists: for-all alerts count
    total = 120
    done = threading.Event()

    def writer() -> None:
        for i in range(total):
            append(path, record("waiting", host="local", label=f"job{i}", session="s" if i % 2 else None,
                                command="x", action="y", message="m"))
        done.set()

    def reader(out: list[str]) -> None:
        while True:
            finished = done.is_set()
            proc = hostrun.run("alerts", "--session", "s", "--unread", "--json")
            assert proc.returncode == 0, proc.stderr
            out.extend(a["label"] for a in json.loads(proc.stdout))
            if finished:
                return

    got: list[list[str]] = [[], []]
    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == sorted(f"job{i}" for i in range(total))


# -- watch --

class Lines:
    """A process's stream read in a thread, so a test can wait for a line with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def test_watch_exec_gets_each_alert_on_stdin_through_rotation(hostrun: Hostrun, tmp_path: Path) -> None:
    got = tmp_path / "got.jsonl"
    path = str(hostrun.state_dir / "alerts.jsonl")
    append(path, record("own-cap", host="local", label="old", session=None, command="x", action="y",
                        message="before the watch"))
    watch = hostrun.popen("watch", "--exec", f"sh -c 'cat >> {got}'")
    err = Lines(watch.stderr)
    try:
        wait_for(lambda: err.has("watching"), timeout=30)

        def labels() -> list[str]:
            return [json.loads(line)["label"] for line in got.read_text().splitlines()] \
                if got.exists() else []

        append(path, record("own-cap", host="local", label="one", session="s", command="x",
                            action="y", message="m"))
        wait_for(lambda: labels() == ["one"], timeout=30)
        os.rename(path, path + ".1")  # rotated: a new file under the name
        append(path, record("waiting", host="local", label="two", session=None, command="x",
                            action="y", message="a longer message, so truncation shows" * 3))
        wait_for(lambda: labels() == ["one", "two"], timeout=30)
        os.truncate(path, 0)  # copy-truncate rotation
        append(path, record("slice-full", host="local", label="three", session=None, command="x",
                            action="y", message="m"))
        wait_for(lambda: labels() == ["one", "two", "three"], timeout=30)
        # one per state directory
        second = hostrun.run("watch")
        assert second.returncode == ExitCode.NOT_RUN, second.stderr
        assert f"another 'hostrun watch' (pid {watch.pid})" in second.stderr
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=30)
    assert watch.returncode == 0
    assert "Traceback" not in "".join(err.lines)


def test_watch_prints_alerts_for_its_session_escaped(hostrun: Hostrun) -> None:
    path = str(hostrun.state_dir / "alerts.jsonl")
    watch = hostrun.popen("watch", "--session", "mine")
    err, out = Lines(watch.stderr), Lines(watch.stdout)
    try:
        wait_for(lambda: err.has("watching"), timeout=30)
        append(path, record("own-cap", host="local", label="theirs", session="other", command="x",
                            action="y", message="not for me"))
        append(path, record("own-cap", host="local", label="evil", session="mine", command="x",
                            action="y", message="forged\n\x1b[31mhostrun: exit 0"))
        wait_for(lambda: out.has("forged"), timeout=30)
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=30)
    assert watch.returncode == 0
    (line,) = out.lines
    assert "forged\\n\\x1b[31mhostrun: exit 0" in line and "not for me" not in "".join(out.lines)


def test_watch_exec_that_fails_is_a_warning_and_watch_goes_on(hostrun: Hostrun, tmp_path: Path) -> None:
    path = str(hostrun.state_dir / "alerts.jsonl")
    got = tmp_path / "got"
    watch = hostrun.popen("watch", "--exec", f"sh -c 'cat >> {got}; exit 3'")
    err = Lines(watch.stderr)
    try:
        wait_for(lambda: err.has("watching"), timeout=30)
        for label in ("a", "b"):
            append(path, record("own-cap", host="local", label=label, session=None, command="x",
                                action="y", message="m"))
        wait_for(lambda: got.exists() and len(got.read_text().splitlines()) == 2, timeout=30)
        wait_for(lambda: sum("exited 3" in line for line in err.lines) == 2, timeout=30)
    finally:
        watch.terminate()
        watch.wait(timeout=30)
    assert watch.returncode == 0


def test_watch_bad_exec_is_usage_error(hostrun: Hostrun) -> None:
    proc = hostrun.run("watch", "--exec", "sh -c 'unclosed")
    assert proc.returncode == 2 and "--exec" in proc.stderr and "Traceback" not in proc.stderr


def test_a_long_wait_on_the_peer_is_alerted_by_the_controller(hostrun: Hostrun, peers: Any,
                                                              tmp_path: Path) -> None:
    """The wait happens in the peer's ledger; the alert is the controller's (its session's file)."""
    peer, tree = setup(hostrun, peers, tmp_path, slice="300M")
    hostrun.configure(top='enable_across_machines = true\ntoolchain_probes = ["rsync --version"]\n'
                          'alert_wait_after = "1s"', peers=peer.host_table())
    started, release = tmp_path / "started", tmp_path / "release"
    holder = hostrun.popen("--peer", "-m", "200M", "--label", "holder", "--session", "builder", "--",
                           "sh", "-c", f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done",
                           cwd=tree)
    try:
        wait_for(started.exists, timeout=30)
        waiter = hostrun.popen("--peer", "-m", "200M", "--label", "waiter", "--session", "agent", "--",
                               "true", cwd=tree)
        wait_for(lambda: any(a["kind"] == "waiting" for a in alert_records(hostrun)), timeout=30)
    finally:
        release.touch()
        holder.wait(timeout=60)
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and holder.returncode == 0, err
    (item,) = [a for a in alert_records(hostrun) if a["kind"] == "waiting"]  # once per wait
    assert_common(item)
    assert item["host"] == "peer1" and item["label"] == "waiter" and item["session"] == "agent"
    assert item["pid"] == waiter.pid and item["need"] == 200 * MiB and item["position"] == 0
    assert [(h["label"], h["session"], h["size"]) for h in item["holders"]] == [
        ("holder", "builder", 200 * MiB)]
    assert "on peer1" in item["message"] and "held by holder (builder, 200 MiB)" in item["message"]
    assert item["action"].endswith("hostrun --label waiter --session agent -- true")  # run it here
    assert "alert: job waiter has waited" in err and "on peer1" in err
    assert not (peer.state_dir / "alerts.jsonl").exists()  # the peer's agent does not alert


def test_wait_figures_from_a_peer_are_checked_before_use() -> None:
    good = {"waited_s": 61.5, "need": 5, "free": 1, "position": 2, "policy": None,
            "holders": [{"label": "x" * 500, "session": None, "size": 5, "pid": 9}]}
    checked = checked_figures(good)
    assert checked is not None and checked["holders"][0]["label"] == "x" * 200  # cut, kept
    assert checked["waited_s"] == 61.5 and checked["position"] == 2
    for bad in ([], "text", {**good, "need": "5"}, {**good, "free": True}, {**good, "holders": {}},
                {**good, "holders": [{"label": 1, "size": 5, "pid": 9}]},
                {k: v for k, v in good.items() if k != "position"}):
        assert checked_figures(bad) is None, bad


def test_suggested_commands_keep_the_jobs_own_options() -> None:
    """The 254 alert's rerun keeps the job's -m (without it, the rerun would book the whole slice)
    and, like the 250 and 246 ones, its other run options."""
    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.local import alertlog

    request = RunRequest(argv=["make", "-j8"], label="build", cap=2 << 30, max_runtime=600.0,
                         threads=8, group="builds", session="s1")
    full = Outcome(exit_code=254, outcome="slice-full", host="local", label="build", argv=["make", "-j8"],
                   cap_bytes=2 << 30, peak_bytes=1 << 30)
    item = alertlog.for_outcome(full, "s1", request=request)
    assert item is not None
    assert item["action"] == ("hostrun -m 2G --max-runtime 600s --threads 8 --group builds --label build "
                              "--session s1 -- make -j8")
    own = Outcome(exit_code=250, outcome="own-cap", host="local", label="build", argv=["make", "-j8"],
                  cap_bytes=2 << 30, peak_bytes=2 << 30)
    item = alertlog.for_outcome(own, "s1", request=request)
    assert item is not None and item["action"].startswith("hostrun -m 4G --max-runtime 600s --threads 8")
    item = alertlog.for_unreachable("box", "build", "s1", ["make"], "refused", request)
    assert item["action"] == "hostrun -m 2G --max-runtime 600s --threads 8 --group builds --label build " \
                             "--session s1 -- make"
