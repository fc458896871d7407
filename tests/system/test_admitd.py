"""The admission engine (dispatch/local/engine/admitd.py) with real runs, cgroups and processes: a swarm
behind a full slice, the engine killed under waiting runs, a waiting client killed, two runs that
start it at once, its idle exit, a run that cannot start it, and where ``doctor`` and ``report`` say
it runs.

The bench (bench/bench_swarm.py) measures the 1,000-submission swarm; here a smaller one checks the
rules: every run once, none lost, never more booked than the slice.
"""

from __future__ import annotations

import json
import marshal
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun, wait_for


def _engines(hostrun: Hostrun) -> list[int]:
    """The engine processes of this test's state dir."""
    return hostrun.engine_pids()


def _stop_engines(hostrun: Hostrun) -> None:
    for pid in _engines(hostrun):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not _engines(hostrun), timeout=30)


def _holder(hostrun: Hostrun, tmp_path: Path, size: str) -> tuple[subprocess.Popen[str], Path]:
    started, go = tmp_path / "holder-started", tmp_path / "holder-go"
    proc = hostrun.popen("-m", size, "--label", "holder", "--", "sh", "-c",
                         f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, timeout=60)
    return proc, go


def _swarm(hostrun: Hostrun, tmp_path: Path, count: int) -> tuple[list[subprocess.Popen[str]], list[Path]]:
    stamps = [tmp_path / f"ts-{i}" for i in range(count)]
    procs = [hostrun.popen("-m", "50M", "--label", f"swarm-{i}", "--", "sh", "-c",
                           'date +%s.%N >> "$1"; sleep 0.1; date +%s.%N >> "$1"', "job", str(stamp))
             for i, stamp in enumerate(stamps)]
    return procs, stamps


def _most_at_once(stamps: list[Path]) -> int:
    events = []
    for stamp in stamps:
        start, end = (float(x) for x in stamp.read_text().split())
        events += [(start, 1), (end, -1)]
    now = best = 0
    for _, delta in sorted(events):
        now += delta
        best = max(best, now)
    return best


def test_a_swarm_behind_a_full_slice_all_runs_once_and_never_over_the_slice(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """120 runs wait behind a holder of the whole 300M slice (6 fit at 50M once it ends): every one
    exits 0 and ran exactly once, at most 6 ran at once, and one engine admitted them all."""
    holder, go = _holder(hostrun, tmp_path, "300M")
    procs, stamps = _swarm(hostrun, tmp_path, 120)
    wait_for(lambda: len(hostrun.bookings()) == 121, timeout=180, interval=0.5)
    assert len(_engines(hostrun)) == 1
    go.touch()
    codes = [p.wait(timeout=300) for p in [holder, *procs]]
    assert codes == [0] * 121, [(i, c, procs[i - 1].stderr.read() if procs[i - 1].stderr else "")
                                for i, c in enumerate(codes) if c][:3]
    assert all(len(s.read_text().split()) == 2 for s in stamps)
    assert _most_at_once(stamps) <= 6
    assert hostrun.bookings() == []
    _stop_engines(hostrun)


def test_the_engine_killed_under_waiting_runs_loses_none_of_them(hostrun: Hostrun, tmp_path: Path) -> None:
    """SIGKILL the engine three times while 30 runs wait, once also the next as it starts: each
    waiting run re-attaches to the next engine (started by the first to notice, again when that one
    never listened), keeps its booking, and all run once; the running holder is never touched and
    nothing is left booked."""
    holder, go = _holder(hostrun, tmp_path, "300M")
    procs, stamps = _swarm(hostrun, tmp_path, 30)
    wait_for(lambda: len(hostrun.bookings()) == 31, timeout=120, interval=0.3)
    before = {b[0] for b in hostrun.bookings()}
    for round_ in range(3):
        old = wait_for(lambda: _engines(hostrun), timeout=60, interval=0.2)
        assert len(old) == 1, old
        os.kill(old[0], signal.SIGKILL)
        new = wait_for(lambda old=old: set(_engines(hostrun)) - set(old), timeout=120, interval=0.002)
        if round_ == 1:  # the next one killed as it starts (before it listens): its starter starts another
            for pid in new:
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda new=new, old=old: set(_engines(hostrun)) - set(old) - new, timeout=120,
                     interval=0.2)
        wait_for(lambda: {b[0] for b in hostrun.bookings()} == before, timeout=120, interval=0.2)
    assert holder.poll() is None  # the engine's death never touches a running job
    go.touch()
    codes = [p.wait(timeout=180) for p in [holder, *procs]]
    assert codes == [0] * 31, [p.stderr.read() for p in procs if p.returncode and p.stderr][:2]
    assert all(len(s.read_text().split()) == 2 for s in stamps)
    assert _most_at_once(stamps) <= 6
    assert hostrun.bookings() == []
    _stop_engines(hostrun)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_waiting_run_is_one_process_until_it_is_admitted(hostrun: Hostrun, tmp_path: Path) -> None:
    """Behind a full slice a run waits alone (no guardian, no pre-forked job: issue 38's cost per
    waiter); once admitted its guardian and job appear and it runs as ever."""
    holder, go = _holder(hostrun, tmp_path, "300M")
    marker = tmp_path / "ran"
    waiter = hostrun.popen("-m", "100M", "--label", "waiter", "--", "touch", str(marker))
    wait_for(lambda: [b[1] for b in hostrun.bookings()] == ["holder", "waiter"], timeout=60)
    time.sleep(0.5)  # what it would fork, it forks at once: give it the time
    assert _children(waiter.pid) == [] and waiter.poll() is None
    assert len(_children(holder.pid)) == 2  # the running one: its guardian and its job
    go.touch()
    assert holder.wait(timeout=60) == 0 and waiter.wait(timeout=60) == 0
    assert marker.exists()
    _stop_engines(hostrun)


