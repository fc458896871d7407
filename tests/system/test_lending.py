"""Lending: a waiter that may be requeued starts on room the running jobs have not grown into yet,
when its projection (and theirs, from their ramp profiles) stays within the room until its estimated
end, and it delays no head. Pure functions with exact numbers; admission on rows; one real run under
cgroups where a short job starts beside a slow-growing one whose booking leaves it no room.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dispatch.core.units import MiB
from dispatch.local.admission import policy as admitpolicy
from dispatch.local.admission.lending import Ramp, lend, project, usage
from dispatch.local.admission.policy import Room
from dispatch.local.store.ledgerdb import Booking
from tests.conftest import Hostrun, wait_for

PY = sys.executable
LATE = Ramp((10,) * 5 + (100,) * 5, fastest=10.0, longest=10.0)  # grows at half its run; est 13.5 s
FLAT = Ramp((20,) * 10, fastest=2.0, longest=2.0)  # est 3.5 s


def booking(id: int, label: str, size: int, state: str = "running", since: float | None = 0.0,
            requeue: bool = False) -> Booking:
    return Booking(id, "local", label, state, 1, 1, size, size, "peak", None, "cmd", None, 0.0,
                   since if state == "running" else None, None, requeue=requeue)


def test_a_running_job_is_projected_from_its_profile_then_at_its_booking_once_overdue() -> None:
    a = booking(1, "late", 100)
    assert [usage(a, LATE, t) for t in (0.0, 4.9, 5.0, 13.5, 13.6)] == [10, 10, 100, 100, 100]
    assert usage(a._replace(size=150), LATE, 14.0) == 150  # overdue: its whole booking
    assert usage(a, None, 0.0) == 100  # no profile: its booking
    # Its fastest run took 5 s: by 2.5 s it may be where the profile is at half.
    assert usage(a, LATE._replace(fastest=5.0), 2.5) == 100


def test_a_projection_checks_every_step_until_the_waiters_estimated_end() -> None:
    running = [booking(1, "late", 100)]
    ramps = {"late": LATE}
    # From 1 s to 4.5 s the late job holds at most 10: 10 + 20 within 30.
    assert project(FLAT, running, ramps, 30, now=1.0) == (True, 0.0, 30, 30)  # the first worst step
    assert not project(FLAT, running, ramps, 29, now=1.0).fits
    # Started at 2 s, it would still run at 5 s, when the late job grows to 100.
    loan = project(FLAT, running, ramps, 110, now=2.0)
    assert loan == (False, 3.0, 120, 110)
    # A job without a profile counts at its booking throughout.
    assert project(FLAT, [*running, booking(2, "plain", 50)], ramps, 80, now=1.0).fits
    assert not project(FLAT, [*running, booking(2, "plain", 50)], ramps, 79, now=1.0).fits


def test_only_a_requeueable_waiter_with_a_profile_borrows_and_never_delays_the_head() -> None:
    running = [booking(1, "late", 100)]
    ramps = {"late": LATE, "flat": FLAT}
    me = booking(5, "flat", 20, "waiting", requeue=True)
    line = lend(me, running, ramps, free=0, now=1.0)
    assert line is not None and line.startswith("LEND flat (booking 5, need 20 B, est 4s, 0 B free)")
    assert "project at most 30 B of 100 B (at +0.0s)" in line
    assert lend(me._replace(requeue=False), running, ramps, 0, 1.0) is None
    assert lend(me._replace(label="unknown"), running, ramps, 0, 1.0) is None
    assert lend(me._replace(gpu_bytes=1), running, ramps, 0, 1.0) is None
    head = booking(3, "big", 500, "waiting")
    assert lend(me, running, ramps, 0, 1.0, head, None) is None  # no shadow: it may delay the head
    assert lend(me, running, ramps, 0, 1.0, head, 4.4) is None  # ends at 4.5, after the head's start
    assert lend(me, running, ramps, 0, 1.0, head, 4.5) is not None


def test_admission_lends_only_when_memory_alone_holds_it_and_books_it_as_said() -> None:
    late = booking(1, "late", 100)
    me = booking(5, "flat", 20, "waiting", requeue=True)

    def room(r: list[Booking]) -> Room:
        return Room(100 - sum(b.size for b in r))

    adm = admitpolicy.evaluate(5, [late, me], room, ramps=lambda: {"late": LATE, "flat": FLAT}, now=1.0)
    assert adm.admitted and adm.lend is not None and adm.lend.startswith("LEND flat")
    # No ramps read (they are read only when memory holds a requeueable waiter): FIFO says no.
    assert not admitpolicy.evaluate(5, [late, me], room, now=1.0).admitted
    # A waiter ahead of it and FIFO: it could be delayed, so no loan.
    ahead = booking(3, "big", 50, "waiting")
    adm = admitpolicy.evaluate(5, [late, ahead, me], room,
                               ramps=lambda: {"late": LATE, "flat": FLAT}, now=1.0)
    assert not adm.admitted and adm.lend is None
    # With backfill the head (50 more) starts when "late" ends, by 13.5 s: a loan that ends at 4.5 s
    # does not delay it.
    adm = admitpolicy.evaluate(5, [late, ahead, me], room, durations=lambda: {"late": 10.0, "flat": 2.0},
                               ramps=lambda: {"late": LATE, "flat": FLAT}, now=1.0)
    assert adm.admitted and adm.lend is not None


def test_a_short_job_starts_on_room_a_slow_growing_job_has_not_used_yet(hostrun: Hostrun,
                                                                         tmp_path: Path) -> None:
    hostrun.configure(slice="200M")
    # "slow" holds little for 6 s, then 150 MiB; "quick" takes 100 MiB at once for a moment. Each
    # runs once alone first, so both have a recorded profile. Then, while "slow" is in its quiet
    # start, "quick" (--requeue) finds 50 MiB free for its 100 MiB: FIFO holds it, lending does not.
    started = tmp_path / "slow-started"
    slow = ("import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(6); "
            "x = bytearray(150 << 20); [x.__setitem__(i, 1) for i in range(0, len(x), 4096)]; "
            "time.sleep(0.5)")
    quick = ("x = bytearray(100 << 20); [x.__setitem__(i, 1) for i in range(0, len(x), 4096)]; "
             "print(open('/proc/self/oom_score_adj').read().strip())")
    for args in (["--label", "slow", "--", PY, "-c", slow, str(tmp_path / "first")],
                 ["--label", "quick", "--", PY, "-c", quick]):
        assert hostrun.run("-m", "190M", *args).returncode == 0
    first = hostrun.popen("-m", "190M", "--label", "slow", "--", PY, "-c", slow, str(started))
    try:
        wait_for(started.exists, timeout=30)
        out = tmp_path / "quick.json"
        proc = hostrun.run("--requeue", "-m", "190M", "--label", "quick", "--result-file", str(out),
                           "--", PY, "-c", quick)
        _, slow_err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, slow_err
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert (r["booking_kind"], r["requeued"]) == ("gamble", 0)
    assert proc.stdout.strip() == "1000"  # the borrower is the kernel's first choice
    log = (hostrun.state_dir / "queue.log").read_text()
    assert "LEND quick (booking " in log and "booked as a gamble" in log
    assert r["booked_bytes"] >= 100 * MiB  # booked at its recorded peak, past the 50 MiB free
