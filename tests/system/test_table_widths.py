"""Every table fits the terminal: at 80 and 200 columns each line of the tables of ``history``,
``ledger``, ``report``, ``dispatch``, ``capacity``, ``codes``, ``doctor`` and ``workdir list`` is
within the width and each row is one line (long labels, commands and sessions cut with an ellipsis),
while ``--json`` keeps the full text. Real runs through the real command line, the width set by
``COLUMNS`` as a terminal sets it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import Hostrun, wait_for

LABEL = "a-label-long-enough-to-need-cutting-at-eighty-columns-" + "x" * 30
SESSION = "session-with-a-name-as-long-as-some-agents-give-them-" + "y" * 20
WORDS = "and on " * 40
BOX = set("┏┃┡│└┌├╭╰")


def shown(h: Hostrun, width: int, *args: str) -> list[str]:
    done = h.run(*args, env={**os.environ, "COLUMNS": str(width), "HOSTRUN_SESSION": SESSION})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # a table's lines (prose after a table, e.g. capacity's notes, is wrapped by the terminal)
    too_wide = [line for line in lines if line[:1] in BOX and cell_len(line) > width]
    assert not too_wide, f"{args} at {width}: {too_wide}"
    return lines


def rows_of(lines: list[str]) -> list[str]:
    """A box table's body rows (between its header rule and its bottom rule)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    return lines[start + 1:end]


@pytest.fixture
def busy(hostrun: Hostrun) -> Iterator[Hostrun]:
    """Two finished runs with a long label and command, one running job filling the slice and one
    waiting behind it, all in the same long-named session."""
    env = {**os.environ, "HOSTRUN_SESSION": SESSION}
    for code in (0, 3):
        hostrun.run("-l", LABEL, "--", "sh", "-c", f"exit {code}; echo {WORDS}", env=env)
    # a label with no record: booked at its cap, the whole slice
    holder = hostrun.popen("-l", LABEL + "-holds", "-m", "300M", "--", "sleep", "60", env=env)
    wait_for(lambda: any(b[2] == "running" for b in hostrun.bookings()), timeout=30)
    waiter = hostrun.popen("-l", LABEL + "-waits", "-m", "64M", "--", "true", env=env)
    wait_for(lambda: any(b[2] == "waiting" for b in hostrun.bookings()), timeout=30)
    try:
        yield hostrun
    finally:
        for proc in (holder, waiter):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


@pytest.mark.parametrize("width", [80, 200])
def test_each_table_fits_with_one_line_per_row(busy: Hostrun, width: int) -> None:
    history = rows_of(shown(busy, width, "history"))
    assert len(history) == 2 and all("…" in row for row in history)  # the command is 300 characters
    assert ("a-label-long-enough" in history[0]) == (width == 200)  # more of the label where there is room
    header = next(line for line in shown(busy, width, "history") if line.startswith("┃"))
    assert ("session" in header) == (width == 200)  # docs/cli.md: left out first
    assert all(name in header for name in ("duration", "exit", "peak", "cap", "booked", "command"))
    ledger = shown(busy, width, "ledger")
    assert len(rows_of(ledger)) == 1 and any(line.startswith("│") and "…" in line for line in ledger)
    waiting = ledger[ledger.index(next(line for line in ledger if "queue (FIFO)" in line)):]
    assert len(rows_of(waiting)) == 1
    assert len(rows_of(shown(busy, width, "capacity"))) == 1
    assert len(rows_of(shown(busy, width, "dispatch", "-m", "64M", "--", "true"))) == 1
    assert len(rows_of(shown(busy, width, "codes"))) == len(json.loads(busy.run("codes", "--json").stdout))
    shown(busy, width, "report")
    shown(busy, width, "doctor")
    claimed = busy.tmp / "work" / ("a-work-directory-named-at-length-" + "z" * 60)
    done = busy.run("workdir", "claim", str(claimed), "--purpose", "a purpose told in many words " * 5,
                    env={**os.environ, "HOSTRUN_SESSION": SESSION})
    assert done.returncode == 0, done.stderr
    listed = rows_of(shown(busy, width, "workdir", "list", str(busy.tmp / "work")))
    assert len(listed) == 1 and "…" in listed[0]