def test_the_engine_keeps_no_descriptor_of_the_jobs_it_looks_at(hostrun: Hostrun, tmp_path: Path) -> None:
    """While runs wait, the engine reads the running jobs' memory at every evaluation (what they
    have yet to use bounds the room): it must not keep a descriptor per look (it kept memory.stat
    open: ~20,000 of them after a 1,000-run swarm, until it met its descriptor limit)."""
    holder, go = _holder(hostrun, tmp_path, "300M")
    waiters = [hostrun.popen("-m", "100M", "--label", f"waiter-{i}", "--", "true") for i in range(3)]
    wait_for(lambda: len(hostrun.bookings()) == 4, timeout=60)
    (engine,) = _engines(hostrun)
    time.sleep(3.5)  # three evaluations or more (one a second while runs wait)

    def job_files() -> list[str]:
        return [os.readlink(f"/proc/{engine}/fd/{fd}") for fd in os.listdir(f"/proc/{engine}/fd")
                if "/job-" in os.readlink(f"/proc/{engine}/fd/{fd}")]

    assert job_files() == []
    go.touch()
    assert [p.wait(timeout=60) for p in (holder, *waiters)] == [0, 0, 0, 0]
    _stop_engines(hostrun)


def test_a_waiting_run_killed_is_released_by_its_connection(hostrun: Hostrun, tmp_path: Path) -> None:
    """A waiting run and its guardian SIGKILLed together: nobody is left to release its booking but
    the engine, which does when the connection closes, while the holder still runs."""
    holder, go = _holder(hostrun, tmp_path, "300M")
    waiter = hostrun.popen("-m", "100M", "--label", "waiter", "--", "true", process_group=0)
    wait_for(lambda: [b[1] for b in hostrun.bookings()] == ["holder", "waiter"], timeout=60)
    os.killpg(waiter.pid, signal.SIGKILL)
    waiter.wait(timeout=30)
    wait_for(lambda: [b[1] for b in hostrun.bookings()] == ["holder"], timeout=30, interval=0.2)
    assert holder.poll() is None
    go.touch()
    assert holder.wait(timeout=60) == 0
    _stop_engines(hostrun)


def test_runs_started_at_once_start_one_engine_which_leaves_when_idle(hostrun: Hostrun, tmp_path: Path
                                                                      ) -> None:
    """Twelve runs with no engine yet start one (the start lock), its socket private to its owner;
    idle for its idle time (1 s here) it leaves and removes its socket."""
    env = {**os.environ, "HOSTRUN_ENGINE_IDLE": "1"}
    procs = [hostrun.popen("-m", "20M", "--", "sleep", "0.5", env=env) for _ in range(12)]
    wait_for(lambda: _engines(hostrun), timeout=60, interval=0.1)
    seen = set(_engines(hostrun))
    while any(p.poll() is None for p in procs):
        seen |= set(_engines(hostrun))
        time.sleep(0.05)
    assert [p.returncode for p in procs] == [0] * 12
    assert len(seen) == 1, seen
    sockets = list(hostrun.state_dir.glob("admitd-*.sock"))
    assert len(sockets) <= 1
    for sock in sockets:
        mode = sock.lstat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0
    wait_for(lambda: not _engines(hostrun), timeout=30, interval=0.2)
    assert not list(hostrun.state_dir.glob("admitd-*.sock"))


