"""Admission under contention and reclaim of stale bookings: real cgroups, real ledger, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dispatch.core.procinfo import is_stopped, start_time
from dispatch.core.units import GiB, MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.admission.policy import Room
from dispatch.local.store.ledgerdb import Booking, NewBooking
from tests.conftest import Hostrun, pid_alive, wait_for


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
    stale = ledger.enqueue(NewBooking(host="local", label="ghost", pid=me,
                                      pid_start=(start_time(me) or 0) + 12345,
                                      size=250 * MiB, cap=250 * MiB, kind="cap", command="ghost",
                                      session=None))
    ledger.db.execute("UPDATE bookings SET state = 'running', since = 0 WHERE id = ?", (stale,))
    ledger.close()
    proc = hostrun.run("-m", "100M", "--", "true", timeout=30)
    assert proc.returncode == 0
    assert "waiting" not in proc.stderr
    assert hostrun.bookings() == []


def test_a_try_reclaims_the_stale_bookings_its_verdict_rests_on(hostrun: Hostrun) -> None:
    """A locked try reclaims stale running bookings and stale waiters ahead of it, not a stale
    waiter behind it (which holds no room): the next try from behind it reclaims that one."""
    hostrun.state_dir.mkdir(mode=0o700, exist_ok=True)
    ledger = Ledger(str(hostrun.state_dir))
    me = os.getpid()
    alive, gone = start_time(me) or 0, (start_time(me) or 0) + 12345

    def book(label: str, started: int) -> int:
        return ledger.enqueue(NewBooking(host="local", label=label, pid=me, pid_start=started, size=MiB,
                              cap=MiB, kind="cap", command=label, session=None))

    running, ahead, mine, behind, last = (book("running", gone), book("ahead", gone),
                                          book("mine", alive), book("behind", gone), book("last", alive))
    ledger.db.execute("UPDATE bookings SET state = 'running', since = 0 WHERE id = ?", (running,))

    def room(rows: list[Booking]) -> Room:
        return Room(GiB)

    try:
        adm = ledger.try_admit(mine, "local", room)
        assert adm.admitted and sorted(b.id for b in adm.reclaimed) == [running, ahead]
        assert [b.id for b in ledger.bookings()] == [mine, behind, last]
        adm = ledger.try_admit(last, "local", room)
        assert adm.admitted and [b.id for b in adm.reclaimed] == [behind]
    finally:
        for booking in (running, ahead, mine, behind, last):
            ledger.release(booking)
        ledger.close()


def test_reclaim_stops_a_dead_holders_job(hostrun: Hostrun) -> None:
    """Nothing may run unbooked: a dead holder's job still in its cgroup is killed on reclaim."""
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the slice
    dead = subprocess.Popen(["true"])
    dead.wait()
    job_dir = hostrun.slice_dir / f"job-{dead.pid}-1"  # the name its holder would have given it
    job_dir.mkdir()
    orphan = subprocess.Popen(["sleep", "300"])
    (job_dir / "cgroup.procs").write_text(str(orphan.pid))
    ledger = Ledger(str(hostrun.state_dir))
    bid = ledger.enqueue(NewBooking(host="local", label="dead-holder", pid=dead.pid, pid_start=1,
                                    size=200 * MiB,
                                    cap=200 * MiB, kind="cap", command="x", session=None))
    ledger.db.execute("UPDATE bookings SET state = 'running', cgroup = ? WHERE id = ?", (str(job_dir), bid))
    ledger.close()
    proc = hostrun.run("-m", "100M", "--", "true", timeout=30)
    assert proc.returncode == 0
    orphan.wait(timeout=5)
    assert not pid_alive(orphan.pid)
    assert not job_dir.exists()


