"""Admission under contention and reclaim of stale bookings: real cgroups, real ledger, real processes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from dispatch.core.procinfo import start_time
from dispatch.local.ledger import Ledger
from tests.conftest import Hostrun, pid_alive, wait_for

MiB = 1 << 20


def _intervals(marks: Path) -> list[tuple[float, float]]:
    spans = []
    for f in sorted(marks.iterdir()):
        start, end = (float(x) for x in f.read_text().split())
        spans.append((start, end))
    return spans


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_thirty_concurrent_jobs_never_exceed_three_booked(hostrun: Hostrun, tmp_path: Path) -> None:
    """30 hostrun processes on a slice that fits 3 at a time: at most 3 run at once, all finish."""
    marks = tmp_path / "marks"
    marks.mkdir()
    procs = [
        hostrun.popen("-m", "100M", "--label", f"j{i}", "--", "sh", "-c",
                      f"date +%s.%N > {marks}/{i:02d}; sleep 0.3; date +%s.%N >> {marks}/{i:02d}")
        for i in range(30)
    ]
    most_booked = 0
    while any(p.poll() is None for p in procs):
        running = [b for b in hostrun.bookings() if b[2] == "running"]
        most_booked = max(most_booked, len(running))
        assert sum(b[4] for b in running) <= 300 * MiB
        time.sleep(0.02)
    assert [p.returncode for p in procs] == [0] * 30, [p.stderr.read() for p in procs if p.returncode]
    spans = _intervals(marks)
    assert len(spans) == 30
    assert _max_overlap(spans) <= 3
    assert 1 <= most_booked <= 3


def test_stale_booking_with_reused_pid_is_reclaimed(hostrun: Hostrun) -> None:
    """A booking whose pid is alive but with another start time (pid reuse) is reclaimed."""
    hostrun.state_dir.mkdir(mode=0o700, exist_ok=True)
    ledger = Ledger(str(hostrun.state_dir))
    me = os.getpid()
    stale = ledger.enqueue(host="local", label="ghost", pid=me, pid_start=(start_time(me) or 0) + 12345,
                           size=250 * MiB, cap=250 * MiB, kind="cap", command="ghost", session=None)
    ledger.db.execute("UPDATE bookings SET state = 'running', since = 0 WHERE id = ?", (stale,))
    ledger.close()
    proc = hostrun.run("-m", "100M", "--", "true", timeout=30)
    assert proc.returncode == 0
    assert "waiting" not in proc.stderr
    assert hostrun.bookings() == []


def test_reclaim_stops_a_dead_holders_job(hostrun: Hostrun) -> None:
    """Nothing may run unbooked: a dead holder's job still in its cgroup is killed on reclaim."""
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the slice
    job_dir = hostrun.slice_dir / "job-999-1"
    job_dir.mkdir()
    orphan = subprocess.Popen(["sleep", "300"])
    (job_dir / "cgroup.procs").write_text(str(orphan.pid))
    dead = subprocess.Popen(["true"])
    dead.wait()
    ledger = Ledger(str(hostrun.state_dir))
    bid = ledger.enqueue(host="local", label="dead-holder", pid=dead.pid, pid_start=1, size=200 * MiB,
                         cap=200 * MiB, kind="cap", command="x", session=None)
    ledger.db.execute("UPDATE bookings SET state = 'running', cgroup = ? WHERE id = ?", (str(job_dir), bid))
    ledger.close()
    proc = hostrun.run("-m", "100M", "--", "true", timeout=30)
    assert proc.returncode == 0
    orphan.wait(timeout=5)
    assert not pid_alive(orphan.pid)
    assert not job_dir.exists()


def test_waiting_job_killed_by_sigkill_leaves_no_queue_entry(hostrun: Hostrun, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "250M", "--", "sh", "-c", f"touch {started}; sleep 2")
    wait_for(started.exists)
    waiter = hostrun.popen("-m", "250M", "--label", "w", "--", "true")
    wait_for(lambda: any(b[1] == "w" for b in hostrun.bookings()))
    waiter.kill()
    waiter.wait()
    holder.wait(timeout=20)
    assert holder.returncode == 0
    # The next admission reclaims the dead waiter's entry; until then it may still be listed.
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    assert hostrun.bookings() == []


def test_fifo_a_small_job_does_not_jump_a_waiting_big_one(hostrun: Hostrun, tmp_path: Path) -> None:
    marks = tmp_path / "order"
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "150M", "--", "sh", "-c", f"touch {started}; sleep 1.5")
    wait_for(started.exists)
    big = hostrun.popen("-m", "250M", "--label", "big", "--", "sh", "-c", f"echo big >> {marks}")
    wait_for(lambda: any(b[1] == "big" for b in hostrun.bookings()))
    small = hostrun.popen("-m", "60M", "--label", "small", "--", "sh", "-c", f"echo small >> {marks}")
    for p in (holder, big, small):
        p.wait(timeout=30)
        assert p.returncode == 0
    # 150M held + 60M small would fit at once, but it would delay big (250M + 60M > 300M): FIFO says
    # big first, and small only once big is done.
    assert marks.read_text().split() == ["big", "small"]


def test_ledger_shows_a_dead_holders_booking_as_stale(hostrun: Hostrun) -> None:
    """``hostrun ledger`` only reads: a booking whose holder is gone is flagged until reclaimed."""
    import json

    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the ledger
    dead = subprocess.Popen(["true"])
    dead.wait()
    ledger = Ledger(str(hostrun.state_dir))
    ledger.enqueue(host="local", label="ghost", pid=dead.pid, pid_start=1, size=64 * MiB, cap=64 * MiB,
                   kind="cap", command="x", session=None)
    ledger.close()
    shown = json.loads(hostrun.run("ledger", "--json").stdout)
    (entry,) = shown["queue"]
    assert entry["label"] == "ghost" and entry["stale"] is True
    assert "stale: holder gone" in hostrun.run("ledger").stdout
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # the next admission reclaims it
    assert json.loads(hostrun.run("ledger", "--json").stdout)["queue"] == []