def test_a_run_that_cannot_start_the_engine_ends_78_with_nothing_run(hostrun: Hostrun, tmp_path: Path
                                                                     ) -> None:
    """The engine's log path is taken by a directory, so the engine cannot start: the run ends 78
    in one line saying so, its command never ran, nothing is left booked."""
    hostrun.state_dir.mkdir(mode=0o700, exist_ok=True)
    (hostrun.state_dir / "admitd.log").mkdir()
    ran = tmp_path / "ran"
    proc = hostrun.run("-m", "20M", "--", "touch", str(ran), timeout=120)
    assert proc.returncode == ExitCode.NOT_RUN, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hostrun")]
    assert len(lines) == 1 and "admission engine did not start" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not ran.exists() and hostrun.bookings() == []


def test_a_requests_hand_made_json_reads_back_as_json_does() -> None:
    """The run's side writes its requests without the json module (a plain run loads none): what it
    writes must be what json reads, for every string a label or command can hold (quotes,
    backslashes, control characters, non-ASCII, characters outside the BMP, lone surrogates of
    undecodable argv bytes)."""
    import json

    from dispatch.local.engine.admitclient import encode_request

    texts = ['plain', 'a "quoted" \\ path', "tab\tnew\nline\x00\x1f\x7f", "ünïcødé ✓", "emoji 🚀 \U0001d518",
             b"bad \xff\xfe bytes".decode("utf-8", "surrogateescape"), ""]
    message = {"op": "book", "booking": {t or "empty": t for t in texts}, "n": [1, -2, 3.5, True, None]}
    line = encode_request(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    assert json.loads(line) == message


def test_doctor_says_where_the_engine_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    """Before any run: not running, the next run starts it; while one holds it: its pid and socket."""
    first = hostrun.run("doctor", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["admission_engine"]["detail"] == "not running: the next run starts it"
    holder, go = _holder(hostrun, tmp_path, "100M")
    try:
        engine = json.loads(hostrun.run("doctor", "--json").stdout)["admission_engine"]
        assert engine["pid"] == _engines(hostrun)[0] and engine["socket"].startswith(str(hostrun.state_dir))
        shown = hostrun.run("doctor").stdout
        assert f"engine:   running, pid {engine['pid']}" in shown, shown
    finally:
        go.touch()
    assert holder.wait(timeout=60) == 0
    _stop_engines(hostrun)


def _hello(path: str) -> dict[str, Any]:
    """The engine's own answer to ``hello`` on its socket (not through ``admitclient.where``)."""
    import socket

    from dispatch.local.engine.reach import unix_address

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        unix_address(path, sock, "connect")  # tmp_path may be longer than AF_UNIX takes
        sock.sendall(b'{"op": "hello", "protocol": 1}\n')  # a request: one JSON line
        data = b""  # an answer: its length in 4 bytes, then marshal
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(4096)
            assert chunk, f"the engine closed the connection after {data!r}"
            data += chunk
    answer: dict[str, Any] = marshal.loads(data[4:])
    return answer


def _local_engine(hostrun: Hostrun, **kw: Any) -> dict[str, Any]:
    done = hostrun.run("report", "--json", **kw)
    assert done.returncode == 0, done.stderr
    report = {h["host"]: h["report"] for h in json.loads(done.stdout)["hosts"]}["local"]
    engine: dict[str, Any] = report["admission_engine"]
    return engine


def test_report_says_where_the_engine_runs(hostrun: Hostrun, tmp_path: Path) -> None:
    """``hostrun report`` (text and ``--json``) for this host: before any run, not running; once a
    real run started the engine, the pid its hello gives
    (the one engine process of this state dir) and its socket; stopped (SIGSTOP), said so within
    ``report_timeout`` instead of holding the report."""
    hostrun.configure(top='report_timeout = "1s"')  # before the engine starts: its digest has it
    assert _local_engine(hostrun) == {"socket": _local_engine(hostrun)["socket"], "pid": None,
                                      "detail": "not running: the next run starts it"}
    assert "admission engine │ not running: the next run starts it" in hostrun.run("report").stdout
    assert not _engines(hostrun)  # asking started none
    holder, go = _holder(hostrun, tmp_path, "100M")  # a real run: it starts the engine
    try:
        engine = _local_engine(hostrun)
        hello = _hello(engine["socket"])
        assert hello["op"] == "hello" and engine["pid"] == hello["pid"] == _engines(hostrun)[0]
        assert engine["detail"] == f"running, pid {hello['pid']}"
        assert engine["socket"].startswith(f"{hostrun.state_dir}/admitd-")
        shown = hostrun.run("report").stdout
        assert f"admission engine │ running, pid {hello['pid']} (" in shown, shown
        os.kill(hello["pid"], signal.SIGSTOP)
        try:
            started = time.monotonic()
            stopped = _local_engine(hostrun, timeout=30)
            took = time.monotonic() - started
        finally:
            os.kill(hello["pid"], signal.SIGCONT)
        assert stopped == {"socket": engine["socket"], "pid": None,
                           "detail": "does not answer within 1 s (stopped or hung?)"}, stopped
        assert took < 15, took  # the bound, not the engine, ended the wait
    finally:
        go.touch()
    assert holder.wait(timeout=60) == 0
    _stop_engines(hostrun)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_signalled_as_it_is_admitted_leaves_nothing(hostrun: Hostrun, tmp_path: Path,
                                                          sig: int) -> None:
    """A waiter signalled the moment a release admits it: between its admission and its job's start
    it has made its job cgroup but has no guardian yet (before: a SIGTERM there killed hostrun with
    the default action and left the cgroup behind, seen in the table-width tests). A SIGTERM is held
    back until the run's handlers are in place, so the job it starts ends at once (143), or the run
    had ended; a SIGKILL closes its connection and the engine removes the empty cgroup. Each time,
    nothing is left (the fixture checks), whatever the moment within the window."""
    hostrun.configure(slice="200M")
    for i in range(12):
        started, go = tmp_path / f"started-{i}", tmp_path / f"go-{i}"
        holder = hostrun.popen("-m", "200M", "--label", f"holder-{i}", "--", "sh", "-c",  # no peak:
                               f"touch {started}; while [ ! -e {go} ]; do sleep 0.01; done")  # at its cap
        wait_for(started.exists, timeout=60)
        waiter = hostrun.popen("-m", "64M", "--label", "waiter", "--", "sleep", "5")
        wait_for(lambda: any(b[1] == "waiter" and b[2] == "waiting" for b in hostrun.bookings()),
                 timeout=30)
        go.touch()
        wait_for(lambda: any(b[1] == "waiter" and b[2] == "running" for b in hostrun.bookings()),
                 timeout=30, interval=0.001)
        time.sleep(i * 0.002)  # a little later into the window each time
        waiter.send_signal(sig)
        code = waiter.wait(timeout=60)
        assert code in ((-signal.SIGKILL,) if sig == signal.SIGKILL else (128 + sig, 0)), code
        assert holder.wait(timeout=60) == 0
        wait_for(lambda: not hostrun.job_dirs() and not hostrun.bookings(), timeout=30)


def test_a_waiting_run_gets_ready_once_when_the_engine_says_its_turn_is_near(tmp_path: Path) -> None:
    """``Link.wait`` calls ``ready`` once, at the first ``soon`` (the engine's word that the run's
    turn is near: the run then loads what it needs once admitted), never for a status line, and
    returns at ``admitted``. The engine's side is a socketpair fed the frames it sends."""
    import socket

    from dispatch.core.settings import Settings
    from dispatch.local.engine.admitclient import Link

    def frame(message: dict[str, Any]) -> bytes:
        data = marshal.dumps(message)
        return len(data).to_bytes(4, "big") + data

    said: list[str] = []
    link = Link(Settings.default(state_dir=str(tmp_path)), said.append)
    mine, engine = socket.socketpair()
    link.sock = mine
    calls: list[int] = []
    with mine, engine:
        engine.sendall(frame({"op": "wait", "id": 7, "near": False, "line": "waiting: far"})
                       + frame({"op": "wait", "id": 7, "near": True, "line": "waiting: near"}))
        engine.sendall(frame({"op": "soon", "id": 7}) + frame({"op": "soon", "id": 7})
                       + frame({"op": "admitted", "id": 7, "kind": "cap", "gpu_index": None}))
        link.wait(said.append, None, ready=lambda: calls.append(len(said)))
    assert calls == [2], "ready once, after the two status lines, at the first soon"
    assert said == ["waiting: far", "waiting: near"]
    assert link.admitted_kind == "cap"
