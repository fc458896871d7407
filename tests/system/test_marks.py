"""Marks in the peak table: a label killed because the slice filled (254) waits at its cap next time,
until ``clear_mark_after`` clean runs at its cap; a label that hit its own cap (250) says so too.

End to end with real cgroup v1 memory cgroups (a 254 produced by two jobs overflowing a small slice);
the ledger function itself (what a peer's agent runs too) and its journal replay, unit-level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dispatch.core.units import MiB
from tests.conftest import Hostrun, wait_for

PY = sys.executable
# The job prints its oom_score_adj: the booking kind seen from inside.
SHOW_ADJ = [PY, "-c", "print(open('/proc/self/oom_score_adj').read().strip())"]


def result(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def ledger_json(hostrun: Hostrun) -> dict[str, object]:
    proc = hostrun.run("ledger", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def peak_of(hostrun: Hostrun, label: str) -> dict[str, object]:
    (peak,) = [p for p in ledger_json(hostrun)["peaks"] if p["label"] == label]  # type: ignore[attr-defined]
    return peak  # type: ignore[no-any-return]


def run_victim(hostrun: Hostrun, out: Path) -> subprocess.CompletedProcess[str]:
    return hostrun.run("--label", "victim", "--result-file", str(out), "--", *SHOW_ADJ)


def test_slice_full_victim_waits_at_its_cap_until_three_clean_runs(hostrun: Hostrun,
                                                                    tmp_path: Path) -> None:
    hostrun.configure(slice="300M", top='gamble_size = "50M"')
    # "big" is booked at its 250M cap (adj 0) and holds 200M; "victim" is a gamble (50M, adj 1000)
    # that takes 150M: the slice overflows and the kernel kills the victim.
    ready = tmp_path / "big-ready"
    big = hostrun.popen("-m", "250M", "--label", "big", "--", PY, "-c",
                        f"import time, pathlib; x = bytearray(200 << 20); "
                        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(30)")
    try:
        wait_for(ready.exists, timeout=20)
        out = tmp_path / "v0.json"
        proc = hostrun.run("--label", "victim", "--result-file", str(out), "--", PY, "-c",
                           "x = bytearray(150 << 20)")
        assert proc.returncode == 254, proc.stderr
        assert result(out)["booking_kind"] == "gamble"
    finally:
        big.terminate()
        big.wait(timeout=30)
    peak = peak_of(hostrun, "victim")
    assert peak["slice_full_at"] is not None and peak["clean_runs"] == 0
    assert peak["hit_ceiling"] is False
    (why,) = peak["marked_because"]  # type: ignore[misc]
    assert why.startswith("killed when the slice filled at ") and "(0/3 clean runs" in why
    human = " ".join(hostrun.run("ledger").stdout.split())
    assert "victim on local: booked at its cap: killed when the slice filled at" in human

    # Marked: booked at its cap (no -m, no default_cap: the whole slice), oom_score_adj 0.
    for i in range(1, 4):
        out = tmp_path / f"v{i}.json"
        proc = run_victim(hostrun, out)
        assert proc.returncode == 0, proc.stderr
        r = result(out)
        assert (r["booking_kind"], r["booked_bytes"], proc.stdout.strip()) == ("cap", 300 * MiB, "0")
        if i < 3:
            assert peak_of(hostrun, "victim")["clean_runs"] == i
    cleared = peak_of(hostrun, "victim")
    assert cleared["slice_full_at"] is None and cleared["marked_because"] == []

    # Three clean runs at its cap: booked at its recorded peak again (adj 500).
    out = tmp_path / "v4.json"
    proc = run_victim(hostrun, out)
    assert proc.returncode == 0, proc.stderr
    assert (result(out)["booking_kind"], proc.stdout.strip()) == ("peak", "500")


def test_clear_mark_after_is_configurable_and_checked(hostrun: Hostrun, tmp_path: Path) -> None:
    hostrun.configure(top="clear_mark_after = 0")
    proc = hostrun.run("-m", "64M", "--", "true")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "clear_mark_after" in line and "greater than or equal to 1" in line


def test_own_cap_shows_its_reason_in_the_ledger(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "100M", "--label", "hog", "--", PY, "-c", "x = bytearray(300 << 20)")
    assert proc.returncode == 250, proc.stderr
    peak = peak_of(hostrun, "hog")
    assert peak["hit_ceiling"] is True and peak["ceiling_at"] is not None
    (why,) = peak["marked_because"]  # type: ignore[misc]
    assert why.startswith("hit its own cap at ")
    assert "hog on local: booked at its cap: hit its own cap at" in " ".join(
        hostrun.run("ledger").stdout.split())


# -- the ledger function (a peer's agent records its runs through the same code) -------------------
def test_mark_rules_in_the_ledger_and_after_a_journal_replay(tmp_path: Path) -> None:
    from dispatch.local.admission.booking import plan_booking
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store.ledgerdb import CLEAN, NO_EVENT, OOM_KILLED, SLICE_FULL

    state = tmp_path / "state"
    said: list[str] = []
    ledger = Ledger(str(state), said.append, lambda: [])

    def plan() -> tuple[str, int, int]:
        p = plan_booking(cap=None, peak=ledger.peak("build", "peer"), slice_limit=1000 * MiB,
                         gamble_size=50 * MiB)
        return p.kind, p.size, p.oom_score_adj

    def run(event: str, clear_after: int = 2) -> None:
        ledger.record_peak("build", "peer", 100 * MiB, False, 1.0, cap=None, event=event,
                           clear_after=clear_after)

    run(NO_EVENT)
    assert plan() == ("peak", 100 * MiB, 500)
    run(SLICE_FULL)
    assert plan() == ("cap", 1000 * MiB, 0)
    run(CLEAN)
    run(OOM_KILLED)  # an OOM kill starts the count again
    run(NO_EVENT)  # a failed run counts neither way
    run(CLEAN)
    peak = ledger.peak("build", "peer")
    assert peak is not None and peak.clean_runs == 1 and plan()[0] == "cap"
    # The journal replays the marks as they were.
    before = ledger.peaks()
    ledger.close()
    (state / "ledger.sqlite3").write_bytes(b"garbage" * 1000)
    ledger = Ledger(str(state), said.append, lambda: [])
    assert ledger.peaks() == before
    run(CLEAN)  # the second in a row: cleared
    peak = ledger.peak("build", "peer")
    assert peak is not None and peak.slice_full_at is None and peak.clean_runs == 0
    assert plan() == ("peak", 100 * MiB, 500)
    ledger.close()


def test_a_version_4_ledger_gains_the_mark_columns(tmp_path: Path) -> None:
    """An older ledger (peaks without the marks) is migrated in place, its rows unmarked."""
    import sqlite3

    from dispatch.local.admission.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / "ledger.sqlite3")
    db.executescript(
        "CREATE TABLE peaks (label TEXT NOT NULL, host TEXT NOT NULL, max_peak INTEGER NOT NULL,"
        " runs INTEGER NOT NULL, last_peak INTEGER NOT NULL, hit_ceiling INTEGER NOT NULL,"
        " last_duration REAL, max_duration REAL, updated REAL NOT NULL, PRIMARY KEY (label, host));"
        "INSERT INTO peaks VALUES ('old', 'local', 5, 1, 5, 1, 1.0, 1.0, 1.0);"
        "PRAGMA user_version=4;")
    db.close()
    os.chmod(state / "ledger.sqlite3", 0o600)
    ledger = Ledger(str(state), lambda line: None, lambda: [])
    (old,) = ledger.peaks()
    assert (old.hit_ceiling, old.ceiling_at, old.slice_full_at, old.clean_runs) == (True, None, None, 0)
    ledger.close()


def test_capacity_books_a_marked_label_at_its_cap() -> None:
    """``hostrun capacity`` predicts the booking the ledger will make: a 254 mark means the cap."""
    from dispatch.local.capacity import LabelPeaks, assess
    from dispatch.local.store.ledgerdb import PeakRecord

    p = LabelPeaks(PeakRecord("victim", "local", 100 * MiB, 1, 100 * MiB, False, None, None, 0.0,
                              slice_full_at=0.0))
    a = assess(p, slice_limit=1000 * MiB, default_cap=None, gamble_size=50 * MiB)
    assert (a.now.kind, a.now.booked) == ("cap", 1000 * MiB)
    assert "killed when the slice filled" in a.now.why
