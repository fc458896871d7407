"""Fault injection: a damaged ledger, a read-only or full state dir, an unwritable --result-file.

Every case runs the real CLI against real cgroups and a real SQLite ledger, damages something, and
checks: the exit code, one ``hostrun:`` line about it (never a traceback), that the job's own exit
status is kept once it ran, and (the ``hostrun`` fixture's leak check) that no booking, job cgroup or
process is left. Read-only and full directories are real tmpfs mounts (root ignores chmod 0500).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.units import MiB
from tests.conftest import ON_CI, Hostrun, wait_for

PEAK_COLUMNS = "label, host, max_peak, runs, last_peak, hit_ceiling, last_duration, max_duration, updated"
RUN_COLUMNS = "label, host, peak, cap, hit_ceiling, duration, at"


def _table(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def peak_tables(hostrun: Hostrun) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The peak table and the peak history, as the ledger holds them."""
    db = hostrun.state_dir / "ledger.sqlite3"
    return (_table(db, f"SELECT {PEAK_COLUMNS} FROM peaks ORDER BY host, label"),
            _table(db, f"SELECT {RUN_COLUMNS} FROM peak_runs ORDER BY host, label, at"))


def record_some_peaks(hostrun: Hostrun) -> None:
    for label, size in (("small", 8), ("big", 40), ("small", 16)):
        proc = hostrun.run("-m", "64M", "--label", label, "--", "python3", "-c",
                           f"x = bytearray({size} << 20)")
        assert proc.returncode == 0, proc.stderr
    proc = hostrun.run("--label", "uncapped", "--", "true")  # cap NULL in the history
    assert proc.returncode == 0, proc.stderr
    hostrun.ledger_closed()  # as between runs: the engine's grace over, its WAL checkpointed


def ledger_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "ledger" in line]


def assert_one_recovery_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = ledger_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("hostrun: ledger ") and "was damaged" in lines[0], lines
    assert "moved it aside to ledger.sqlite3.corrupt-" in lines[0], lines
    return lines[0]


def corrupt_files(hostrun: Hostrun) -> list[Path]:
    return sorted(hostrun.state_dir.glob("ledger.sqlite3.corrupt-*"))


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(64 << 10))


def header_then_garbage(path: Path) -> None:
    data = path.read_bytes()
    assert data[:16] == b"SQLite format 3\x00"
    path.write_bytes(data[:100] + os.urandom(max(len(data), 64 << 10)))


def zero_bytes(path: Path) -> None:
    os.truncate(path, 0)


def wiped(path: Path) -> None:
    """Emptied, its WAL and shared-memory files deleted: what open connections still cache (a live
    WAL can hide damage to the main file from them) no longer reaches a new one."""
    os.truncate(path, 0)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("damage", [garbage, header_then_garbage, zero_bytes])
def test_damaged_ledger_is_moved_aside_and_the_peaks_rebuilt(hostrun: Hostrun, tmp_path: Path,
                                                             damage: Callable[[Path], None]) -> None:
    record_some_peaks(hostrun)
    before = peak_tables(hostrun)
    damage(hostrun.state_dir / "ledger.sqlite3")
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--label", "after", "--", "touch", str(marker))
    assert proc.returncode == 0
    assert_one_recovery_line(proc.stderr)
    assert marker.exists()
    (aside,) = corrupt_files(hostrun)
    assert aside.stat().st_mode & 0o777 == 0o600
    peaks, runs = peak_tables(hostrun)
    assert [p for p in peaks if p[0] != "after"] == before[0]
    assert [r for r in runs if r[0] != "after"] == before[1]
    # Recovered once: the next run says nothing.
    again = hostrun.run("-m", "64M", "--", "true")
    assert again.returncode == 0 and again.stderr == ""
    assert len(corrupt_files(hostrun)) == 1


def test_a_new_state_dir_is_created_without_a_word(hostrun: Hostrun) -> None:
    """The 0-byte file hostrun itself creates before the schema is not taken for a lost ledger."""
    proc = hostrun.run("-m", "64M", "--", "true")
    assert proc.returncode == 0 and proc.stderr == ""
    assert (hostrun.state_dir / "peaks.journal").exists()
    assert corrupt_files(hostrun) == []