def test_a_stale_row_naming_another_live_job_never_gets_it_killed(hostrun: Hostrun,
                                                                   tmp_path: Path) -> None:
    """A dead holder's row whose cgroup is another, live job's (a stale row, or one written by
    someone with access to the ledger): the reclaim releases the row and leaves that job alone,
    because the cgroup's name does not carry the row's own pid and start time."""
    started = tmp_path / "started"
    live = hostrun.popen("-m", "64M", "--label", "live", "--", "sh", "-c", f"touch {started}; sleep 3")
    wait_for(started.exists)
    ledger = Ledger(str(hostrun.state_dir))
    (own,) = [b for b in ledger.bookings() if b.label == "live"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    bid = ledger.enqueue(NewBooking(host="local", label="stale", pid=dead.pid, pid_start=1, size=64 * MiB,
                         cap=64 * MiB, kind="cap", command="x", session=None))
    ledger.db.execute("UPDATE bookings SET state = 'running', cgroup = ? WHERE id = ?", (own.cgroup, bid))
    ledger.close()
    assert hostrun.run("-m", "64M", "--", "true", timeout=30).returncode == 0  # reclaims the stale row
    assert [b[1] for b in hostrun.bookings()] == ["live"]
    assert live.wait(timeout=30) == 0, live.stderr.read() if live.stderr else ""


@pytest.mark.parametrize("attempt", range(5))
def test_a_stopped_waiter_at_the_head_holds_nobody_up(hostrun: Hostrun, tmp_path: Path,
                                                      attempt: int) -> None:
    """300M slice: ``hold`` runs at 150M until released; ``head`` (200M) waits, then is stopped
    (SIGTSTP, Ctrl-Z's signal, sent right after its booking appears: the moment it is most likely
    inside its first admission transaction, which is why the ledger holds Ctrl-Z back while it
    works; five times); ``small`` (100M) fits beside ``hold`` and no longer waits behind the stopped
    head. Once resumed, the head is first in the queue again and runs after ``hold``."""
    started, release = tmp_path / "started", tmp_path / "release"
    hold = hostrun.popen("-m", "150M", "--label", "hold", "--", "sh", "-c",
                         f"touch {started}; while [ ! -e {release} ]; do sleep 0.05; done")
    wait_for(started.exists)
    head = small = None
    try:
        # A process group of its own under this process (same session): the kernel discards SIGTSTP
        # for a process in an orphaned group, which this test's may be (a runner started by setsid).
        head = hostrun.popen("-m", "200M", "--label", "head", "--", "true", process_group=0)
        wait_for(lambda: any(b[1] == "head" for b in hostrun.bookings()))
        os.kill(head.pid, signal.SIGTSTP)
        wait_for(lambda: is_stopped(head.pid))
        small = hostrun.popen("-m", "100M", "--label", "small", "--", "true")
        assert small.wait(timeout=60) == 0, small.stderr.read() if small.stderr else ""
        assert [b[1:3] for b in hostrun.bookings() if b[1] != "hold"] == [("head", "waiting")]
    finally:  # whatever failed, nothing is left stopped or holding the slice
        if head is not None:
            os.kill(head.pid, signal.SIGCONT)
        release.touch()
        if small is not None:
            small.terminate()
    assert hold.wait(timeout=30) == 0
    assert head is not None and head.wait(timeout=30) == 0


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
    ledger.enqueue(NewBooking(host="local", label="ghost", pid=dead.pid, pid_start=1, size=64 * MiB,
                              cap=64 * MiB,
                              kind="cap", command="x", session=None))
    ledger.close()
    shown = json.loads(hostrun.run("ledger", "--json").stdout)
    (entry,) = shown["queue"]
    assert entry["label"] == "ghost" and entry["stale"] is True
    assert "stale: holder gone" in hostrun.run("ledger").stdout
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # the next admission reclaims it
    assert json.loads(hostrun.run("ledger", "--json").stdout)["queue"] == []


def test_ledger_shows_the_head_of_a_long_queue_and_counts_the_rest(hostrun: Hostrun) -> None:
    """60 waiting rows (held by this live process): the table shows 50 and counts the other 10;
    ``--json`` lists all 60. (10,000 rows took 5.9 s to render as one table: see the note.)"""
    import json

    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the ledger
    ledger = Ledger(str(hostrun.state_dir))
    me = os.getpid()
    for i in range(60):
        ledger.enqueue(NewBooking(host="local", label=f"w{i:02d}", pid=me, pid_start=start_time(me) or 0,
                       size=64 * MiB, cap=64 * MiB, kind="cap", command="x", session=None))
    ledger.close()
    shown = hostrun.run("ledger", env={**os.environ, "COLUMNS": "200"}).stdout
    assert "w49" in shown and "w50" not in shown
    assert "… and 10 more waiting (60 in all; 'hostrun ledger --json' lists every one)" in shown
    assert len(json.loads(hostrun.run("ledger", "--json").stdout)["queue"]) == 60
    ledger = Ledger(str(hostrun.state_dir))
    for b in ledger.bookings():
        ledger.release(b.id)
    ledger.close()
