"""``hostrun capacity --sessions``: sessions per host by the half rule in the sessions slice
(docs/capacity.md, "Sessions"), and ``hostrun capacity`` without it leaving ``session:`` labels to it.

The pure cases are computed by hand; the arithmetic is in the comments next to each expectation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import GiB, MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.capacity import CAP_BELOW, HIT_CEILING, OVER_SLICE, PEAKS_VARY, host_capacity
from dispatch.local.sessions.sessioncapacity import (
    DEFAULT,
    HALF_RULE,
    NO_FIGURES,
    SessionFit,
    host_sessions,
    running_sessions,
    session_rules,
)
from tests.conftest import Hostrun, wait_for


def entry(label: str, max_peak: int, *, runs: int = 1, last: int | None = None, hit: bool = False,
          history: list[int] | None = None, cap: int | None = None, cap_known: bool = True) -> dict[str, Any]:
    """A row of a report's ``peak_table`` (``dispatch.local.capacity.peak_table``), as it crosses SSH."""
    last = max_peak if last is None else last
    return {"label": label, "host": "local", "max_peak": max_peak, "runs": runs, "last_peak": last,
            "hit_ceiling": hit, "history": [last] if history is None else history,
            "cap_known": cap_known, "last_cap": cap, "slice_full_marked": False}


