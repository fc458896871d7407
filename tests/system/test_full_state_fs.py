"""A state dir on a real, small filesystem that fills while a job runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Hostrun, wait_for


@pytest.fixture
def small_state(hostrun: Hostrun) -> Iterator[Path]:
    """hostrun's state dir on its own 4 MiB tmpfs (root), unmounted at the end."""
    hostrun.state_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                    str(hostrun.state_dir)], check=True)
    try:
        yield hostrun.state_dir / "filler"
    finally:
        subprocess.run(["umount", "-l", str(hostrun.state_dir)], check=False)


def _fill(path: Path) -> None:
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


def test_a_run_the_engine_booked_is_released_on_a_full_disk(
        hostrun: Hostrun, small_state: Path, tmp_path: Path) -> None:
    """Through the admission engine, which holds the ledger open (its WAL already there), the
    release of a run that ends while the state fs is full goes through: no row is left; the record
    the full disk refused is one warning, and the job's exit status stands."""
    assert hostrun.run("-m", "32M", "--", "true").returncode == 0  # the ledger exists
    hostrun.ledger_closed()  # as between runs: the engine's grace over, its WAL checkpointed
    started, go = tmp_path / "started", tmp_path / "go"
    job = hostrun.popen("-m", "32M", "--", "sh", "-c",
                        f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, timeout=30)
    _fill(small_state)
    go.touch()
    _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert hostrun.bookings() == [], err
    (warning,) = err.strip().splitlines()
    assert warning.startswith("hostrun: warning: the peak and history row of this run were not "
                              "recorded: state dir ") and "(ENOSPC)" in warning, err
    small_state.unlink()
    assert hostrun.run("-m", "32M", "--", "true").returncode == 0


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_report_on_an_unwritable_state_dir_says_why(
        hostrun: Hostrun, small_state: Path, how: str) -> None:
    """``report`` that cannot open the ledger exits 78 and says why on stderr, not only stdout."""
    assert hostrun.run("-m", "32M", "--", "true").returncode == 0
    hostrun.ledger_closed()  # the engine's grace over: no file of the state dir open
    if how == "full":
        _fill(small_state)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(hostrun.state_dir)], check=True)
    done = hostrun.run("report")
    if how == "full":
        os.unlink(small_state)
    assert done.returncode == 78, done.stdout
    assert "host local:" in done.stderr, "exit 78 with nothing on stderr"
    assert "Traceback" not in done.stderr, done.stderr