def test_json_keeps_what_the_table_cuts(busy: Hostrun) -> None:
    runs = json.loads(busy.run("history", "--json").stdout)
    runs = runs["runs"] if isinstance(runs, dict) else runs
    assert [r["label"] for r in runs] == [LABEL, LABEL] and WORDS.strip() in runs[0]["command"]
    assert runs[0]["session"] == SESSION


def test_history_at_80_columns_keeps_peak_duration_end_cap_and_booked(hostrun: Hostrun) -> None:
    """The widest rows history has: a run OOM-killed at its cap (``250 own-cap``, ``ceiling``), a
    long label and command, and a run recorded under a long host name (a peer's). At 80 columns each
    row still shows how long it took, how it ended, its peak, its cap and its booking; the command
    is what gets cut (the README: "peak, duration, how each ended")."""
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store.ledgerdb import RunRecord

    hostrun.run("-l", LABEL, "-m", "20M", "--", "python3", "-c", f"x = bytearray(200 << 20)  # {WORDS}")
    hostrun.run("-l", LABEL, "--", "sh", "-c", f"exit 3; echo {WORDS}")
    ledger = Ledger(str(hostrun.state_dir))
    now = time.time()
    try:
        ledger.record_run(RunRecord(
            started=now - 60, ended=now, duration=60.0, waited=0.0, host="build-box-" + "h" * 40,
            label=LABEL, session=SESSION, command=f"make {WORDS}", cap=8 << 30, kind="peak",
            booked=5 << 30, peak=5 << 30, exit_code=0, outcome="exit", hit_ceiling=False),
            (90.0, 1000))
    finally:
        ledger.close()
    lines = shown(hostrun, 80, "history")
    header = next(line for line in lines if line.startswith("┃"))
    assert all(name in header for name in ("duration", "exit", "peak", "cap", "booked")), header
    own_cap, failed, elsewhere = rows_of(lines)
    assert "250 own-cap" in own_cap and "ceiling" in own_cap and "20 MiB cap" in own_cap, own_cap
    assert "…" in own_cap  # the command, cut
    assert "│ 3 " in failed or "│3 " in failed, failed
    assert "5.0 GiB peak" in elsewhere and "8.0 GiB" in elsewhere and "1 min" in elsewhere, elsewhere


def test_doctor_wraps_a_backends_reason_at_80_columns_and_never_cuts_it(tmp_path: Path) -> None:
    """What a backend lacks is what ``doctor`` is for: at 80 columns each probe's detail is in the
    table whole (folded onto more lines), word for word as ``--json`` gives it."""
    config = tmp_path / "hosts.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    probe = {**os.environ, "COLUMNS": "80"}
    argv = [sys.executable, "-m", "dispatch", "--config", str(config), "doctor"]
    details = {p["backend"]: p["detail"] for p in json.loads(subprocess.run(
        [*argv, "--json"], capture_output=True, text=True, check=True, env=probe).stdout)["probes"]}
    assert any(len(d) > 60 for d in details.values()), details  # one that 80 columns cannot hold
    lines = subprocess.run(argv, capture_output=True, text=True, check=True, env=probe).stdout.splitlines()
    assert all(cell_len(line) <= 80 for line in lines if line[:1] in BOX)
    shown: dict[str, str] = {}
    backend = ""
    for row in rows_of(lines):
        cells = [c.strip() for c in row.strip("│").split("│")]
        backend = cells[0] or backend  # a folded row continues the one above
        shown[backend] = f"{shown.get(backend, '')} {cells[2]}"
    assert not any("…" in text for text in shown.values()), shown
    for name, detail in details.items():
        assert "".join(shown[name].split()) == "".join(detail.split()), (name, shown[name])
