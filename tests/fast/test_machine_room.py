"""The machine, not just the slice: admission and the dispatcher also need the machine's available
memory (MemAvailable less what running bookings have yet to use) to cover a job; a default reserve
that leaves no slice is one line and exit 78.

Pure: a backend whose slice usage and job samples are given, /proc/meminfo figures passed in, a real
ledger in tmp_path. The same rule on a real kernel, with memory really taken outside the slice, is in
tests/vm/test_vm_peer.py and tests/vm/test_vm_systemd.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dispatch.capping.base import CapBackend, SliceUsage
from dispatch.core.errors import NotRunError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.hostfacts import MemInfo
from dispatch.core.procinfo import start_time
from dispatch.core.settings import HostSettings
from dispatch.core.units import GiB, MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.admission.rooms import room_function, status_line, wait_reason
from dispatch.local.store.ledgerdb import NewBooking


class _Job:
    def __init__(self, used: int) -> None:
        self.used = used

    def sample(self) -> int:
        return self.used

    def in_use(self) -> int:  # JobCgroup.in_use: a look from outside the run
        return self.used


class FakeBackend(CapBackend):
    """Slice usage and each job's memory in use, as given (a stand-in for the cgroup files)."""

    name = "fake"
    slice_dir = "/fake"

    def __init__(self, used: int = 0, jobs: dict[str, int] | None = None) -> None:
        self.used = used
        self.jobs = jobs or {}

    def describe(self) -> str:
        return "fake"

    def ensure_slice(self, limit: int) -> None:
        pass

    def slice_usage(self) -> SliceUsage:
        return SliceUsage(limit=0, usage=self.used, held=self.used)

    def create_job(self, job_id: str, cap: int) -> Any:
        raise NotImplementedError

    def job_at(self, path: str) -> Any:
        return _Job(self.jobs[path]) if path in self.jobs else None


def book(ledger: Ledger, label: str, size: int, cgroup: str | None = None) -> int:
    me = os.getpid()
    return ledger.enqueue(NewBooking(host="local", label=label, pid=me, pid_start=start_time(me) or 0,
                                     size=size,
                                     cap=size, kind="cap", command=label, session=None, cgroup=cgroup))


def test_the_slice_decides_while_the_machine_has_more(tmp_path: Path) -> None:
    room = room_function(FakeBackend(), 2 * GiB, lambda: MemInfo(8 * GiB, 6 * GiB))
    assert room([]) == (2 * GiB, None)
    above = room_function(FakeBackend(used=GiB), 2 * GiB, lambda: MemInfo(8 * GiB, 6 * GiB))([])
    assert above.free == GiB + 32 * MiB  # usage above the bookings, past the slack, counts


def test_memory_used_outside_the_slice_holds_a_job_and_says_so(tmp_path: Path) -> None:
    """An empty 1.5 GiB slice on a 2 GiB machine whose desktop took 1.2 GiB: a 600 MiB job must not
    start into a machine-wide OOM."""
    ledger = Ledger(str(tmp_path / "state"))
    try:
        room = room_function(FakeBackend(), 1536 * MiB, lambda: MemInfo(2 * GiB, 500 * MiB))
        first = book(ledger, "build", 600 * MiB)
        adm = ledger.try_admit(first, "local", room, backfill=True)  # the default queue policy
        assert not adm.admitted and not adm.memory_ok
        assert adm.free == 500 * MiB
        assert adm.machine is not None and "the machine has 500 MiB available" in adm.machine
        line = status_line(adm)
        assert line.startswith("waiting: 600 MiB needed, 500 MiB free; the machine has 500 MiB available")
        assert "memory used outside the slice holds it" in line
        assert "memory used outside the slice" in wait_reason(adm)
        # The desktop closes: the same booking gets in.
        room = room_function(FakeBackend(), 1536 * MiB, lambda: MemInfo(2 * GiB, 1800 * MiB))
        assert ledger.try_admit(first, "local", room).admitted
        ledger.release(first)
    finally:
        ledger.close()


def test_bookings_not_yet_at_their_peak_are_taken_off_what_the_machine_has(tmp_path: Path) -> None:
    """A running job booked 1 GiB that uses 100 MiB so far will take 924 MiB more: MemAvailable does
    not know that yet, the room does."""
    ledger = Ledger(str(tmp_path / "state"))
    try:
        me = os.getpid()
        job = f"/fake/job-{me}-{start_time(me) or 0}"  # the name its holder (this process) gives it
        backend = FakeBackend(used=100 * MiB, jobs={job: 100 * MiB})
        running = book(ledger, "big", GiB, job)
        room = room_function(backend, 3 * GiB, lambda: MemInfo(4 * GiB, 2 * GiB))
        assert ledger.try_admit(running, "local", room).admitted
        second = book(ledger, "next", 1200 * MiB)
        adm = ledger.try_admit(second, "local", room)
        assert adm.free == 2 * GiB - 924 * MiB  # not the slice's 2 GiB
        assert not adm.admitted and adm.machine is not None
        assert "less 924 MiB booked by running jobs and not yet used" in adm.machine
        ledger.release(second)
        ledger.release(running)
    finally:
        ledger.close()


def test_an_unreadable_meminfo_leaves_the_slice_to_decide() -> None:
    def broken() -> MemInfo:
        raise OSError("no /proc")

    assert room_function(FakeBackend(), GiB, broken)([]) == (GiB, None)


# ------------------------------------------------------------------------------------ default reserve
def test_a_default_reserve_that_leaves_no_slice_is_one_line_and_78() -> None:
    with pytest.raises(NotRunError) as err:
        HostSettings("local").slice_limit(2 * GiB - 80 * MiB, "/home/u/.config/hostrun/hosts.toml")
    assert err.value.exit_code == ExitCode.NOT_RUN
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("this machine has 1.9 GiB of RAM, and the default reserve (max(2 GiB, RAM/5) "
                           "= 2.0 GiB")
    assert text.endswith('add slice = "896M" under [hosts.local] in /home/u/.config/hostrun/hosts.toml')
    assert HostSettings("local").slice_limit(16 * GiB) == 16 * GiB - (16 * GiB) // 5 * 1
    assert HostSettings("local", slice_bytes=GiB).slice_limit(2 * GiB) == GiB  # a set slice stands
