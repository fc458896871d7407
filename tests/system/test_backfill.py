"""Backfill (queue_policy "backfill", EASY): a later job starts ahead of a memory-blocked head only
when its recorded duration says it cannot delay it. Pure tests of the shadow computation, then real
jobs in a real cgroup v1 slice with label histories written through the Ledger API (what a run does)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dispatch.core.configfile import settings_from_dict
from dispatch.core.errors import ConfigError
from dispatch.local.admission.backfill import INF, Shadow, decide, estimate, expected_end, jump, shadow
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store.ledgerdb import Booking
from tests.conftest import Hostrun, wait_for
from tests.support.handoff import no_status, start_holder, waiting_id

MIB = 1 << 20
NOW = 1000.0


def booking(id: int, label: str, size_mib: int, state: str = "waiting", since: float | None = None,
            gpu: int | None = None) -> Booking:
    return Booking(id, "local", label, state, 1, 1, size_mib * MIB, size_mib * MIB, "cap", None, label,
                   None, 0.0, since, None, gpu_bytes=gpu)


# -- the shadow, on constructed figures --
def test_shadow_is_the_first_known_end_that_makes_room_for_the_head() -> None:
    sh = shadow(300, 100, [(200, NOW + 10), (100, NOW + 5)], NOW)
    assert sh == Shadow(NOW + 10, 100)  # 100 free + 100 at +5 + 200 at +10 = 400: 100 left over


def test_shadow_of_a_head_that_unknown_jobs_could_free_is_now_with_nothing_left_over() -> None:
    # The unknown job may end at any moment: its room may be the head's at once.
    assert shadow(300, 100, [(200, None), (100, NOW + 5)], NOW) == Shadow(NOW, 0)
    # Known ends alone would free it at +50 with 400 spare, but the unknown one could make the head
    # fit sooner (at +5) with no room to spare: no leftover is promised.
    assert shadow(300, 100, [(100, None), (100, NOW + 5), (500, NOW + 50)], NOW) == Shadow(NOW + 5, 0)


def test_shadow_counts_an_unknown_job_that_cannot_free_the_head_as_holding_its_room() -> None:
    assert shadow(500, 100, [(50, None), (900, NOW + 10)], NOW) == Shadow(NOW + 10, 500)


def test_shadow_without_known_ends_is_never() -> None:
    assert shadow(300, 100, [], NOW) == Shadow(INF, 0)


def test_expected_end_is_unknown_without_a_duration_and_once_overdue() -> None:
    assert expected_end(NOW - 1, 8.0, NOW) == NOW - 1 + estimate(8.0)
    assert expected_end(NOW - 1, None, NOW) is None
    assert expected_end(NOW - 100, 8.0, NOW) is None  # past its estimate: may end any moment


def test_jump_rules() -> None:
    sh = Shadow(NOW + 40, 30)
    assert jump(60, 1.0, 80, sh, NOW) == "ends"
    assert jump(60, None, 80, sh, NOW) is None  # no recorded duration: never jumps
    assert jump(60, 100.0, 80, sh, NOW) is None  # outlasts the shadow, more than the leftover
    assert jump(20, 100.0, 80, sh, NOW) == "leftover"
    assert jump(90, 1.0, 80, sh, NOW) is None  # does not fit now


def test_decide_scans_the_queue_in_order() -> None:
    running = [booking(1, "a", 100, "running", NOW), booking(2, "b", 120, "running", NOW)]
    durations = {"a": 30.0, "b": 1000.0, "quick": 1.0, "slow": 100.0}
    head = booking(3, "big", 150)
    free = 80 * MIB
    quick = decide(booking(4, "quick", 60), [head], running, free, durations, NOW)
    assert quick.admit and quick.how == "ends" and quick.head == head
    assert quick.shadow == Shadow(NOW + estimate(30.0), 30 * MIB)
    assert not decide(booking(4, "slow", 60), [head], running, free, durations, NOW).admit
    assert not decide(booking(4, "new", 60), [head], running, free, durations, NOW).admit
    assert decide(booking(4, "slow", 20), [head], running, free, durations, NOW).how == "leftover"
    assert not decide(booking(4, "quick", 60, gpu=MIB), [head], running, free, durations, NOW).admit
    # A second quick job behind the first: the first took 60 of the 80 free.
    assert not decide(booking(5, "quick", 60), [head, booking(4, "quick", 60)], running, free,
                      durations, NOW).admit
    # Two slow small ones share the 30 left over at the head's start: the second no longer fits it.
    assert not decide(booking(5, "slow", 20), [head, booking(4, "slow", 20)], running, free,
                      durations, NOW).admit
    # The head itself and a job with room and no head are decided as FIFO does.
    assert not decide(head, [], running, free, durations, NOW).admit
    assert decide(booking(4, "new", 60), [], running, free, durations, NOW).admit


def test_a_waiter_that_starts_first_counts_as_running_for_the_shadow() -> None:
    # 'new' (no duration) fits and starts ahead of the head: its room may come back at any moment.
    running = [booking(1, "a", 100, "running", NOW)]
    verdict = decide(booking(4, "quick", 20), [booking(2, "new", 100), booking(3, "big", 150)], running,
                     200 * MIB, {"a": 30.0, "quick": 1.0}, NOW)
    assert not verdict.admit and verdict.shadow == Shadow(NOW, 0)


# -- real jobs --
SIZES = {"hold-a": 100, "hold-b": 120, "big": 150, "small": 60}  # MiB: caps, and recorded peaks


def seed(hostrun: Hostrun, durations: dict[str, float]) -> None:
    """Label histories, written as a finished run writes them (a label with a recorded peak is
    booked at it: the peak is its size)."""
    ledger = Ledger(str(hostrun.state_dir))
    try:
        for label, seconds in durations.items():
            ledger.record_peak(label, "local", SIZES[label] * MIB, False, seconds, cap=None)
    finally:
        ledger.close()


def marked(hostrun: Hostrun, marks: Path, name: str, size: str, hold: bool = False
           ) -> subprocess.Popen[str]:
    """A job that stamps its start (and end) in marks/NAME; ``hold``: runs until marks/release."""
    wait = f"while [ ! -e {marks}/release ]; do sleep 0.05; done; " if hold else ""
    return hostrun.popen("-m", size, "--label", name, "--", "sh", "-c",
                         f"date +%s.%N > {marks}/{name}; {wait}date +%s.%N >> {marks}/{name}")


def reason_of(hostrun: Hostrun, label: str) -> str:
    queue = json.loads(hostrun.run("ledger", "--json").stdout)["queue"]
    return next((q["reason"] for q in queue if q["label"] == label and q["reason"]), "")


def scenario(hostrun: Hostrun, tmp_path: Path, durations: dict[str, float], top: str = ""
             ) -> tuple[Path, list[subprocess.Popen[str]]]:
    """Slice 300M; running: hold-a (100M) and hold-b (120M) until released; head: big (150M), which
    does not fit the 80M free; then small (60M) arrives behind it."""
    hostrun.configure(slice="300M", top=top)
    seed(hostrun, durations)
    marks = tmp_path / "marks"
    marks.mkdir()
    procs = [marked(hostrun, marks, "hold-a", "100M", hold=True),
             marked(hostrun, marks, "hold-b", "120M", hold=True)]
    wait_for(lambda: (marks / "hold-a").exists() and (marks / "hold-b").exists())
    procs.append(marked(hostrun, marks, "big", "150M"))
    wait_for(lambda: reason_of(hostrun, "big"), timeout=20)
    procs.append(marked(hostrun, marks, "small", "60M"))
    return marks, procs


def queue_log(hostrun: Hostrun) -> str:
    path = hostrun.state_dir / "queue.log"
    return path.read_text() if path.exists() else ""


def finish(marks: Path, procs: list[subprocess.Popen[str]]) -> dict[str, tuple[float, float]]:
    (marks / "release").write_text("")
    for p in procs:
        p.wait(timeout=60)
        assert p.returncode == 0, p.stderr.read() if p.stderr else ""
    return {f.name: tuple(float(x) for x in f.read_text().split())  # type: ignore[misc]
            for f in marks.iterdir() if f.name != "release"}


def jumped(spans: dict[str, tuple[float, float]]) -> bool:
    """Did small start while big waited for room? (Once both holders are gone FIFO may admit small
    before big gets to it: then both fit, nothing is jumped.)"""
    start = spans["small"][0]
    return start < spans["big"][0] and start < max(spans["hold-a"][1], spans["hold-b"][1])


def assert_held_behind_head(hostrun: Hostrun, marks: Path, procs: list[subprocess.Popen[str]],
                            why: str) -> None:
    reason = wait_for(lambda: reason_of(hostrun, "small"), timeout=20)
    assert "waiting for head big (booking" in reason and why in reason
    spans = finish(marks, procs)
    assert not jumped(spans)
    assert "BACKFILL" not in queue_log(hostrun)


def test_a_short_job_starts_ahead_of_a_blocked_head(hostrun: Hostrun, tmp_path: Path) -> None:
    marks, procs = scenario(hostrun, tmp_path, {"hold-a": 30, "hold-b": 1000, "small": 1})
    wait_for(lambda: (marks / "small").exists(), timeout=20)
    assert len((marks / "hold-a").read_text().split()) == 1  # the holders are still running
    assert not (marks / "big").exists()
    assert jumped(finish(marks, procs))
    log = queue_log(hostrun)
    assert "BACKFILL small (booking" in log and "ahead of head big (booking" in log
    assert "ends before it" in log


def test_a_job_without_a_recorded_duration_does_not_jump(hostrun: Hostrun, tmp_path: Path) -> None:
    marks, procs = scenario(hostrun, tmp_path, {"hold-a": 30, "hold-b": 1000})
    assert_held_behind_head(hostrun, marks, procs, "no recorded duration")


def test_a_job_longer_than_the_shadow_and_the_leftover_does_not_jump(hostrun: Hostrun, tmp_path: Path
                                                                      ) -> None:
    marks, procs = scenario(hostrun, tmp_path, {"hold-a": 30, "hold-b": 1000, "small": 100})
    assert_held_behind_head(hostrun, marks, procs, "outlasts it")


def test_fifo_policy_keeps_arrival_order(hostrun: Hostrun, tmp_path: Path) -> None:
    marks, procs = scenario(hostrun, tmp_path, {"hold-a": 30, "hold-b": 1000, "small": 1},
                            top='queue_policy = "fifo"')
    wait_for(lambda: reason_of(hostrun, "small"), timeout=20)
    spans = finish(marks, procs)
    assert not jumped(spans)
    assert "BACKFILL" not in queue_log(hostrun)


def test_a_running_job_without_a_recorded_duration_blocks_backfill(hostrun: Hostrun, tmp_path: Path
                                                                   ) -> None:
    # hold-a may end at any moment, and then the head fits at once: nothing may take that room.
    marks, procs = scenario(hostrun, tmp_path, {"hold-b": 1000, "small": 1})
    assert_held_behind_head(hostrun, marks, procs, "outlasts it")


def test_unknown_queue_policy_is_a_config_error(hostrun: Hostrun) -> None:
    hostrun.configure(top='queue_policy = "lifo"')
    proc = hostrun.run("--", "true")
    assert proc.returncode == 2
    assert "queue_policy: must be one of backfill, fifo, not 'lifo'" in proc.stderr


def test_a_release_the_blocked_head_cannot_use_lets_a_job_jump_it(hostrun: Hostrun, tmp_path: Path
                                                                    ) -> None:
    """A release the head cannot use (through the admission engine, which tries its waiters after
    it): the backfill candidate behind the head gets in while the head still waits."""
    no_status(hostrun)
    ledger = Ledger(str(hostrun.state_dir))
    for label, size in (("h1", 200), ("h2", 60), ("small", 80)):
        ledger.record_peak(label, "local", size * MIB, False, 1000.0 if label != "small" else 1.0,
                           cap=None)
    ledger.close()
    h1, go1 = start_holder(hostrun, tmp_path, "200M", "h1")
    h2, go2 = start_holder(hostrun, tmp_path, "60M", "h2")
    big = hostrun.popen("-m", "250M", "--label", "big", "--", "true")
    wait_for(lambda: waiting_id(hostrun, "big"), timeout=30)
    small = hostrun.popen("-m", "80M", "--label", "small", "--", "true")
    wait_for(lambda: waiting_id(hostrun, "small"), timeout=30)  # 40M free: it waits too
    go2.touch()  # 100M free: not enough for big; small may jump it
    assert small.wait(timeout=60) == 0, small.stderr.read() if small.stderr else ""
    assert waiting_id(hostrun, "big") is not None  # the head still waits for h1
    assert "BACKFILL small (booking" in queue_log(hostrun)
    go1.touch()
    for p in (h1, h2, big):
        assert p.wait(timeout=60) == 0


def test_the_agents_parser_checks_queue_policy_as_pydantic_does() -> None:
    """A peer's agent builds its settings without pydantic: the same check, the same default."""
    assert settings_from_dict({}, "x.toml").queue_policy == "backfill"
    assert settings_from_dict({"queue_policy": "fifo"}, "x.toml").queue_policy == "fifo"
    with pytest.raises(ConfigError, match="queue_policy: must be one of backfill, fifo, not 'lifo'"):
        settings_from_dict({"queue_policy": "lifo"}, "x.toml")
