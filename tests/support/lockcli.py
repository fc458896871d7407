"""``hostrun lock`` and ``hostrun workdir`` run as a user would, with a private state dir."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


class Cli:
    """``python -m dispatch`` with its own config (status lines every 0.5 s) and state dir."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.config = tmp_path / "hosts.toml"
        self.config.write_text(f'state_dir = "{tmp_path / "state"}"\nstatus_interval = "500ms"\n')
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, session: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("HOSTRUN_SESSION", "HOSTRUN_JOB")}
        if session is not None:
            env["HOSTRUN_SESSION"] = session
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dispatch", "--config", str(self.config), *args]

    def run(self, *args: str, session: str | None = "tester", timeout: float = 60,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                              env=self.env(session), check=False, cwd=cwd)

    def popen(self, *args: str, session: str | None = "tester", stderr: Path) -> subprocess.Popen[str]:
        with open(stderr, "w") as err:
            proc = subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=self.env(session))
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """A ``Cli`` whose background runs are killed at the end of the test."""
    c = Cli(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
