"""Parked waiting runs (dispatch/local/engine/park.py, parked.py) with real runs, cgroups and the real
admission engine: a run that waits far from its turn becomes a bare interpreter holding its engine
connection, and is whole again, the same process on the same connection, before it runs. Here the
engine's "near" is 1 (``HOSTRUN_ENGINE_NEAR``), so every waiter behind the first parks.

What is real: the runs, the engine, the exec into ``parked.py`` and back (``sys.orig_argv``), the
signals, the killed engine. bench/bench_swarm.py measures what parking saves (PSS per waiter).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Hostrun, wait_for


@pytest.fixture(autouse=True)
def parking(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every run here goes through the engine and parks behind the first waiter, at once (its wait
    far from its turn need not last ``park.PARK_AFTER`` seconds first)."""
    monkeypatch.delenv("HOSTRUN_PARK", raising=False)
    monkeypatch.setenv("HOSTRUN_ENGINE_NEAR", "1")
    monkeypatch.setenv("HOSTRUN_PARK_AFTER", "0")
    yield


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _parked(pid: int) -> bool:
    return any(arg.endswith(b"/parked.py") for arg in _cmdline(pid))


def _engine_pids(hostrun: Hostrun) -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()
            and b"dispatch.local.engine.admitd" in _cmdline(int(n))
            and str(hostrun.state_dir).encode() in _cmdline(int(n))]


def _holder(hostrun: Hostrun, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    started, go = tmp_path / "holder-started", tmp_path / "holder-go"
    proc = hostrun.popen("-m", "300M", "--label", "holder", "--", "sh", "-c",
                         f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, timeout=60)
    return proc, go


def _queue(hostrun: Hostrun, tmp_path: Path, count: int, *extra: str
           ) -> tuple[list[subprocess.Popen[str]], list[Path]]:
    """``count`` runs of 50M queued one after another behind the holder (each booked before the
    next starts, so the queue order is theirs)."""
    procs, stamps = [], []
    for i in range(count):
        stamp = tmp_path / f"ran-{i}"
        procs.append(hostrun.popen("-m", "50M", "--label", f"w{i}", *extra,
                                   "--result-file", str(tmp_path / f"result-{i}.json"), "--",
                                   "sh", "-c", 'echo "$$" >> "$1"', "job", str(stamp)))
        stamps.append(stamp)
        wait_for(lambda i=i: len(hostrun.bookings()) == i + 2, timeout=60, interval=0.05)
    return procs, stamps


def test_runs_far_from_their_turn_park_and_run_once_as_the_same_process(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """Five runs behind a holder of the whole slice: the first stays whole, the four behind it park
    (the same pids, now ``python -I -S parked.py``, their booking kept); once the holder ends, each
    is whole again and runs once, exit 0, with its waiting lines and no other word on stderr, its
    result file saying how long it waited; nothing is left booked."""
    holder, go = _holder(hostrun, tmp_path)
    procs, stamps = _queue(hostrun, tmp_path, 5)
    booked = {b[0] for b in hostrun.bookings()}
    wait_for(lambda: [_parked(p.pid) for p in procs] == [False, True, True, True, True], timeout=60)
    assert {b[0] for b in hostrun.bookings()} == booked  # parking kept every booking
    go.touch()
    assert holder.wait(timeout=60) == 0
    for i, proc in enumerate(procs):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (i, err)
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("hostrun: waiting: ") for line in lines), (i, err)
        result = json.loads((tmp_path / f"result-{i}.json").read_text())
        assert result["exit_code"] == 0 and result["waited_s"] > 0, result
        assert len(stamps[i].read_text().split()) == 1  # ran exactly once
    assert hostrun.bookings() == []


def test_a_parked_run_ended_by_a_signal_ran_nothing_and_is_released(hostrun: Hostrun, tmp_path: Path) -> None:
    """SIGTERM to a parked run: it is whole again only to say so: exit 143, "interrupted while
    waiting for room; nothing ran", its result file written, its booking released, its job never run;
    the runs behind it keep their places and run."""
    holder, go = _holder(hostrun, tmp_path)
    procs, stamps = _queue(hostrun, tmp_path, 3)
    wait_for(lambda: _parked(procs[1].pid) and _parked(procs[2].pid), timeout=60)
    before = len(hostrun.bookings())
    os.kill(procs[1].pid, signal.SIGTERM)
    _, err = procs[1].communicate(timeout=60)
    assert procs[1].returncode == 128 + signal.SIGTERM, err
    assert "hostrun: interrupted while waiting for room; nothing ran" in err, err
    assert "Traceback" not in err
    result = json.loads((tmp_path / "result-1.json").read_text())
    assert result["exit_code"] == 128 + signal.SIGTERM and result["outcome"] == "signal", result
    wait_for(lambda: len(hostrun.bookings()) == before - 1, timeout=30)
    go.touch()
    assert [p.wait(timeout=120) for p in (holder, procs[0], procs[2])] == [0, 0, 0]
    assert not stamps[1].exists() and stamps[0].exists() and stamps[2].exists()
    assert hostrun.bookings() == []


def test_parked_runs_go_on_through_the_next_engine_when_theirs_is_killed(
        hostrun: Hostrun, tmp_path: Path) -> None:
    """SIGKILL the engine while three runs wait parked: each resumes (its connection ended),
    re-attaches its booking to the next engine (started by the first to notice) with its place,
    may park again, and all run once; nothing is left booked."""
    holder, go = _holder(hostrun, tmp_path)
    procs, stamps = _queue(hostrun, tmp_path, 4)
    wait_for(lambda: all(_parked(p.pid) for p in procs[1:]), timeout=60)
    booked = {b[0] for b in hostrun.bookings()}
    (engine,) = _engine_pids(hostrun)
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: [e for e in _engine_pids(hostrun) if e != engine], timeout=120, interval=0.1)
    wait_for(lambda: {b[0] for b in hostrun.bookings()} == booked, timeout=60)
    go.touch()
    codes = [p.wait(timeout=180) for p in (holder, *procs)]
    assert codes == [0] * 5, [p.stderr.read() if p.stderr else "" for p in procs]
    assert all(len(s.read_text().split()) == 1 for s in stamps)
    assert hostrun.bookings() == []