def test_ledger_command_on_a_damaged_ledger(hostrun: Hostrun) -> None:
    record_some_peaks(hostrun)
    before = peak_tables(hostrun)
    garbage(hostrun.state_dir / "ledger.sqlite3")
    proc = hostrun.run("ledger", "--json")
    assert proc.returncode == 0
    assert_one_recovery_line(proc.stderr)
    shown = json.loads(proc.stdout)
    assert sorted(p["label"] for p in shown["peaks"]) == sorted(p[0] for p in before[0])
    assert peak_tables(hostrun) == before


def test_doctor_reports_a_damaged_ledger_and_leaves_it(hostrun: Hostrun) -> None:
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    ok = json.loads(hostrun.run("doctor", "--json").stdout)
    assert ok["ledger_check"]["ok"] is True
    hostrun.ledger_closed()  # as between runs: the engine's grace over, its WAL checkpointed
    header_then_garbage(hostrun.state_dir / "ledger.sqlite3")
    proc = hostrun.run("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ledger_check"]["ok"] is False
    assert "is damaged" in data["ledger_check"]["detail"]
    assert data["ledger_check"]["detail"] in data["problems"]
    plain = hostrun.run("doctor")
    assert "Traceback" not in plain.stderr
    assert "is damaged" in plain.stdout
    assert corrupt_files(hostrun) == []  # doctor only looks
    fixed = hostrun.run("-m", "64M", "--", "true")
    assert fixed.returncode == 0
    assert_one_recovery_line(fixed.stderr)


def test_ledger_damaged_under_a_running_job(hostrun: Hostrun, tmp_path: Path) -> None:
    """The running job's hostrun keeps its job's exit status; a new run neither hangs nor fails. The
    admission engine, which holds both bookings and writes the new run's record, meets the damage,
    recovers the ledger (the running job re-booked with its own id and label, over the row its
    cgroup gave) and tells both runs in the recovery's own line."""
    record_some_peaks(hostrun)
    ready, go = tmp_path / "ready", tmp_path / "go"
    running = hostrun.popen("-m", "100M", "--label", "long", "--", "sh", "-c",
                            f"touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done; exit 7")
    wait_for(ready.exists, timeout=20)
    (booked,) = [b[0] for b in hostrun.bookings()]
    zero_bytes(hostrun.state_dir / "ledger.sqlite3")
    new = hostrun.run("-m", "64M", "--", "true", timeout=45)  # it used to hang 60 s, then fail
    assert new.returncode == 0
    assert_one_recovery_line(new.stderr)
    shown = json.loads(hostrun.run("ledger", "--json").stdout)
    (rebooked,) = shown["running"]
    assert (rebooked["id"], rebooked["pid"], rebooked["label"]) == (booked, running.pid, "long")
    assert rebooked["size"] == 100 * MiB and rebooked["stale"] is False
    go.touch()
    _, err = running.communicate(timeout=60)
    assert running.returncode == 7, err
    assert "Traceback" not in err
    (line,) = ledger_lines(err)
    assert line == assert_one_recovery_line(new.stderr), (line, new.stderr)
    assert "2 running jobs re-booked" in line, line  # the long job and the new run, then running
    labels = [p[0] for p in peak_tables(hostrun)[0]]
    assert "long" in labels and "small" in labels


def test_running_hostrun_finds_its_ledger_damaged(hostrun: Hostrun, tmp_path: Path) -> None:
    """Nobody else opens the ledger: the job's own hostrun meets the damage when it records the peak."""
    record_some_peaks(hostrun)
    before = peak_tables(hostrun)
    ready, go = tmp_path / "ready", tmp_path / "go"
    running = hostrun.popen("-m", "64M", "--label", "long", "--", "sh", "-c",
                            f"touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done; exit 0")
    wait_for(ready.exists, timeout=20)
    garbage(hostrun.state_dir / "ledger.sqlite3")
    go.touch()
    _, err = running.communicate(timeout=60)
    assert running.returncode == 0, err
    assert_one_recovery_line(err)
    peaks, _ = peak_tables(hostrun)
    assert [p for p in peaks if p[0] != "long"] == before[0]
    assert [p[3] for p in peaks if p[0] == "long"] == [1]  # recorded once, not twice


