"""Slot hand-off without polling: a release rings the waiter that can use the room through its own
FIFO (dispatch.local.wakeup). Real cgroups, ledger, FIFOs, processes and a real second user.

The waiters here run with ``HOSTRUN_WAIT_RECHECK=3600`` and an hourly waiting line: their safety
retry is off, so they can only get in by being rung (a generous timeout bounds each wait; nothing is
timed)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from dispatch.core.procinfo import start_time
from dispatch.core.units import MiB
from dispatch.local import wakeup
from dispatch.local.admitpolicy import Room
from dispatch.local.ledger import Ledger
from dispatch.local.ledgerdb import Booking
from tests.conftest import Hostrun, OtherUser, wait_for
from tests.support.handoff import NO_POLL, bell, no_status, start_holder, waiting_id


def test_a_release_rings_the_head_and_each_admission_the_next(hostrun: Hostrun, tmp_path: Path) -> None:
    """One 300M release lets three 100M waiters in: the head is rung, each admitted one rings the
    next; all three run at once (each waits for the others' marks)."""
    no_status(hostrun)
    holder, go = start_holder(hostrun, tmp_path, "300M")
    marks = tmp_path / "marks"
    marks.mkdir()
    waiters = []
    for name in ("a", "b", "c"):
        waiters.append(hostrun.popen(
            "-m", "100M", "--label", name, "--", "sh", "-c",
            f"touch {marks}/{name}; n=0; while [ $(ls {marks} | wc -l) -lt 3 ] && [ $n -lt 400 ];"
            f" do sleep 0.05; n=$((n+1)); done; [ $(ls {marks} | wc -l) -eq 3 ]", env=NO_POLL))
        wait_for(lambda name=name: bell(hostrun, name), timeout=30)  # type: ignore[misc]
    go.touch()
    assert holder.wait(timeout=30) == 0
    for w in waiters:
        assert w.wait(timeout=60) == 0, w.stderr.read() if w.stderr else ""
    assert hostrun.bookings() == []
    assert list((hostrun.state_dir / "wake").iterdir()) == []  # each waiter removed its FIFO


def test_a_head_held_by_its_group_passes_the_ring_on(hostrun: Hostrun, tmp_path: Path) -> None:
    """The head waits for its group's cap, which reserves no memory: a release it cannot use is
    passed on to the waiter behind it, which gets in."""
    no_status(hostrun, peers="[groups.build]\nmax_running = 1\n")
    build, build_go = start_holder(hostrun, tmp_path, "100M", "build-holder", "--group", "build")
    other, other_go = start_holder(hostrun, tmp_path, "200M", "other-holder")
    head = hostrun.popen("-m", "100M", "--group", "build", "--label", "head", "--", "true", env=NO_POLL)
    wait_for(lambda: bell(hostrun, "head"), timeout=30)
    behind = hostrun.popen("-m", "100M", "--label", "behind", "--", "true", env=NO_POLL)
    wait_for(lambda: bell(hostrun, "behind"), timeout=30)
    other_go.touch()  # frees 200M: the head is still held by its group; the one behind fits
    assert other.wait(timeout=30) == 0
    assert behind.wait(timeout=60) == 0, behind.stderr.read() if behind.stderr else ""
    assert head.poll() is None and waiting_id(hostrun, "head") is not None
    build_go.touch()
    assert build.wait(timeout=30) == 0
    assert head.wait(timeout=60) == 0, head.stderr.read() if head.stderr else ""
    assert hostrun.bookings() == []


def test_a_killed_head_waiter_passes_the_ring_to_the_next(hostrun: Hostrun, tmp_path: Path) -> None:
    """The head waiter is SIGKILLed: its FIFO has no reader, so the ring goes on to the next waiter,
    which reclaims the dead one's booking and its FIFO."""
    no_status(hostrun)
    holder, go = start_holder(hostrun, tmp_path, "250M")
    first = hostrun.popen("-m", "250M", "--label", "first", "--", "true", env=NO_POLL)
    dead_bell = wait_for(lambda: bell(hostrun, "first"), timeout=30)
    second = hostrun.popen("-m", "250M", "--label", "second", "--", "true", env=NO_POLL)
    wait_for(lambda: bell(hostrun, "second"), timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert dead_bell.exists()  # left behind by the kill
    go.touch()
    assert holder.wait(timeout=30) == 0
    assert second.wait(timeout=60) == 0, second.stderr.read() if second.stderr else ""
    assert hostrun.bookings() == []
    assert list((hostrun.state_dir / "wake").iterdir()) == []


def test_a_fifo_another_user_made_is_refused(hostrun: Hostrun, tmp_path: Path,
                                             other_user: OtherUser) -> None:
    """A waiter whose FIFO path holds another user's FIFO refuses it (exit 2, one line, nothing left
    booked), and a ringer never writes into it."""
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # booking 1: the next are 2 and 3
    wake = hostrun.state_dir / "wake"
    wake.mkdir(mode=0o700)
    planted = wake / "3"
    os.mkfifo(planted, 0o666)
    other_user.chown(planted)
    holder, go = start_holder(hostrun, tmp_path, "250M")  # booking 2
    waiter = hostrun.run("-m", "250M", "--label", "w", "--", "true", timeout=60, env=NO_POLL)  # booking 3
    assert waiter.returncode == 2
    errors = [line for line in waiter.stderr.splitlines() if line.startswith("hostrun: error:")]
    assert len(errors) == 1 and "refusing wake-up FIFO" in errors[0] and str(planted) in errors[0]
    assert "Traceback" not in waiter.stderr
    assert [b[1] for b in hostrun.bookings()] == ["holder"]
    reader = os.open(planted, os.O_RDWR | os.O_NONBLOCK)  # someone listens: still not ours to ring
    try:
        assert wakeup.ring(str(hostrun.state_dir), 3) == wakeup.ABSENT
        try:
            assert os.read(reader, 16) == b""
        except BlockingIOError:
            pass
    finally:
        os.close(reader)
    go.touch()
    assert holder.wait(timeout=30) == 0
    assert hostrun.bookings() == []
    assert planted.lstat().st_uid == other_user.uid  # left alone


def test_an_admission_rings_the_next_waiter_only_when_the_room_left_may_fit_one(hostrun: Hostrun) -> None:
    """The real ledger and doorbells: an admission that leaves room for nobody behind rings nobody;
    a release rings the head; an admission that leaves room for a waiter behind rings the next."""
    hostrun.state_dir.mkdir(mode=0o700, exist_ok=True)
    state = str(hostrun.state_dir)
    ledger = Ledger(state)
    me = os.getpid()

    def book(label: str, size: int) -> int:
        return ledger.enqueue(host="local", label=label, pid=me, pid_start=start_time(me) or 0,
                              size=size, cap=size, kind="cap", command=label, session=None)

    def room(limit: int) -> Callable[[list[Booking]], Room]:
        return lambda running: Room(limit - sum(b.size for b in running))

    head, big, small = book("head", 200 * MiB), book("big", 200 * MiB), book("small", 100 * MiB)
    bells = {b: wakeup.Doorbell(state, b) for b in (big, small)}
    try:
        assert ledger.try_admit(head, "local", room(250 * MiB)).admitted  # 50M left: fits nobody
        assert (bells[big].wait(0), bells[small].wait(0)) == ("", "")
        ledger.release(head)
        assert (bells[big].wait(0), bells[small].wait(0)) == ("!", "")
        assert ledger.try_admit(big, "local", room(300 * MiB)).admitted  # 100M left: small fits
        assert (bells[big].wait(0), bells[small].wait(0)) == ("", "!")
    finally:
        for b in bells.values():
            b.close()
        for booking in (head, big, small):
            ledger.release(booking)
        ledger.close()
