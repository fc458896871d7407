"""Waiting jobs observed from outside: a holder that keeps the room, a waiter's booking id and its
bell (the FIFO a release rings), with the status line and polling turned off."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.conftest import Hostrun, wait_for

# Waiters that take the ledger's lock themselves (not through the admission engine, whatever the
# environment says), with their safety retry off: they get in only when rung.
NO_POLL = {**os.environ, "HOSTRUN_WAIT_RECHECK": "3600", "HOSTRUN_ADMISSION": "direct"}


def no_status(hostrun: Hostrun, **settings: str) -> None:
    """Configure, with the waiting line (and the plain read that comes with it) once an hour."""
    hostrun.configure(**settings)
    text = hostrun.config_path.read_text()
    hostrun.config_path.write_text(text.replace('status_interval = "1s"', 'status_interval = "1h"'))


def waiting_id(hostrun: Hostrun, label: str) -> int | None:
    return next((b[0] for b in hostrun.bookings() if b[1] == label and b[2] == "waiting"), None)


def bell(hostrun: Hostrun, label: str) -> Path | None:
    """The waiter's FIFO once it listens, checked private and its own."""
    booking = waiting_id(hostrun, label)
    path = hostrun.state_dir / "wake" / str(booking)
    if booking is None or not path.exists():
        return None
    st = path.lstat()
    assert stat.S_ISFIFO(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE((hostrun.state_dir / "wake").stat().st_mode) == 0o700
    return path


def start_holder(hostrun: Hostrun, tmp_path: Path, size: str, name: str = "holder", *more: str
            ) -> tuple[subprocess.Popen[str], Path]:
    started, go = tmp_path / f"{name}.started", tmp_path / f"{name}.go"
    holder = hostrun.popen("-m", size, "--label", name, *more, "--", "sh", "-c",
                           f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, timeout=30)
    return holder, go