def test_a_waiter_keeps_its_place_and_admission_holds(hostrun: Hostrun, tmp_path: Path) -> None:
    """Recovered while one job runs and another waits: the running one is re-booked from its cgroup,
    the waiter puts its own booking back (same id) and waits for that room, then starts."""
    marks, go = tmp_path / "marks", tmp_path / "go"
    first = hostrun.popen("-m", "200M", "--label", "first", "--", "sh", "-c",
                          f"echo first-start >> {marks}; while [ ! -e {go} ]; do sleep 0.05; done; "
                          f"echo first-end >> {marks}")
    wait_for(lambda: marks.exists() and "first-start" in marks.read_text(), timeout=20)
    second = hostrun.popen("-m", "200M", "--label", "second", "--", "sh", "-c",
                           f"echo second-start >> {marks}")
    wait_for(lambda: any(b[2] == "waiting" for b in hostrun.bookings()), timeout=20)
    (waiting_id,) = [b[0] for b in hostrun.bookings() if b[2] == "waiting"]
    wiped(hostrun.state_dir / "ledger.sqlite3")
    shown = hostrun.run("ledger", "--json")  # recovers: the waiter is not re-booked, it does that
    assert_one_recovery_line(shown.stderr)
    assert [b["label"] for b in json.loads(shown.stdout)["running"]] == ["recovered"]
    wait_for(lambda: [b[0] for b in hostrun.bookings() if b[2] == "waiting"] == [waiting_id],
             timeout=20)
    time.sleep(1.5)  # more locked attempts: it must keep waiting behind the re-booked first job
    assert second.poll() is None
    go.touch()
    _, first_err = first.communicate(timeout=60)
    _, second_err = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (first_err, second_err)
    assert marks.read_text().split() == ["first-start", "first-end", "second-start"]
    for err in (first_err, second_err):
        assert "Traceback" not in err
        (line,) = ledger_lines(err)
        assert "was replaced (recovered by another hostrun); put back booking" in line
    assert f"put back booking {waiting_id}" in second_err


def test_journal_compaction_keeps_what_a_rebuild_gives(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Compacted (P and H lines) or not, a rebuild from the journal equals the ledger it came from."""
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store import peakjournal

    monkeypatch.setattr(peakjournal, "COMPACT_AT", 4096)
    state = tmp_path / "state"
    said: list[str] = []
    ledger = Ledger(str(state), said.append, lambda: [])
    for i in range(400):
        ledger.record_peak(f"job\t{i % 3}\n", "local", (i * 7919) % 1000 + 1, i == 50, i / 7,
                           cap=None if i % 4 else 64 * MiB)
    journal = (state / "peaks.journal").read_text()
    assert "\nP\t" in journal and "\nH\t" in journal  # compacted at least once
    assert len(journal) < 16 << 10  # 3 labels, 60 history rows: a snapshot is ~4 KiB
    before = ledger.peaks(), ledger.peak_runs()
    ledger.close()
    garbage(state / "ledger.sqlite3")
    ledger = Ledger(str(state), said.append, lambda: [])
    assert (ledger.peaks(), ledger.peak_runs()) == before
    ledger.close()
    assert len(said) == 1 and "was damaged" in said[0]


# -- item 9: the state dir read-only or full --------------------------------------------------------
@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mount a tmpfs with the given options at a directory; unmounted at teardown."""
    made: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if ON_CI:
                pytest.fail(f"CI=true but cannot mount a tmpfs: {proc.stderr}")
            pytest.skip(f"cannot mount a tmpfs: {proc.stderr}")  # only off CI
        made.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(made):
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    finally:
        os.close(fd)


def assert_state_dir_error(proc: subprocess.CompletedProcess[str], state: Path, name: str) -> None:
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"hostrun: error: state dir {state}: ") and f"({name})" in lines[0], lines


def test_read_only_state_dir_is_78_and_nothing_runs(hostrun: Hostrun, tmp_path: Path,
                                                   tmpfs: Callable[[Path, str], Path]) -> None:
    state = tmpfs(hostrun.state_dir, "ro,size=1m,mode=0700")
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--", "touch", str(marker))
    assert_state_dir_error(proc, state, "EROFS")
    assert not marker.exists()
    assert_state_dir_error(hostrun.run("ledger"), state, "EROFS")
    assert hostrun.job_dirs() == [] and hostrun.slice_pids() == []


