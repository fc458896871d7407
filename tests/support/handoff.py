"""Waiting jobs observed from outside: a holder that keeps the room, a waiter's booking id, with
the status line turned off."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import Hostrun, wait_for


def no_status(hostrun: Hostrun, **settings: str) -> None:
    """Configure, with the waiting line (and the plain read that comes with it) once an hour."""
    hostrun.configure(**settings)
    text = hostrun.config_path.read_text()
    hostrun.config_path.write_text(text.replace('status_interval = "1s"', 'status_interval = "1h"'))


def waiting_id(hostrun: Hostrun, label: str) -> int | None:
    return next((b[0] for b in hostrun.bookings() if b[1] == label and b[2] == "waiting"), None)


def start_holder(hostrun: Hostrun, tmp_path: Path, size: str, name: str = "holder", *more: str
            ) -> tuple[subprocess.Popen[str], Path]:
    started, go = tmp_path / f"{name}.started", tmp_path / f"{name}.go"
    holder = hostrun.popen("-m", size, "--label", name, *more, "--", "sh", "-c",
                           f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, timeout=30)
    return holder, go
