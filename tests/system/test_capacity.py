"""Capacity planning: the half rule, how many fit, the flags, ``--slice``, the peak history, and
``hostrun capacity`` end to end on real ledgers (a real cgroup v1 slice, real jobs, a real sshd peer).

The pure cases are computed by hand; the arithmetic is in the comments next to each expectation.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import GiB, MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.capacity import (
    CAP_BELOW,
    HIT_CEILING,
    NEVER_FITS,
    OVER_SLICE,
    PEAKS_VARY,
    STEP,
    LabelPeaks,
    assess,
    half_rule_cap,
    host_capacity,
    how_many,
    labels_from_table,
    peak_table,
    variation,
)
from dispatch.local.store.ledgerdb import PEAK_HISTORY, SCHEMA_VERSION, PeakRecord
from tests.conftest import Hostrun

PY = sys.executable


def peaks(max_peak: int, *, runs: int = 1, last: int | None = None, hit: bool = False,
          history: tuple[int, ...] | None = None, cap: int | None = None, cap_known: bool = True,
          label: str = "job", host: str = "local") -> LabelPeaks:
    last = max_peak if last is None else last
    if history is None:
        history = (last,) if runs == 1 else ()
    record = PeakRecord(label, host, max_peak, runs, last, hit, None, None, 0.0)
    return LabelPeaks(record, history=history, cap_known=cap_known, last_cap=cap)


def judge(p: LabelPeaks, slice_limit: int = 20 * GiB, default_cap: int | None = None,
          gamble: int = 512 * MiB, what_if: int | None = None) -> Any:
    return assess(p, slice_limit=slice_limit, default_cap=default_cap, gamble_size=gamble,
                  what_if=what_if, hostname="box")


# -- the half rule and 512 MiB rounding --

def test_half_rule_reproduces_the_reference_table() -> None:
    # reference 003, "memory = 2 x peak rounded up to 512 MiB", on a 30 GiB (30720 MiB) node:
    cases = [
        (1146, 2560, 12),  # 2 x 1146 = 2292 -> 5 x 512 = 2560; 30720 / 2560 = 12
        (1578, 3584, 8),   # 2 x 1578 = 3156 -> 7 x 512 = 3584; 30720 / 3584 = 8.57 -> 8
        (1970, 4096, 7),   # 2 x 1970 = 3940 -> 8 x 512 = 4096; 30720 / 4096 = 7.5 -> 7
        (2178, 4608, 6),   # 2 x 2178 = 4356 -> 9 x 512 = 4608; 30720 / 4608 = 6.67 -> 6
        (2785, 5632, 5),   # 2 x 2785 = 5570 -> 11 x 512 = 5632; 30720 / 5632 = 5.45 -> 5
    ]
    for peak_mib, cap_mib, per_node in cases:
        assert half_rule_cap(peak_mib * MiB) == cap_mib * MiB
        a = judge(peaks(peak_mib * MiB, cap=cap_mib * MiB), slice_limit=30720 * MiB)
        assert a.half_rule_cap == cap_mib * MiB
        assert a.now.fits_at_half_rule_cap == per_node
        assert CAP_BELOW not in a.flags  # a cap already at the half rule is not flagged
    # The reference's 2048 MiB default: 30720 / 2048 = 15 sessions, but only for peaks <= 1024 MiB.
    assert how_many(30720 * MiB, 2048 * MiB) == 15
    assert half_rule_cap(1024 * MiB) == 2048 * MiB and half_rule_cap(1024 * MiB + 1) == 2560 * MiB


def test_half_rule_edges_exactly_half_and_just_over() -> None:
    assert STEP == 512 * MiB
    # exactly half: 2 x 2048 MiB = 4096 MiB = 8 x 512 MiB, already a multiple -> 4096 MiB
    assert half_rule_cap(2048 * MiB) == 4096 * MiB
    # one byte over half: 4096 MiB + 2 B -> the next multiple, 9 x 512 = 4608 MiB
    assert half_rule_cap(2048 * MiB + 1) == 4608 * MiB
    # 256 MiB: 2 x 256 = 512 exactly -> 512 MiB; 256 MiB + 1 B -> 1024 MiB
    assert half_rule_cap(256 * MiB) == 512 * MiB
    assert half_rule_cap(256 * MiB + 1) == 1024 * MiB
    # tiny and empty peaks still get one whole step
    assert half_rule_cap(1) == 512 * MiB
    assert half_rule_cap(0) == 512 * MiB
    # a cap exactly at the half-rule cap is fine; one byte below is flagged
    assert CAP_BELOW not in judge(peaks(2048 * MiB, cap=4096 * MiB)).flags
    below = judge(peaks(2048 * MiB, cap=4096 * MiB - 1))
    assert CAP_BELOW in below.flags and below.half_rule_cap == 4096 * MiB
    # worst peak 1 B over half of the cap: 2 x (2048 MiB + 1) > 4096 MiB -> flagged, needs 4608 MiB
    over = judge(peaks(2048 * MiB + 1, cap=4096 * MiB))
    assert CAP_BELOW in over.flags and over.half_rule_cap == 4608 * MiB


# -- how many fit, by booking --

def test_fits_by_recorded_peak_when_it_never_hit_its_ceiling() -> None:
    a = judge(peaks(3 * GiB, cap=8 * GiB))
    assert (a.now.kind, a.now.booked) == ("peak", 3 * GiB)
    assert a.now.fits == 6  # 20 GiB / 3 GiB = 6.67 -> 6
    assert a.half_rule_cap == 6 * GiB  # 2 x 3 GiB = 6 GiB = 12 x 512 MiB
    assert a.now.fits_at_half_rule_cap == 3  # 20 / 6 = 3.33 -> 3
    assert a.flags == ()  # cap 8 GiB >= 6 GiB
    assert (a.cap, a.cap_source) == (8 * GiB, "last-run")
    assert a.source == "peak table on local (box)"


def test_hit_ceiling_is_booked_at_its_cap_and_flagged() -> None:
    # the job was killed at its 4 GiB cap: its recorded peak is the cap, its real peak is higher
    a = judge(peaks(4 * GiB, hit=True, cap=4 * GiB))
    assert (a.now.kind, a.now.booked) == ("cap", 4 * GiB)
    assert a.now.fits == 5  # 20 / 4 = 5
    assert a.half_rule_cap == 8 * GiB  # 2 x 4 GiB = 8 GiB: a lower bound
    assert a.now.fits_at_half_rule_cap == 2  # 20 / 8 = 2.5 -> 2
    assert a.flags == (CAP_BELOW, HIT_CEILING)
    assert any("lower bound" in n for n in a.notes)


def test_hit_ceiling_without_a_cap_is_booked_at_the_whole_slice() -> None:
    a = judge(peaks(5 * GiB, hit=True, cap=None))  # last run had no cap of its own
    assert (a.now.kind, a.now.booked, a.now.fits) == ("cap", 20 * GiB, 1)  # 20 / 20 = 1
    assert (a.cap, a.cap_source) == (None, "last-run")
    assert a.flags == (HIT_CEILING,)  # no cap to be below the rule; 10 GiB <= 20 GiB slice


def test_cap_not_recorded_flags_from_hit_ceiling_only() -> None:
    # A label recorded before the peak history existed: its cap is unknown.
    legacy = peaks(1 * GiB, runs=3, history=(), cap_known=False)
    a = judge(legacy)
    assert (a.cap, a.cap_source) == (None, "unknown")
    assert a.now.kind == "peak" and a.now.fits == 20  # 20 / 1 = 20
    assert a.flags == ()  # nothing known to compare with
    hit = judge(legacy._replace(record=legacy.record._replace(hit_ceiling=True)))
    assert hit.flags == (CAP_BELOW, HIT_CEILING)
    assert hit.now.kind == "cap" and hit.now.booked == 20 * GiB  # no cap known: the whole slice


def test_default_cap_stands_in_for_an_unrecorded_cap() -> None:
    a = judge(peaks(1536 * MiB, runs=2, history=(), cap_known=False), default_cap=2 * GiB)
    assert (a.cap, a.cap_source) == (2 * GiB, "default-cap")
    assert a.half_rule_cap == 3 * GiB  # 2 x 1536 = 3072 MiB = 6 x 512
    assert a.flags == (CAP_BELOW,)  # 2 GiB < 3 GiB
    assert (a.now.kind, a.now.booked, a.now.fits) == ("peak", 1536 * MiB, 13)  # 20480 / 1536 = 13.3


def test_never_fits_and_half_rule_over_slice() -> None:
    never = judge(peaks(1 * GiB, cap=24 * GiB))
    assert (never.now.kind, never.now.fits) == (NEVER_FITS, 0)
    assert NEVER_FITS in never.flags
    big = judge(peaks(11 * GiB, cap=None))
    assert big.half_rule_cap == 22 * GiB  # 2 x 11 = 22 GiB > 20 GiB slice
    assert big.flags == (OVER_SLICE,)
    assert (big.now.kind, big.now.fits, big.now.fits_at_half_rule_cap) == ("peak", 1, 0)


def test_a_gamble_never_counts_more_than_fit_at_the_worst_peak() -> None:
    # no cap and a peak equal to the slice: the ledger would gamble at 512 MiB (8 in 4 GiB), but at
    # its worst recorded peak only 4 GiB / 4 GiB = 1 fits
    a = judge(peaks(4 * GiB, cap=None), slice_limit=4 * GiB)
    assert (a.now.kind, a.now.booked) == ("gamble", 512 * MiB)
    assert a.now.fits == 1


# -- peaks that vary widely --

def test_variation_over_the_history() -> None:
    # two samples: CV = (k - 1) / (k + 1), so exactly 2x apart is CV 1/3: not "widely"
    assert variation([1 * GiB, 2 * GiB]) == pytest.approx(1 / 3)
    assert PEAKS_VARY not in judge(peaks(2 * GiB, runs=2, history=(1 * GiB, 2 * GiB))).flags
    assert PEAKS_VARY in judge(peaks(2 * GiB + MiB, runs=2, history=(1 * GiB, 2 * GiB + MiB))).flags
    # 1, 1, 4 GiB: mean 2, deviations 1, 1, 2 -> variance (1 + 1 + 4) / 3 = 2, sd 1.414, CV 0.707
    three = judge(peaks(4 * GiB, runs=3, history=(1 * GiB, 1 * GiB, 4 * GiB)))
    assert three.variation == pytest.approx(2 ** 0.5 / 2)
    assert three.flags == (PEAKS_VARY,) and three.variation_basis == "history"
    # 19 runs at 4096 MiB and one early failure at 1024 MiB: mean 3942.4, variance
    # (19 x 153.6^2 + 2918.4^2) / 20 = 448266.24, sd 669.5, CV 0.170: one outlier is not "widely"
    steady = (4096 * MiB,) * 19 + (1024 * MiB,)
    a = judge(peaks(4096 * MiB, runs=20, last=1024 * MiB, history=steady))
    assert a.variation == pytest.approx(669.53 / 3942.4, rel=1e-3)
    assert PEAKS_VARY not in a.flags
    assert variation([5]) is None and variation([]) is None and variation([0, 0]) is None


def test_variation_without_history_compares_max_and_last() -> None:
    # recorded before the history existed: only max and last are known
    wide = judge(peaks(2 * GiB + 1, runs=4, last=1 * GiB, history=(), cap_known=False))
    assert wide.variation_basis == "max-vs-last" and PEAKS_VARY in wide.flags
    even = judge(peaks(2 * GiB, runs=4, last=1 * GiB, history=(), cap_known=False))
    assert PEAKS_VARY not in even.flags  # exactly 2x
    one = judge(peaks(2 * GiB, runs=1, history=()))
    assert one.variation is None and one.variation_basis is None


# -- --slice what-if --

def test_what_if_slice_changes_sessions_per_host() -> None:
    p = peaks(3 * GiB, cap=8 * GiB)
    a = judge(p, what_if=32 * GiB)
    assert a.what_if is not None
    assert (a.now.fits, a.what_if.fits) == (6, 10)  # 20 / 3 = 6; 32 / 3 = 10.67 -> 10
    assert (a.now.fits_at_half_rule_cap, a.what_if.fits_at_half_rule_cap) == (3, 5)  # /6 GiB
    small = judge(p, what_if=6 * GiB).what_if
    assert small is not None
    assert (small.kind, small.fits) == (NEVER_FITS, 0)  # the 8 GiB cap exceeds a 6 GiB slice
    nocap = judge(peaks(3 * GiB, cap=None), what_if=2 * GiB).what_if
    assert nocap is not None and nocap.fits == 0  # 3 GiB peak > 2 GiB slice
    assert "larger than the slice" in nocap.why
    # the reference: same 2178 MiB peak, node of 30720 MiB -> 6; of 46080 MiB (45 GiB) -> 10
    ref = judge(peaks(2178 * MiB, cap=4608 * MiB), slice_limit=30720 * MiB, what_if=46080 * MiB)
    assert ref.what_if is not None
    assert (ref.now.fits_at_half_rule_cap, ref.what_if.fits_at_half_rule_cap) == (6, 10)


# -- a host's peak table, as a report carries it --

def test_peak_table_round_trip_tags_rows_with_the_controllers_host_name(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "state"))
    try:
        ledger.record_peak("build", "local", 100 * MiB, False, 1.0, cap=1 * GiB)
        ledger.record_peak("build", "local", 300 * MiB, False, 1.0, cap=2 * GiB)
        ledger.record_peak("free", "local", 10 * MiB, False, 1.0, cap=None)
        table = peak_table(ledger.peaks(), ledger.peak_runs("local"))
    finally:
        ledger.close()
    entries = json.loads(json.dumps(table))  # what crosses SSH
    build, free = labels_from_table(entries, "peer1")
    assert build == LabelPeaks(PeakRecord("build", "peer1", 300 * MiB, 2, 300 * MiB, False, None, None, 0.0),
                               (100 * MiB, 300 * MiB), True, 2 * GiB)
    assert (free.record.host, free.cap_known, free.last_cap) == ("peer1", True, None)
    h = host_capacity("peer1", {"hostname": "far", "slice": {"limit": 4 * GiB}, "peak_table": entries,
                                "settings": {"default_cap": None, "gamble_size": 512 * MiB}})
    assert h.ok and [a.source for a in h.labels] == ["peak table on peer1 (far)"] * 2
    assert h.labels[0].now.fits == 13  # 4096 MiB / 300 MiB = 13.65 -> 13
    gone = host_capacity("peer2", None, "no answer within 12 s")
    assert (gone.ok, gone.error, gone.labels) == (False, "no answer within 12 s", [])


# -- the ledger's peak history and its migration --

def test_history_keeps_the_last_runs_and_their_caps(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "state"))
    try:
        for i in range(PEAK_HISTORY + 5):
            ledger.record_peak("job", "local", (i + 1) * MiB, False, 0.5, cap=(i + 1) * GiB)
        ledger.record_peak("other", "local", 7 * MiB, True, 0.5, cap=None)
        runs = ledger.peak_runs("local")
        job = [r for r in runs if r.label == "job"]
        assert [r.peak for r in job] == [(i + 1) * MiB for i in range(5, PEAK_HISTORY + 5)]
        assert job[-1].cap == (PEAK_HISTORY + 5) * GiB
        (other,) = [r for r in runs if r.label == "other"]
        assert other.cap is None and other.hit_ceiling
        record = ledger.peak("job", "local")
        assert record is not None and record.runs == PEAK_HISTORY + 5  # all-time figures stay
        assert record.max_peak == (PEAK_HISTORY + 5) * MiB
        assert ledger.peak_runs("elsewhere") == []
    finally:
        ledger.close()


V2_SCHEMA = """
CREATE TABLE bookings (
    id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL, label TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('waiting', 'running')), pid INTEGER NOT NULL,
    pid_start INTEGER NOT NULL, size INTEGER NOT NULL, cap INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('cap', 'peak', 'gamble')), cgroup TEXT, command TEXT NOT NULL,
    session TEXT, queued REAL NOT NULL, since REAL, reason TEXT, gpu_index INTEGER, gpu_bytes INTEGER
);
CREATE INDEX bookings_host_state ON bookings (host, state, id);
CREATE TABLE peaks (
    label TEXT NOT NULL, host TEXT NOT NULL, max_peak INTEGER NOT NULL, runs INTEGER NOT NULL,
    last_peak INTEGER NOT NULL, hit_ceiling INTEGER NOT NULL, last_duration REAL, max_duration REAL,
    updated REAL NOT NULL, PRIMARY KEY (label, host)
);
INSERT INTO peaks VALUES ('old-build', 'local', 3221225472, 5, 1073741824, 0, 60.0, 90.0, 0);
INSERT INTO peaks VALUES ('old-hog', 'local', 268435456, 2, 268435456, 1, 1.0, 1.0, 0);
PRAGMA user_version = 2;
"""


def test_a_version_2_ledger_gains_the_history_and_keeps_its_peaks(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    con = sqlite3.connect(state / "ledger.sqlite3")
    con.executescript(V2_SCHEMA)
    con.close()
    ledger = Ledger(str(state))
    try:
        assert ledger.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 3
        assert ledger.peak_runs() == []
        old = peak_table(ledger.peaks(), ledger.peak_runs("local"))
        build, hog = (judge(p, slice_limit=16 * GiB) for p in labels_from_table(old, "local"))
        # old-build: 3 GiB worst, 1 GiB last, cap not recorded
        assert (build.cap_source, build.variation_basis) == ("unknown", "max-vs-last")
        assert build.flags == (PEAKS_VARY,)  # 3 GiB vs 1 GiB: more than 2x
        assert build.now.fits == 5  # booked at its 3 GiB peak: 16 / 3 = 5.33 -> 5
        # old-hog hit its ceiling with an unrecorded cap: flagged from hit_ceiling alone
        assert hog.flags == (CAP_BELOW, HIT_CEILING)
        ledger.record_peak("old-build", "local", 2 * GiB, False, 30.0, cap=4 * GiB)
        record = ledger.peak("old-build", "local")
        assert record is not None and (record.runs, record.max_peak) == (6, 3 * GiB)
        (entry,) = [e for e in peak_table(ledger.peaks(), ledger.peak_runs("local"))
                    if e["label"] == "old-build"]
        assert (entry["history"], entry["cap_known"], entry["last_cap"]) == ([2 * GiB], True, 4 * GiB)
    finally:
        ledger.close()
    Ledger(str(state)).close()  # opening again changes nothing


# -- hostrun capacity, end to end on a real ledger --

def capacity(hostrun: Hostrun, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = hostrun.run("capacity", "--json", *args, timeout=60)
    return proc, json.loads(proc.stdout) if proc.stdout else {}


def by_label(data: dict[str, Any], host: str = "local") -> dict[str, dict[str, Any]]:
    (h,) = [h for h in data["hosts"] if h["host"] == host]
    return {a["label"]: a for a in h["labels"]}


def alloc(mib: int) -> list[str]:
    return [PY, "-c", f"x = bytearray({mib} << 20)"]


def test_capacity_cli_on_real_runs(hostrun: Hostrun) -> None:
    hostrun.configure(slice="1G")
    proc, data = capacity(hostrun)
    assert proc.returncode == 0, proc.stderr
    assert by_label(data) == {} and data["hosts"][0]["slice_limit"] == GiB
    for _ in range(2):
        assert hostrun.run("-m", "512M", "-l", "steady", "--", *alloc(40)).returncode == 0
    assert hostrun.run("-m", "512M", "-l", "vary", "--", *alloc(4)).returncode == 0
    assert hostrun.run("-m", "512M", "-l", "vary", "--", *alloc(120)).returncode == 0
    hog = hostrun.run("-m", "64M", "-l", "hog", "--", *alloc(200))
    assert hog.returncode == ExitCode.OWN_CAP, hog.stderr

    proc, data = capacity(hostrun)
    assert proc.returncode == 0, proc.stderr
    assert data["what_if_slice"] is None and data["rules"]["round_to"] == 512 * MiB
    (host,) = data["hosts"]
    assert host["ok"] and host["slice_limit"] == GiB
    labels = by_label(data)
    assert set(labels) == {"steady", "vary", "hog"}
    for a in labels.values():
        assert a["host"] == "local" and a["source"].startswith("peak table on local (")
    steady, vary, h = labels["steady"], labels["vary"], labels["hog"]
    # steady: two ~40 MiB runs under a 512 MiB cap: booked at its peak, half rule 512 MiB, no flags
    assert steady["runs"] == 2 and steady["history_runs"] == 2
    assert 40 * MiB < steady["max_peak"] < 256 * MiB
    assert (steady["cap"], steady["cap_source"]) == (512 * MiB, "last-run")
    assert steady["now"]["kind"] == "peak" and steady["now"]["booked"] == steady["max_peak"]
    assert steady["now"]["fits"] == GiB // steady["max_peak"]
    assert steady["half_rule_cap"] == 512 * MiB  # 2 x (< 256 MiB) rounds up to one step
    assert steady["now"]["fits_at_half_rule_cap"] == 2  # 1024 / 512
    assert steady["flags"] == []
    # vary: ~4 MiB then ~120 MiB more: far more than 2x apart
    assert vary["max_peak"] > 120 * MiB and vary["variation_basis"] == "history"
    assert vary["flags"] == [PEAKS_VARY]
    # hog: killed at its 64 MiB cap -> booked at the cap: 1024 / 64 = 16 fit;
    # half rule 2 x (<= 64 MiB) -> 512 MiB: 1024 / 512 = 2; its 64 MiB cap is below that
    assert h["hit_ceiling"] and h["max_peak"] <= 64 * MiB
    assert (h["now"]["kind"], h["now"]["booked"], h["now"]["fits"]) == ("cap", 64 * MiB, 16)
    assert (h["half_rule_cap"], h["now"]["fits_at_half_rule_cap"]) == (512 * MiB, 2)
    assert h["flags"] == [CAP_BELOW, HIT_CEILING]

    # what if the slice were 256 MiB: hog 256 / 64 = 4, none at the 512 MiB half-rule cap
    proc, data = capacity(hostrun, "--slice", "256M", "--host", "local")
    assert proc.returncode == 0, proc.stderr
    assert data["what_if_slice"] == 256 * MiB
    h = by_label(data)["hog"]
    assert (h["now"]["fits"], h["what_if"]["fits"]) == (16, 4)
    assert (h["now"]["fits_at_half_rule_cap"], h["what_if"]["fits_at_half_rule_cap"]) == (2, 0)
    steady = by_label(data)["steady"]  # its 512 MiB cap is larger than a 256 MiB slice
    assert (steady["what_if"]["kind"], steady["what_if"]["fits"]) == (NEVER_FITS, 0)
    assert steady["flags"] == []  # flags judge the current slice

    text = hostrun.run("capacity", "--slice", "2G", env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    assert "slice 1.0 GiB → 2.0 GiB" in text.stdout
    hog_row = next(line for line in text.stdout.splitlines() if "│ hog " in line)
    assert "16 → 32" in hog_row and "2 → 4" in hog_row  # 2048 / 64 = 32; 2048 / 512 = 4
    assert "low-cap hit-ceiling" in hog_row
    assert "vary on local: peaks vary widely" in text.stdout

    bad = hostrun.run("capacity", "--host", "nope")
    assert bad.returncode == ExitCode.USAGE and "no such host" in bad.stderr
    bad = hostrun.run("capacity", "--slice", "lots")
    assert bad.returncode == ExitCode.USAGE and "--slice" in bad.stderr


def test_capacity_reads_each_peers_own_peak_table(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    from tests.support.peers import TOP, make_tree

    peer = peers("peer1", "127.0.0.2", slice="512M")
    hostrun.configure(slice="1G", top=TOP, peers=peer.host_table())
    tree = make_tree(tmp_path)
    there = hostrun.run("--peer", "-m", "128M", "-l", "build", "--", *alloc(20), cwd=tree)
    assert there.returncode == 0, there.stderr
    here = hostrun.run("-m", "512M", "-l", "build", "--", "true")
    assert here.returncode == 0, here.stderr

    proc, data = capacity(hostrun)
    assert proc.returncode == 0, proc.stderr
    assert [h["host"] for h in data["hosts"]] == ["local", "peer1"]
    local, remote = by_label(data)["build"], by_label(data, "peer1")["build"]
    # the same label on two hosts: two rows, each with its own host's figures and slice
    assert remote["host"] == "peer1" and remote["source"].startswith("peak table on peer1 (")
    assert (remote["cap"], remote["now"]["slice_limit"]) == (128 * MiB, 512 * MiB)
    assert remote["max_peak"] > 20 * MiB > local["max_peak"]
    assert remote["now"]["fits"] == 512 * MiB // remote["max_peak"]
    assert remote["flags"] == [CAP_BELOW]  # 128 MiB < 512 MiB
    assert (local["cap"], local["now"]["slice_limit"], local["runs"]) == (512 * MiB, GiB, 1)

    proc, data = capacity(hostrun, "--host", "peer1")
    assert proc.returncode == 0 and [h["host"] for h in data["hosts"]] == ["peer1"]
    # a peer that does not answer is reported as such, and the local figures still come
    hostrun.configure(slice="1G", top=TOP + '\nreport_timeout = "2s"\nreport_deadline = "4s"',
                      peers=peer.host_table())
    peer.freeze()
    try:
        proc, data = capacity(hostrun)
    finally:
        peer.thaw()
    assert proc.returncode == ExitCode.PEER_UNREACHABLE
    hosts = {h["host"]: h for h in data["hosts"]}
    assert hosts["local"]["ok"] and not hosts["peer1"]["ok"] and hosts["peer1"]["error"]
    assert by_label(data)["build"]["runs"] == 1