def test_read_only_state_dir_with_a_ledger_in_it(hostrun: Hostrun, tmp_path: Path,
                                                 tmpfs: Callable[[Path, str], Path]) -> None:
    state = tmpfs(hostrun.state_dir, "size=1m,mode=0700")
    assert hostrun.run("-m", "64M", "--", "true").returncode == 0
    hostrun.ledger_closed()  # the engine's grace over: no file of the state dir open
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--", "touch", str(marker))
    assert_state_dir_error(proc, state, "EROFS")
    assert not marker.exists()
    subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    assert hostrun.bookings() == [] and hostrun.job_dirs() == [] and hostrun.slice_pids() == []


@pytest.mark.parametrize("existing", [False, True])
def test_full_state_dir_is_78_and_nothing_is_booked(hostrun: Hostrun, tmp_path: Path, existing: bool,
                                                    tmpfs: Callable[[Path, str], Path]) -> None:
    state = tmpfs(hostrun.state_dir, "size=1m,mode=0700")
    if existing:
        assert hostrun.run("-m", "64M", "--", "true").returncode == 0
        hostrun.ledger_closed()  # as between runs: the engine's grace over, its WAL gone
    fill(state)
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--", "touch", str(marker))
    assert_state_dir_error(proc, state, "ENOSPC")
    assert not marker.exists()
    (state / "filler").unlink()
    assert hostrun.bookings() == [] and hostrun.job_dirs() == [] and hostrun.slice_pids() == []


# -- item 11: --result-file that cannot be written ---------------------------------------------------
def test_result_file_in_a_missing_directory_is_2_before_running(hostrun: Hostrun, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--result-file", "/nonexistent/dir/x.json", "--", "touch", str(marker))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hostrun: error: --result-file /nonexistent/dir/x.json: cannot write there: "
        "No such file or directory (see 'hostrun --help')"]
    assert not marker.exists()


def test_result_file_in_a_read_only_directory_is_2_before_running(
        hostrun: Hostrun, tmp_path: Path, tmpfs: Callable[[Path, str], Path]) -> None:
    out = tmpfs(tmp_path / "ro", "ro,size=64k") / "r.json"
    marker = tmp_path / "ran"
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "touch", str(marker))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hostrun: error: --result-file {out}: cannot write there: Read-only file system "
        "(see 'hostrun --help')"]
    assert not marker.exists()


def test_result_file_directory_removed_during_the_run_keeps_the_status(hostrun: Hostrun,
                                                                        tmp_path: Path) -> None:
    where = tmp_path / "results"
    where.mkdir()
    out = where / "r.json"
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                       f"rm -r {where}; exit 5")
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hostrun: warning: could not write the result file {out}: No such file or directory"]


def test_result_file_that_cannot_replace_leaves_no_tmp(hostrun: Hostrun, tmp_path: Path) -> None:
    where = tmp_path / "results"
    where.mkdir()
    out = where / "r.json"
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                       f"mkdir {out}; exit 0")  # the job puts a directory where the file goes
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hostrun: warning: could not write the result "
                                                   f"file {out}: "), proc.stderr
    assert sorted(p.name for p in where.iterdir()) == ["r.json"]  # no stray .tmp


def test_a_ledger_being_created_is_never_taken_for_a_damaged_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """Thirty concurrent runs on a fresh state dir once overbooked (CI: 6 jobs at once on a slice
    for 3): the first process wrote the peak journal inside its schema transaction, a second one
    saw "version 0 and a journal" before the commit, took it for a ledger that lost its contents,
    moved it aside and started fresh, and the bookings in it were gone. Here the second process
    opens at exactly that moment (when the first writes its journal)."""
    from dispatch.local.admission.ledger import Ledger
    from dispatch.local.store import peakjournal

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    seen: list[Any] = []
    real = peakjournal.write_snapshot

    def and_another_process_opens(path: str, *args: Any) -> None:
        real(path, *args)
        if not seen:
            other = Ledger(str(state), seen.append, lambda: [])
            seen.append(other.bookings())
            other.close()

    monkeypatch.setattr(peakjournal, "write_snapshot", and_another_process_opens)
    first = Ledger(str(state), seen.append, lambda: [])
    try:
        assert first.bookings() == []
    finally:
        first.close()
    assert seen == [[]], seen  # the other opened a sound, empty ledger, and said nothing
    assert not list(state.glob("ledger.sqlite3.corrupt-*"))
