"""``hostrun history``: one row per finished run, from the ledger's ``runs`` table, end to end with real
runs (real cgroups, a real ledger) and, for ``--peer``, a real sshd peer whose own ledger gets its row.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dispatch.core.units import MiB
from tests.conftest import Hostrun, wait_for

PY = sys.executable
DAY = 86400.0


def history(hostrun: Hostrun, *args: str) -> list[dict[str, Any]]:
    proc = hostrun.run("history", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, Any]] = json.loads(proc.stdout)
    return rows


def insert_old(state_dir: Path, *ages_days: float, label: str = "old") -> None:
    """Rows written directly into the runs table, ended ``ages_days`` ago (oldest first)."""
    con = sqlite3.connect(state_dir / "ledger.sqlite3", timeout=30)
    now = time.time()
    with con:
        for age in ages_days:
            ended = now - age * DAY
            con.execute("INSERT INTO runs (started, ended, duration, waited, host, label, session,"
                        " command, cap, kind, booked, peak, exit_code, outcome, hit_ceiling)"
                        " VALUES (?, ?, 1.0, 0.0, 'local', ?, NULL, 'true', ?, 'cap', ?, ?, 0,"
                        " 'exit', 0)", (ended - 1, ended, label, 64 * MiB, 64 * MiB, MiB))
    con.close()


def test_each_run_is_a_row_with_its_outcome(hostrun: Hostrun) -> None:
    env = {**os.environ, "HOSTRUN_SESSION": "agent-7"}
    assert hostrun.run("-m", "64M", "--label", "three", "--", "sh", "-c", "exit 3",
                       env=env).returncode == 3
    assert hostrun.run("-m", "100M", "--label", "hog", "--", PY, "-c",
                       "x = bytearray(300 << 20)").returncode == 250
    assert hostrun.run("-m", "64M", "--label", "slow", "--max-runtime", "0.5s", "--",
                       "sleep", "30").returncode == 253
    assert hostrun.run("-m", "64M", "--label", "gone", "--", "/nonexistent/tool").returncode == 127
    rows = history(hostrun)
    assert [r["label"] for r in rows] == ["three", "hog", "slow", "gone"]  # oldest first
    three, hog, slow, gone = rows
    assert (three["exit_code"], three["outcome"], three["session"]) == (3, "exit", "agent-7")
    assert three["command"] == "sh -c exit 3" and three["host"] == "local"
    assert three["cap_bytes"] == 64 * MiB and three["booking_kind"] == "cap"
    assert three["booked_bytes"] == 64 * MiB and three["peak_bytes"] > 0
    assert three["started"] <= three["ended"] and three["duration_s"] >= 0
    assert three["hit_ceiling"] is False
    assert (hog["exit_code"], hog["outcome"], hog["hit_ceiling"]) == (250, "own-cap", True)
    assert 90 * MiB <= hog["peak_bytes"] <= 100 * MiB and hog["session"] is None
    assert (slow["exit_code"], slow["outcome"]) == (253, "max-runtime")
    assert slow["duration_s"] >= 0.5
    assert (gone["exit_code"], gone["peak_bytes"]) == (127, None)  # booked, but nothing measured
    assert set(three) == {"id", "started", "ended", "duration_s", "waited_s", "host", "label",
                          "session", "command", "cap_bytes", "booking_kind", "booked_bytes",
                          "peak_bytes", "exit_code", "outcome", "hit_ceiling"}
    table = hostrun.run("history", env={**os.environ, "COLUMNS": "250"})
    assert table.returncode == 0, table.stderr
    assert "own-cap" in table.stdout and "max-runtime" in table.stdout and "hog" in table.stdout


def test_runs_that_never_started_are_not_in_it(hostrun: Hostrun, tmp_path: Path) -> None:
    assert hostrun.run("-m", "1G", "--", "true").returncode == 243  # larger than the slice
    assert hostrun.run("-m", "64M", "--bogus", "--", "true").returncode == 2
    started = tmp_path / "started"
    holder = hostrun.popen("-m", "250M", "--label", "holder", "--", "sh", "-c",
                           f"touch {started}; sleep 30")
    wait_for(started.exists)
    waiter = hostrun.popen("-m", "250M", "--label", "waiter", "--", "true")
    wait_for(lambda: any(b[1] == "waiter" and b[2] == "waiting" for b in hostrun.bookings()))
    waiter.send_signal(signal.SIGTERM)  # interrupted while waiting for room: nothing ran
    assert waiter.wait(timeout=10) == 128 + signal.SIGTERM
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=15)
    assert [(r["label"], r["exit_code"]) for r in history(hostrun)] == [("holder", 128 + 15)]


def test_filters_and_limit(hostrun: Hostrun) -> None:
    for label, session in (("build", "a"), ("test", "a"), ("build", "b"), ("build", "a")):
        assert hostrun.run("-m", "64M", "--label", label, "--session", session, "--",
                           "true").returncode == 0
    insert_old(hostrun.state_dir, 3.0, label="build")  # ended three days ago
    ids = [r["id"] for r in history(hostrun, "--label", "build")]
    assert len(ids) == 4
    assert [r["session"] for r in history(hostrun, "--label", "build", "--session", "a")] == ["a", "a"]
    assert [r["id"] for r in history(hostrun, "--label", "build", "--limit", "2")] == ids[-2:]
    assert len(history(hostrun, "--label", "build", "--since", "1d")) == 3
    assert len(history(hostrun, "--label", "build", "--since", "4d")) == 4
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() - 2 * DAY))
    assert len(history(hostrun, "--label", "build", "--since", day)) == 3
    assert history(hostrun, "--host", "peer1") == []
    assert len(history(hostrun, "--limit", "0")) == 5
    for bad in (("--since", "yesterday"), ("--limit", "-1"), ("--limit", "x")):
        proc = hostrun.run("history", *bad)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("hostrun: error: argument ") and len(proc.stderr.splitlines()) == 1


def test_a_bad_option_value_is_named_in_the_message(hostrun: Hostrun) -> None:
    """The line says what is wrong with the value, never the name of hostrun's own parsing function
    (argparse used to print "invalid _limit value: '-1'")."""
    for args, why in ((("--limit", "-1"), "argument --limit: must be 0 (all) or more: -1"),
                      (("--limit", "x"), "argument --limit: not a whole number: 'x'"),
                      (("--since", "yesterday"), "argument --since: not a duration ago")):
        proc = hostrun.run("history", *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"hostrun: error: {why}"), proc.stderr
        assert "_limit" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_history_is_pruned_by_rows(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0  # creates the ledger
    insert_old(hostrun.state_dir, *[0.5] * 10)
    hostrun.configure(top="history_rows = 3")
    assert hostrun.run("-m", "64M", "--label", "new", "--", "true").returncode == 0
    rows = history(hostrun, "--limit", "0")
    assert [r["label"] for r in rows] == ["old", "old", "new"]  # the latest three, by id


def test_history_is_pruned_by_age(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--label", "first", "--", "true").returncode == 0
    insert_old(hostrun.state_dir, 120.0, 91.0, 10.0)
    assert hostrun.run("-m", "64M", "--label", "second", "--", "true").returncode == 0
    rows = history(hostrun, "--limit", "0")
    assert [r["label"] for r in rows] == ["first", "old", "second"]  # 90 days by default
    assert time.time() - rows[1]["ended"] > 9 * DAY
    hostrun.configure(top="history_days = 5")
    assert hostrun.run("-m", "64M", "--label", "third", "--", "true").returncode == 0
    assert [r["label"] for r in history(hostrun, "--limit", "0")] == ["first", "second", "third"]


def test_history_settings_are_read_and_bad_ones_are_one_line_and_exit_2(hostrun: Hostrun) -> None:
    hostrun.configure(top="history_days = 0.5\nhistory_rows = 10")
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    assert len(history(hostrun)) == 1
    for top in ("history_days = 0", "history_rows = 0", "history_days = true",
                'history_rows = "many"'):
        hostrun.configure(top=top)
        proc = hostrun.run("-m", "64M", "--", "true")
        assert proc.returncode == 2, (top, proc.stderr)
        assert proc.stderr.count("\n") == 1 and top.split(" ")[0] in proc.stderr


def test_foreign_text_is_stored_and_printed_escaped(hostrun: Hostrun) -> None:
    argv = [os.fsencode(a) for a in hostrun.argv("-m", "64M", "--label", "odd", "--", "sh", "-c",
                                                 "exit 0")]
    argv += [b"\x1b[2J\xff"]  # a terminal escape and a byte that is not UTF-8, in an argument
    assert subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode == 0
    (row,) = history(hostrun)
    assert row["command"] == "sh -c exit 0 \x1b[2J\\xff"  # stored: not UTF-8 written as \xNN
    table = hostrun.run("history", "--label", "odd", env={**os.environ, "COLUMNS": "250"})
    assert table.returncode == 0 and "\x1b" not in table.stdout
    assert "sh -c exit 0 \\x1b[2J\\xff" in table.stdout


def test_an_older_ledger_gains_the_runs_table(hostrun: Hostrun) -> None:
    hostrun.state_dir.mkdir(mode=0o700)
    con = sqlite3.connect(hostrun.state_dir / "ledger.sqlite3")
    from dispatch.local.store.ledgerdb import SCHEMA

    with con:
        for statement in SCHEMA.split(";"):
            if statement.strip() and " runs" not in statement:
                con.execute(statement)
        con.execute("PRAGMA user_version = 4")
    con.close()
    assert hostrun.run("-m", "64M", "--label", "after", "--", "true").returncode == 0
    assert [r["label"] for r in history(hostrun)] == ["after"]


def test_a_peer_run_is_in_both_histories(hostrun: Hostrun, peers: Any, tmp_path: Path) -> None:
    from tests.support.peers import setup

    peer, tree = setup(hostrun, peers, tmp_path)
    proc = hostrun.run("--peer", "-m", "100M", "--label", "remote", "--session", "s1", "--",
                       "sh", "-c", "exit 5", cwd=tree)
    assert proc.returncode == 5, proc.stderr
    proc = hostrun.run("--peer", "-m", "100M", "--label", "remote-hog", "--", PY, "-c",
                       "x = bytearray(300 << 20)", cwd=tree)
    assert proc.returncode == 250, proc.stderr
    mine = history(hostrun)
    assert [(r["host"], r["label"], r["exit_code"], r["outcome"]) for r in mine] == [
        ("peer1", "remote", 5, "exit"), ("peer1", "remote-hog", 250, "own-cap")]
    assert mine[0]["session"] == "s1" and mine[0]["command"] == "sh -c exit 5"
    assert mine[0]["cap_bytes"] == 100 * MiB and mine[0]["peak_bytes"] > 0
    assert mine[1]["hit_ceiling"] is True
    assert history(hostrun, "--host", "peer1") == mine and history(hostrun, "--host", "local") == []
    con = sqlite3.connect(peer.state_dir / "ledger.sqlite3", timeout=30)
    theirs = con.execute("SELECT host, label, session, exit_code, outcome, hit_ceiling FROM runs"
                         " ORDER BY id").fetchall()
    con.close()
    assert theirs == [("local", "remote", "s1", 5, "exit", 0),
                      ("local", "remote-hog", None, 250, "own-cap", 1)]
