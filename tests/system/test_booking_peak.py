"""Which runs set a label's booking peak: one that exits 0 (or hits its own cap); a run that fails
may raise it, never set it, so a build that fails in its first seconds does not book the real build
at a fraction of what it needs (docs/admission.md, "The peak table").

Real runs with real cgroup v1 memory cgroups, the booking read back from each run's result file;
then the same through a rebuild of the ledger from its journal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dispatch.core.units import MiB
from tests.conftest import Hostrun

PY = sys.executable


def build(hostrun: Hostrun, tmp_path: Path, mib: int, code: int) -> dict[str, object]:
    """One run of the label ``build``: ``mib`` MiB touched, then exit ``code``; its result file."""
    out = tmp_path / "result.json"
    proc = hostrun.run("-l", "build", "-m", "250M", "--result-file", str(out), "--", PY, "-c",
                       f"import sys; x = bytearray({mib} << 20); sys.exit({code})")
    assert proc.returncode == code, proc.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def booking_peak(hostrun: Hostrun) -> tuple[int, int, int]:
    """The label's (max_peak, last_peak, runs) in the peak table."""
    proc = hostrun.run("ledger", "--json")
    assert proc.returncode == 0, proc.stderr
    (peak,) = [p for p in json.loads(proc.stdout)["peaks"] if p["label"] == "build"]
    return peak["max_peak"], peak["last_peak"], peak["runs"]


def test_a_failed_run_may_raise_the_booking_peak_never_set_it(hostrun: Hostrun, tmp_path: Path) -> None:
    first = build(hostrun, tmp_path, 10, 1)  # fails fast, having touched little
    assert first["booking_kind"] == "cap"
    max_peak, last_peak, runs = booking_peak(hostrun)
    assert (max_peak, runs) == (0, 1) and last_peak >= 10 * MiB  # recorded, but no booking peak
    assert first["peak_bytes"] == last_peak
    real = build(hostrun, tmp_path, 80, 0)  # the real build: booked at its cap, not at 10 MiB
    assert (real["booking_kind"], real["booked_bytes"]) == ("cap", 250 * MiB), real
    max_peak, _, _ = booking_peak(hostrun)
    assert max_peak == real["peak_bytes"] and max_peak >= 80 * MiB  # a success sets it
    again = build(hostrun, tmp_path, 10, 2)  # fails fast again: booked at the peak, never lowers it
    assert (again["booking_kind"], again["booked_bytes"]) == ("peak", max_peak), again
    assert booking_peak(hostrun)[0] == max_peak
    bigger = build(hostrun, tmp_path, 150, 3)  # a failure that went further raises it
    assert isinstance(bigger["peak_bytes"], int) and bigger["peak_bytes"] > max_peak
    assert booking_peak(hostrun)[0] == bigger["peak_bytes"]


def test_the_rule_holds_through_a_rebuild_from_the_journal(tmp_path: Path) -> None:
    """The journal carries each run's event, so a rebuilt peak table is the one that was there:
    a failed first run leaves no booking peak, a run that hit its own cap sets one (booked at its
    cap for good anyway), a success sets it."""
    from dispatch.local.admission.booking import plan_booking
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store.ledgerdb import FAILED, NO_EVENT, OOM_KILLED

    state = tmp_path / "state"
    ledger = Ledger(str(state), lambda line: None, lambda: [])
    ledger.record_peak("fails", "local", 96 * MiB, False, 3.0, cap=None, event=FAILED)
    ledger.record_peak("hog", "local", 200 * MiB, True, 3.0, cap=200 * MiB, event=OOM_KILLED)
    ledger.record_peak("ok", "local", 50 * MiB, False, 3.0, cap=None, event=NO_EVENT)
    ledger.record_peak("ok", "local", 20 * MiB, False, 1.0, cap=None, event=FAILED)
    before = ledger.peaks()
    assert {p.label: p.max_peak for p in before} == {"fails": 0, "hog": 200 * MiB, "ok": 50 * MiB}
    fails = ledger.peak("fails", "local")
    plan = plan_booking(cap=None, peak=fails, slice_limit=1000 * MiB, gamble_size=64 * MiB)
    assert (plan.kind, plan.size) == ("gamble", 64 * MiB)  # as a label with no record
    ledger.close()
    (state / "ledger.sqlite3").write_bytes(b"garbage" * 1000)
    ledger = Ledger(str(state), lambda line: None, lambda: [])
    try:
        assert ledger.peaks() == before
    finally:
        ledger.close()
