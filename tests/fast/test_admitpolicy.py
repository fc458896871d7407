"""The admission policy on its own (``dispatch.local.admission.policy``): bookings in, verdict out, no
SQLite, no processes. The ledger's tests (test_admission, test_backfill, test_gpu) cover the same
rules through the store and real waiters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch.core.units import GiB
from dispatch.local.admission.policy import Admission, Room, evaluate, passed_over
from dispatch.local.store.ledgerdb import Booking

NOW = 1_000_000.0


def booking(id: int, size: int, state: str = "waiting", *, label: str = "job", grp: str | None = None,
            when_idle: bool = False, gpu_bytes: int | None = None, gpu_index: int | None = None,
            since: float | None = None) -> Booking:
    return Booking(id, "local", label, state, 1000 + id, 1, size, size, "cap", None, "cmd", None,
                   NOW - 100, since if since is not None else (NOW - 50 if state == "running" else None),
                   None, gpu_index, gpu_bytes, grp, when_idle)


def room_of(limit: int) -> Callable[[list[Booking]], Room]:
    return lambda running: Room(limit - sum(b.size for b in running))


def test_fifo_reserves_every_earlier_waiters_need() -> None:
    rows = [booking(1, 3 * GiB, "running"), booking(2, 4 * GiB), booking(3, 2 * GiB)]
    head = evaluate(2, rows, room_of(8 * GiB))
    assert head.admitted and head.free == 5 * GiB and head.ahead == 0 and head.position == 0
    behind = evaluate(3, rows, room_of(8 * GiB))
    assert not behind.admitted and not behind.memory_ok
    assert (behind.need, behind.free, behind.ahead, behind.position) == (2 * GiB, 5 * GiB, 4 * GiB, 1)
    assert [b.id for b in behind.holders] == [1]


def test_a_stopped_waiter_holds_nobody_up() -> None:
    rows = [booking(1, 3 * GiB, "running"), booking(2, 4 * GiB), booking(3, 2 * GiB)]
    adm = evaluate(3, rows, room_of(8 * GiB), stopped=lambda b: b.id == 2)
    assert adm.admitted and adm.ahead == 0 and adm.position == 1


def test_group_cap_holds_its_group_and_reserves_nothing_for_the_others() -> None:
    rows = [booking(1, GiB, "running", grp="build"), booking(2, 4 * GiB, grp="build"),
            booking(3, 4 * GiB, grp="test")]
    groups = {"build": 1}
    held = evaluate(2, rows, room_of(8 * GiB), groups=groups)
    assert not held.admitted and held.memory_ok and held.policy == "group-cap build 1/1"
    other = evaluate(3, rows, room_of(8 * GiB), groups=groups)
    assert other.admitted and other.ahead == 0 and other.policy is None
    # without the cap, FIFO holds the second one behind the first
    assert not evaluate(3, rows, room_of(8 * GiB)).admitted


def test_when_idle_waits_for_an_empty_host() -> None:
    rows = [booking(1, GiB, "running", label="busy"), booking(2, GiB, label="idle", when_idle=True)]
    adm = evaluate(2, rows, room_of(8 * GiB))
    assert not adm.admitted and adm.policy == "when-idle idle — 1 running"
    assert evaluate(2, rows[1:], room_of(8 * GiB)).admitted


def test_the_gpu_is_chosen_by_room_and_fifo_among_gpu_waiters() -> None:
    rows = [booking(1, GiB, gpu_bytes=4 * GiB)]
    rooms = {0: 2 * GiB, 1: 6 * GiB}
    adm = evaluate(1, rows, room_of(8 * GiB), lambda running: rooms)
    assert adm.admitted and adm.gpu_ok
    assert (adm.gpu_need, adm.gpu_device, adm.gpu_free) == (4 * GiB, 1, 6 * GiB)
    # an earlier GPU waiter takes GPU 1 first: 1 GiB is left there, 2 GiB on GPU 0, neither fits
    rows = [booking(1, GiB, gpu_bytes=5 * GiB), booking(2, GiB, gpu_bytes=4 * GiB)]
    adm = evaluate(2, rows, room_of(8 * GiB), lambda running: rooms)
    assert not adm.admitted and adm.memory_ok and not adm.gpu_ok
    assert (adm.gpu_device, adm.gpu_free, adm.gpu_ahead) == (1, 6 * GiB, 5 * GiB)
    # no GPU room known at all
    adm = evaluate(1, rows[:1], room_of(8 * GiB))
    assert not adm.admitted and adm.gpu_device is None and not adm.gpu_ok


def test_the_machine_note_and_a_running_booking() -> None:
    rows = [booking(1, 2 * GiB, "running"), booking(2, 4 * GiB)]
    adm = evaluate(2, rows, lambda running: Room(GiB, "the machine is short"))
    assert not adm.admitted and adm.machine == "the machine is short"
    assert evaluate(1, rows, lambda running: Room(0)).admitted  # admitted already
    with pytest.raises(LookupError, match="booking 9 vanished"):
        evaluate(9, rows, room_of(GiB))


def test_backfill_jumps_a_blocked_head_only_with_a_short_enough_duration() -> None:
    rows = [booking(1, 6 * GiB, "running", label="long", since=NOW - 10),
            booking(2, 8 * GiB, label="big"), booking(3, 2 * GiB, label="short")]
    durations = {"long": 100.0, "short": 10.0}
    plain = evaluate(3, rows, room_of(8 * GiB))
    assert not plain.admitted and plain.backfill is None and plain.head is None
    jumped = evaluate(3, rows, room_of(8 * GiB), durations=lambda: durations, now=NOW)
    assert jumped.admitted and jumped.memory_ok
    assert jumped.backfill == ("BACKFILL short (booking 3, need 2.0 GiB, est 14s) ahead of head big "
                               "(booking 2, need 8.0 GiB, room in ~116s): ends before it")
    # no recorded duration: held by the head's reservation, and says so
    held = evaluate(3, rows, room_of(8 * GiB), durations=lambda: {"long": 100.0}, now=NOW)
    assert not held.admitted and held.head is not None
    assert held.head.startswith("waiting for head big") and held.head.endswith("no recorded duration")


def test_durations_are_read_only_when_fifo_holds_the_booking() -> None:
    def unread() -> dict[str, float]:
        raise AssertionError("read")

    rows = [booking(1, GiB)]
    assert evaluate(1, rows, room_of(8 * GiB), durations=unread).admitted


def test_passed_over_names_each_earlier_waiters_reason() -> None:
    earlier = [booking(1, 4 * GiB, label="big"), booking(2, GiB, label="grouped", grp="build")]
    adm = Admission(True, GiB, 3 * GiB, 0, 2, [booking(9, GiB, "running", grp="build")], [])
    assert passed_over(3, earlier, adm, {"build": 1}) == [
        "SKIP memory big need 4.0 GiB free 3.0 GiB (booking 1, passed by booking 3)",
        "SKIP group-cap build 1/1 (booking 2, passed by booking 3)",
    ]