def test_a_parked_runs_long_wait_alert_comes_as_whole_runs_do(hostrun: Hostrun, tmp_path: Path) -> None:
    """With ``alert_wait_after = "2s"`` a parked run is whole again when its alert is due, and raises
    the one ``waiting`` alert, naming the holder, as a whole waiting run does."""
    hostrun.configure(slice="300M", top='alert_wait_after = "2s"')
    holder, go = _holder(hostrun, tmp_path)
    procs, _ = _queue(hostrun, tmp_path, 2)
    wait_for(lambda: _parked(procs[1].pid), timeout=60)
    alerts = hostrun.state_dir / "alerts.jsonl"

    def alerted(label: str) -> bool:
        return alerts.exists() and any(json.loads(line).get("label") == label
                                       for line in alerts.read_text().splitlines())

    wait_for(lambda: alerted("w1"), timeout=60, interval=0.2)
    assert not _parked(procs[1].pid)
    (alert,) = [json.loads(line) for line in alerts.read_text().splitlines()
                if json.loads(line).get("label") == "w1"]
    assert alert["kind"] == "waiting" and "holder" in json.dumps(alert), alert
    go.touch()
    assert [p.wait(timeout=120) for p in (holder, *procs)] == [0, 0, 0]


def test_a_run_far_from_its_turn_parks_only_once_it_has_waited_park_after(
        hostrun: Hostrun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOSTRUN_PARK_AFTER=3``: the run behind the first waiter stays whole for its first 3 s of
    waiting, then parks (the same process, its booking kept); the first waiter, near its turn,
    never does; both run once."""
    monkeypatch.setenv("HOSTRUN_PARK_AFTER", "3")
    holder, go = _holder(hostrun, tmp_path)
    procs, stamps = _queue(hostrun, tmp_path, 1)
    stamp = tmp_path / "ran-far"
    started = time.monotonic()  # before it starts, so before its wait begins
    far = hostrun.popen("-m", "50M", "--label", "far", "--", "sh", "-c", 'echo "$$" >> "$1"', "job",
                        str(stamp))
    wait_for(lambda: len(hostrun.bookings()) == 3, timeout=60, interval=0.05)
    booked = {b[0] for b in hostrun.bookings()}
    parked_at = wait_for(lambda: _parked(far.pid) and time.monotonic(), timeout=60, interval=0.05)
    assert parked_at - started >= 3.0, parked_at - started
    assert not _parked(procs[0].pid)
    assert {b[0] for b in hostrun.bookings()} == booked
    go.touch()
    assert [p.wait(timeout=120) for p in (holder, procs[0], far)] == [0, 0, 0]
    assert len(stamps[0].read_text().split()) == 1 and len(stamp.read_text().split()) == 1
    assert hostrun.bookings() == []


def test_park_0_keeps_waiting_runs_whole(hostrun: Hostrun, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOSTRUN_PARK=0``: nobody parks; all run as before."""
    monkeypatch.setenv("HOSTRUN_PARK", "0")
    holder, go = _holder(hostrun, tmp_path)
    procs, stamps = _queue(hostrun, tmp_path, 3)
    assert not any(_parked(p.pid) for p in procs)
    assert all(b"dispatch" in _cmdline(p.pid) for p in procs)
    go.touch()
    assert [p.wait(timeout=120) for p in (holder, *procs)] == [0, 0, 0, 0]
    assert all(s.exists() for s in stamps)
