"""Ramp profiles: a run's cumulative maximum memory at each tenth of its runtime, folded per label
as the pointwise maximum with the fastest run's duration, kept through the peak journal (a damaged
ledger rebuilt from it, compacted or not, has the same profiles), and shown with the time to peak.

Pure functions with exact numbers; the fold and the journal on a real SQLite ledger; one real run
under cgroups that records a profile and ``hostrun ledger --json`` shows it.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from dispatch.core.units import MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store import peakjournal, ramp
from dispatch.local.store.ledgerdb import SCHEMA_VERSION
from tests.conftest import Hostrun

PY = sys.executable


def test_a_profile_is_the_running_maximum_at_each_tenth() -> None:
    # 10 s: 100 at 0.5 s, 300 at 2.5 s, 900 at 7.2 s; the kernel's high-water mark says 1000.
    rises = [(0.5, 100), (2.5, 300), (7.2, 900)]
    assert ramp.profile(rises, 10.0, 1000) == (100, 100, 300, 300, 300, 300, 300, 900, 900, 1000)
    # The end point is the peak even when no sample reached it.
    assert ramp.profile([], 4.0, 50) == (0,) * 9 + (50,)
    assert ramp.profile([(0.0, 70)], 1.0, 60) == (70,) * 10  # a sample above the given peak counts


def test_the_fold_is_pointwise_and_the_time_to_peak_is_the_first_tenth_at_90_percent() -> None:
    early = (0, 0, 90, 90, 90, 90, 90, 90, 90, 100)
    late = (10,) * 8 + (95, 95)
    assert ramp.fold(early, late) == (10, 10, 90, 90, 90, 90, 90, 90, 95, 100)
    assert ramp.fold(None, late) == late
    assert ramp.time_to_peak(early) == 0.3
    assert ramp.time_to_peak(late) == 0.9
    assert ramp.time_to_peak(None) is None and ramp.time_to_peak((0,) * 10) is None
    assert ramp.decode(ramp.encode(early)) == early
    assert ramp.decode("1,2,3") is None and ramp.decode("a,b") is None and ramp.decode(None) is None
    # The point of the tenth a phase is in; the peak from the end on.
    assert [ramp.at_phase(early, p) for p in (0.0, 0.19, 0.2, 0.95, 1.0, 7.0)] == [0, 0, 90, 100,
                                                                                   100, 100]


def test_the_ledger_folds_profiles_and_a_rebuild_from_the_journal_keeps_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    said: list[str] = []
    ledger = Ledger(str(state), said.append, lambda: [])
    first = [10 * MiB] * 5 + [80 * MiB] * 5
    second = [40 * MiB] * 9 + [70 * MiB]
    ledger.record_peak("grow", "local", 80 * MiB, False, 8.0, cap=None, ramp=first)
    ledger.record_peak("grow", "local", 70 * MiB, False, 5.5, cap=None, ramp=second)
    ledger.record_peak("grow", "local", 90 * MiB, False, 2.0, cap=None)  # killed: no profile
    ledger.record_peak("flat", "local", 5 * MiB, False, 1.0, cap=None)
    peak = ledger.peak("grow", "local")
    assert peak is not None
    assert peak.ramp == (40 * MiB,) * 5 + (80 * MiB,) * 5
    assert peak.min_duration == 5.5  # the fastest run that recorded a profile
    flat = ledger.peak("flat", "local")
    assert flat is not None and (flat.ramp, flat.min_duration) == (None, None)
    before = ledger.peaks()
    ledger.close()
    (state / "ledger.sqlite3").write_bytes(b"not a database" * 100)
    ledger = Ledger(str(state), said.append, lambda: [])
    assert ledger.peaks() == before  # replayed from R lines
    # Compacted into P lines, then rebuilt: the same again.
    peakjournal.write_snapshot(str(state / "peaks.journal"), ledger.peaks(), ledger.peak_runs())
    assert "\t" + ramp.encode(peak.ramp) + "\t5.5\n" in (state / "peaks.journal").read_text()  # type: ignore[operator]
    ledger.close()
    (state / "ledger.sqlite3").write_bytes(b"not a database" * 100)
    ledger = Ledger(str(state), said.append, lambda: [])
    assert ledger.peaks() == before
    ledger.close()


def test_a_version_7_ledger_gains_the_profile_columns(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    con = sqlite3.connect(state / "ledger.sqlite3")
    con.executescript(
        "CREATE TABLE peaks (label TEXT NOT NULL, host TEXT NOT NULL, max_peak INTEGER NOT NULL,"
        " runs INTEGER NOT NULL, last_peak INTEGER NOT NULL, hit_ceiling INTEGER NOT NULL,"
        " last_duration REAL, max_duration REAL, updated REAL NOT NULL, ceiling_at REAL,"
        " slice_full_at REAL, clean_runs INTEGER NOT NULL DEFAULT 0, max_vram INTEGER,"
        " PRIMARY KEY (label, host));"
        "INSERT INTO peaks VALUES ('old', 'local', 100, 1, 100, 0, 1.0, 1.0, 0, NULL, NULL, 0, NULL);"
        "PRAGMA user_version=7;")
    con.close()
    ledger = Ledger(str(state), None, lambda: [])
    assert ledger.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
    ledger.record_peak("old", "local", 200, False, 3.0, cap=None, ramp=[200] * 10)
    old = ledger.peak("old", "local")
    assert old is not None and (old.ramp, old.min_duration, old.max_peak) == ((200,) * 10, 3.0, 200)
    ledger.close()


def test_a_run_records_its_ramp_and_the_ledger_shows_its_time_to_peak(hostrun: Hostrun) -> None:
    hostrun.configure(slice="300M")
    # 2 s flat at ~0, then 60 MiB held for 0.4 s: the profile reaches its peak in the last tenths.
    grow = ("import time; time.sleep(2.0); x = bytearray(60 << 20); "
            "[x.__setitem__(i, 1) for i in range(0, len(x), 4096)]; time.sleep(0.4)")
    proc = hostrun.run("-m", "200M", "--label", "late", "--", PY, "-c", grow)
    assert proc.returncode == 0, proc.stderr
    shown = hostrun.run("ledger", "--json")
    assert shown.returncode == 0, shown.stderr
    (peak,) = [p for p in json.loads(shown.stdout)["peaks"] if p["label"] == "late"]
    points = peak["ramp"]
    assert len(points) == 10 and points == sorted(points)
    assert points[-1] == peak["max_peak"] >= 60 * MiB
    assert points[6] < 30 * MiB  # by 70% of its ~2.5 s it had not grown
    assert peak["time_to_peak"] >= 0.8
    assert peak["min_duration"] >= 2.0


def test_merged_rises_show_growth_early_never_late(monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.local.run import jobwatch

    monkeypatch.setattr(jobwatch, "MAX_RISES", 4)
    watch = jobwatch.JobWatch.__new__(jobwatch.JobWatch)
    watch.peak, watch.rises = 0, []
    for at, used in ((0.1, 10), (0.2, 20), (0.3, 30), (0.4, 40), (0.5, 50)):
        watch._rose(at, used)
    # Past 4 pairs, each pair is merged at its earlier time with its later value.
    assert watch.rises == [(0.1, 20), (0.3, 40), (0.5, 50)] and watch.peak == 50
    exact = ramp.profile([(0.1, 10), (0.2, 20), (0.3, 30), (0.4, 40), (0.5, 50)], 1.0, 50)
    merged = ramp.profile(watch.rises, 1.0, 50)
    assert all(m >= e for m, e in zip(merged, exact)) and merged != exact