def report(table: list[dict[str, Any]], *, slice_limit: int = 60 * GiB, share: float | None = 0.5,
           cap: int = 4608 * MiB, running: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A machine's report read with ``peaks=True``; ``share`` None: an older peer's, without the
    sessions figures."""
    settings: dict[str, Any] = {"default_cap": None, "gamble_size": 512 * MiB}
    if share is not None:
        limit = int(slice_limit * share) // 4096 * 4096
        settings["sessions"] = {"limit": limit, "share": share, "cap": cap, "first_booking": 2 * GiB,
                                "high": 0.9}
    return {"host": "local", "hostname": "box", "slice": {"limit": slice_limit}, "settings": settings,
            "running": running or [], "peak_table": table}


# -- hostrun capacity without --sessions --

def test_the_jobs_view_leaves_session_labels_to_sessions() -> None:
    table = [entry("build", 3 * GiB), entry("session:claude", 1970 * MiB), entry("session:codex", GiB)]
    h = host_capacity("local", report(table))
    assert [a.label for a in h.labels] == ["build"]  # judged against the jobs' rules
    assert h.session_labels == 2 and h.as_dict()["session_labels"] == 2
    only = host_capacity("local", report([entry("session:claude", GiB)]))
    assert (only.labels, only.session_labels) == ([], 1)
    assert host_capacity("local", report([entry("build", GiB)])).session_labels == 0


# -- the rule: 2 x worst peak rounded up to 512 MiB, floor((allocatable - others) / that) --

REF_SLICE = 60 * GiB  # share 0.5: a sessions slice of 30 GiB (30720 MiB), the reference's node


def test_the_reference_figures_on_a_30_gib_sessions_slice() -> None:
    h = host_sessions("local", report([entry("session:claude", 1970 * MiB),
                                       entry("session:resumed", 2178 * MiB),
                                       entry("session:worker", 1024 * MiB)]))
    assert h.ok and h.no_sessions is None and h.sessions is not None
    assert h.sessions["limit"] == 30720 * MiB  # 60 GiB x 0.5
    rows = {a.label: a for a in h.labels}
    # 2 x 1970 = 3940 -> 8 x 512 = 4096 MiB; 30720 / 4096 = 7.5 -> 7
    assert (rows["session:claude"].fit.cap, rows["session:claude"].fit.fits) == (4096 * MiB, 7)
    # 2 x 2178 = 4356 -> 9 x 512 = 4608 MiB; 30720 / 4608 = 6.67 -> 6
    assert (rows["session:resumed"].fit.cap, rows["session:resumed"].fit.fits) == (4608 * MiB, 6)
    # the 2048 MiB worker: 2 x 1024 = 2048 exactly; 30720 / 2048 = 15
    assert (rows["session:worker"].fit.cap, rows["session:worker"].fit.fits) == (2048 * MiB, 15)
    assert all(a.fit.cap_source == HALF_RULE and a.flags == () for a in h.labels)
    # a session not yet run gets sessions.cap, the reference's 4608 MiB: 6 on the node
    assert h.default == SessionFit(4608 * MiB, DEFAULT, 6, 6, None)


def test_a_host_with_no_session_still_shows_the_default() -> None:
    h = host_sessions("local", report([entry("build", 3 * GiB)], slice_limit=16 * GiB, cap=2 * GiB))
    assert h.labels == []  # a job's label is no session
    assert h.default is not None
    assert (h.default.cap, h.default.fits) == (2 * GiB, 4)  # 8 GiB sessions slice / 2 GiB
    data = json.loads(json.dumps(h.as_dict()))
    assert data["default"] == {"cap": 2 * GiB, "cap_source": "default", "fits": 4,
                               "fits_beside_running": 4, "what_if_fits": None}
    assert data["sessions"]["limit"] == 8 * GiB and data["labels"] == []


def test_an_older_peers_report_says_so_and_an_unread_host_says_why() -> None:
    old = host_sessions("peer1", report([entry("session:claude", GiB)], share=None))
    assert (old.ok, old.error, old.sessions, old.default, old.labels) == (True, None, None, None, [])
    assert old.no_sessions == NO_FIGURES and "no sessions figures" in NO_FIGURES
    assert old.slice_limit == 60 * GiB
    partial = report([], share=0.5)
    del partial["settings"]["sessions"]["cap"]  # an agent between versions: as none, no traceback
    assert host_sessions("peer1", partial).no_sessions == NO_FIGURES
    gone = host_sessions("peer2", None, "no answer within 12 s")
    assert (gone.ok, gone.error, gone.no_sessions, gone.labels) == (False, "no answer within 12 s", None, [])


def test_others_are_the_sessions_running_now_at_their_caps() -> None:
    running = [
        {"id": 1, "label": "session:claude", "booked": 2 * GiB, "cap": 4608 * MiB, "age_s": 5.0},
        {"id": 2, "label": "session:codex", "booked": 1 * GiB, "cap": None, "age_s": 5.0},  # no cap
        {"id": 3, "label": "build", "booked": 8 * GiB, "cap": 8 * GiB, "age_s": 5.0},  # a job
        {"id": 4, "label": None, "booked": 1 * GiB, "age_s": 5.0},  # a Slurm job without a name
    ]
    assert running_sessions(running) == (2, 4608 * MiB + 1 * GiB)  # the cap, else the booking
    h = host_sessions("local", report([entry("session:claude", 1970 * MiB)], running=running))
    assert (h.running_sessions, h.running_held) == (2, 5632 * MiB)
    (claude,) = h.labels
    # fits: others = 0, 30720 / 4096 = 7; beside: (30720 - 5632) / 4096 = 25088 / 4096 = 6.1 -> 6
    assert (claude.fit.fits, claude.fit.fits_beside_running) == (7, 6)
    assert h.default is not None  # (30720 - 5632) / 4608 = 5.4 -> 5
    assert (h.default.fits, h.default.fits_beside_running) == (6, 5)
    full = host_sessions("local", report([], slice_limit=8 * GiB, running=running))
    assert full.default is not None and full.default.fits_beside_running == 0  # held > the slice
    # its 4 GiB sessions slice is smaller than the default 4608 MiB: a new session never fits
    assert (full.default.fits, full.notes) == (0, (
        "the default session cap 4.5 GiB ([sessions] cap) is larger than the sessions slice "
        "(4.0 GiB): a session with no recorded peak never fits",))
    assert h.notes == ()


def test_flags_a_session_label_raises() -> None:
    h = host_sessions("local", report([
        # its last run's 2 GiB cap is below 2 x 1970 -> 4096 MiB
        entry("session:low", 1970 * MiB, cap=2 * GiB),
        # killed at its 1 GiB cap: its true peak is above 1 GiB
        entry("session:hit", 1 * GiB, hit=True, cap=1 * GiB),
        # 500 MiB then 1500 MiB: 3x apart
        entry("session:vary", 1500 * MiB, runs=2, history=[500 * MiB, 1500 * MiB], cap=4608 * MiB),
        # no cap of its own (only the slice's): nothing to judge
        entry("session:free", 1 * GiB, cap=None),
    ]))
    rows = {a.label: a for a in h.labels}
    assert rows["session:low"].flags == (CAP_BELOW,) and rows["session:low"].last_cap == 2 * GiB
    assert "below the half-rule cap 4.0 GiB" in rows["session:low"].notes[0]
    assert rows["session:hit"].flags == (CAP_BELOW, HIT_CEILING)
    assert rows["session:hit"].fit.cap == 2 * GiB  # a lower bound: 2 x 1 GiB
    assert not any("booked at its cap" in n for n in rows["session:hit"].notes)  # a job's wording
    assert rows["session:vary"].flags == (PEAKS_VARY,)
    assert rows["session:vary"].variation_basis == "history"
    assert rows["session:free"].flags == () and rows["session:free"].last_cap_known
    # a cap over the sessions slice: 4 GiB slice x 0.5 = 2 GiB < 4096 MiB, none fits
    (big,) = host_sessions("local", report([entry("session:big", 1970 * MiB)], slice_limit=4 * GiB)).labels
    assert (big.flags, big.fit.fits) == ((OVER_SLICE,), 0)
    assert "larger than the sessions slice (2.0 GiB)" in big.notes[0]


def test_a_label_with_no_usable_peak_gets_the_default_cap() -> None:
    (none,) = host_sessions("local", report([entry("session:new", 0, runs=1, cap=None,
                                                    cap_known=False, history=[])])).labels
    assert (none.half_rule_cap, none.fit.cap, none.fit.cap_source) == (None, 4608 * MiB, DEFAULT)
    assert none.fit.fits == 6 and none.flags == ()  # 30720 / 4608


def test_what_if_slice_scales_the_sessions_slice_by_its_share() -> None:
    # --slice 90G with share 0.5: a 45 GiB (46080 MiB) sessions slice
    h = host_sessions("local", report([entry("session:resumed", 2178 * MiB)]), what_if=90 * GiB)
    assert (h.what_if, h.what_if_limit) == (90 * GiB, 45 * GiB)
    (a,) = h.labels
    assert (a.fit.fits, a.fit.what_if_fits) == (6, 10)  # 30720 / 4608 = 6; 46080 / 4608 = 10
    assert h.default is not None and h.default.what_if_fits == 10
    # the share of the host's own report, rounded down to whole pages as SessionSettings.limit does
    odd = host_sessions("local", report([], share=0.3), what_if=10 * GiB + 1)
    assert odd.what_if_limit == int((10 * GiB + 1) * 0.3) // 4096 * 4096


def test_the_json_row_is_flat_and_names_its_source() -> None:
    h = host_sessions("peer1", {**report([entry("session:claude", 1970 * MiB, cap=4608 * MiB)]),
                                "hostname": "far"})
    data = json.loads(json.dumps(h.as_dict()))
    (row,) = data["labels"]
    assert row["source"] == "peak table on peer1 (far)" and row["host"] == "peer1"
    assert {k: row[k] for k in ("label", "cap", "cap_source", "fits", "fits_beside_running",
                                "what_if_fits", "half_rule_cap", "last_cap", "flags")} == {
        "label": "session:claude", "cap": 4096 * MiB, "cap_source": "half-rule", "fits": 7,
        "fits_beside_running": 7, "what_if_fits": None, "half_rule_cap": 4096 * MiB,
        "last_cap": 4608 * MiB, "flags": []}
    assert "fit" not in row
    assert session_rules()["session_prefix"] == "session:" and session_rules()["round_to"] == 512 * MiB


# -- hostrun capacity --sessions, end to end on a real ledger --

SESSIONS = '[sessions]\nshare = 0.5\ncap = "384M"\nfirst_booking = "256M"\n'


def capacity(hostrun: Hostrun, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = hostrun.run("capacity", "--json", *args, timeout=60)
    return proc, json.loads(proc.stdout) if proc.stdout else {}


def test_capacity_sessions_cli_on_a_real_ledger(hostrun: Hostrun) -> None:
    hostrun.configure(slice="2G", top=SESSIONS)  # a sessions slice of 1 GiB
    proc, data = capacity(hostrun, "--sessions")
    assert proc.returncode == 0, proc.stderr
    (host,) = data["hosts"]
    # no session yet: the default row alone, 1024 / 384 = 2.67 -> 2
    assert host["ok"] and host["labels"] == [] and host["sessions"]["limit"] == GiB
    assert host["default"] == {"cap": 384 * MiB, "cap_source": "default", "fits": 2,
                               "fits_beside_running": 2, "what_if_fits": None}
    assert data["rules"]["session_prefix"] == "session:"

    ledger = Ledger(str(hostrun.state_dir))
    try:
        ledger.record_peak("session:claude", "local", 100 * MiB, False, 60.0, cap=384 * MiB)
        ledger.record_peak("session:claude", "local", 120 * MiB, False, 60.0, cap=512 * MiB)
        ledger.record_peak("session:review", "local", 300 * MiB, True, 60.0, cap=300 * MiB)
        ledger.record_peak("build", "local", 50 * MiB, False, 1.0, cap=512 * MiB)
    finally:
        ledger.close()
    proc, data = capacity(hostrun, "--sessions")
    assert proc.returncode == 0, proc.stderr
    rows = {a["label"]: a for a in data["hosts"][0]["labels"]}
    assert set(rows) == {"session:claude", "session:review"}  # a job's label is no session
    claude, review = rows["session:claude"], rows["session:review"]
    # claude: 2 x 120 = 240 MiB -> 512 MiB; 1024 / 512 = 2
    assert (claude["runs"], claude["max_peak"], claude["last_cap"]) == (2, 120 * MiB, 512 * MiB)
    assert (claude["cap"], claude["cap_source"], claude["fits"], claude["flags"]) == (
        512 * MiB, "half-rule", 2, [])
    # review: killed at 300 MiB: 2 x 300 = 600 -> 1024 MiB, one fits; its 300 MiB cap was too low
    assert (review["cap"], review["fits"]) == (GiB, 1)
    assert review["flags"] == ["cap-below-half-rule", "hit-ceiling"]

    # without --sessions: the jobs alone, the session labels counted
    proc, jobs = capacity(hostrun)
    assert proc.returncode == 0, proc.stderr
    assert [a["label"] for a in jobs["hosts"][0]["labels"]] == ["build"]
    assert jobs["hosts"][0]["session_labels"] == 2
    text = hostrun.run("capacity", env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == 0 and "2 session labels: 'hostrun capacity --sessions'" in text.stdout

    # what if hostrun's slice were 4 GiB: a 2 GiB sessions slice, 2048 / 512 = 4 of claude
    proc, data = capacity(hostrun, "--sessions", "--slice", "4G")
    assert proc.returncode == 0, proc.stderr
    host = data["hosts"][0]
    assert (host["what_if"], host["what_if_limit"]) == (4 * GiB, 2 * GiB)
    claude = next(a for a in host["labels"] if a["label"] == "session:claude")
    assert (claude["fits"], claude["what_if_fits"]) == (2, 4)

    text = hostrun.run("capacity", "--sessions", env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    assert "sessions slice 1.0 GiB (share 0.5); none running" in text.stdout
    claude_row = next(line for line in text.stdout.splitlines() if "│ session:claude " in line)
    assert "512 MiB" in claude_row and "120 MiB / 120 MiB" in claude_row
    default_row = next(line for line in text.stdout.splitlines() if "(not run yet)" in line)
    assert "384 MiB (default)" in default_row
    assert "session:review on local: hit its ceiling" in text.stdout

    for bad in (["--slice", "0"], ["--slice", "lots"]):
        done = hostrun.run("capacity", "--sessions", *bad)
        assert done.returncode == ExitCode.USAGE, done.stderr
        assert done.stderr.count("\n") == 1 and "--slice" in done.stderr and "Traceback" not in done.stderr


def test_capacity_sessions_counts_the_sessions_running_now(hostrun: Hostrun) -> None:
    hostrun.configure(slice="2G", top=SESSIONS)
    ledger = Ledger(str(hostrun.state_dir))
    try:
        ledger.record_peak("session:claude", "local", 120 * MiB, False, 60.0, cap=384 * MiB)
    finally:
        ledger.close()
    # a running session (a stand-in agent: sleep), capped at 384 MiB
    holder = hostrun.popen("session", "--label", "claude", "-m", "384M", "--", "sleep", "60")
    try:
        wait_for(lambda: any(b[2] == "running" for b in hostrun.bookings()), timeout=30)
        proc, data = capacity(hostrun, "--sessions")
        text = hostrun.run("capacity", "--sessions", env={**os.environ, "COLUMNS": "200"})
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr
    host = data["hosts"][0]
    assert (host["running_sessions"], host["running_held"]) == (1, 384 * MiB)
    (claude,) = host["labels"]
    # others = 0: 1024 / 512 = 2; beside the running one: (1024 - 384) / 512 = 1.25 -> 1
    assert (claude["fits"], claude["fits_beside_running"]) == (2, 1)
    assert (host["default"]["fits"], host["default"]["fits_beside_running"]) == (2, 1)  # /384 MiB
    assert "; 1 running, 384 MiB at their caps" in text.stdout


def test_capacity_sessions_reads_each_peers_own_figures(hostrun: Hostrun, peers: Any,
                                                        tmp_path: Path) -> None:
    from tests.support.peers import PY, TOP, make_tree

    peer = peers("peer1", "127.0.0.2", slice="1G")  # the peer's own [sessions]: the defaults
    hostrun.configure(slice="2G", top=TOP + "\n" + SESSIONS, peers=peer.host_table())
    there = hostrun.run("--peer", "-m", "128M", "--", PY, "-c", "x = bytearray(20 << 20)",
                        cwd=make_tree(tmp_path))
    assert there.returncode == 0, there.stderr
    ledger = Ledger(str(peer.state_dir))  # a session run on the peer itself, recorded in its ledger
    try:
        ledger.record_peak("session:claude", "local", 21 * MiB, False, 60.0, cap=128 * MiB)
    finally:
        ledger.close()
    proc, data = capacity(hostrun, "--sessions")
    assert proc.returncode == 0, proc.stderr
    hosts = {h["host"]: h for h in data["hosts"]}
    assert set(hosts) == {"local", "peer1"}
    local, remote = hosts["local"], hosts["peer1"]
    # each host judged by its own figures: here 2 GiB x 0.5 with a 384 MiB cap; there 1 GiB x 0.5
    # with the default 4608 MiB, which does not fit its 512 MiB sessions slice
    assert (local["sessions"]["limit"], local["default"]["fits"], local["labels"]) == (GiB, 2, [])
    assert (remote["sessions"]["limit"], remote["sessions"]["cap"]) == (512 * MiB, 4608 * MiB)
    assert remote["default"]["fits"] == 0 and "never fits" in remote["notes"][0]
    assert local["notes"] == []
    (claude,) = remote["labels"]  # recorded on the peer, in its own peak table
    assert claude["source"].startswith("peak table on peer1 (") and claude["last_cap"] == 128 * MiB
    # 2 x (20 MiB and a little) -> 512 MiB: 512 / 512 = 1
    assert (claude["cap"], claude["fits"], claude["flags"]) == (512 * MiB, 1, ["cap-below-half-rule"])
