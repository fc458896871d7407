"""``dispatch.local.run.nested``: a hostrun inside a hostrun job, without root (the enclosing job is only a
name here; tests/system/test_run_local.py runs the real thing inside a real job cgroup)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dispatch.core.request import RunRequest
from dispatch.core.settings import Settings
from dispatch.local.run.nested import become, run_inside


def _no_settings() -> Settings:
    raise AssertionError("settings are needed only for a declared preflight")


def test_with_an_outcome_to_keep_it_runs_and_waits(tmp_path: Path) -> None:
    outcome = run_inside(RunRequest(argv=["sh", "-c", "exit 7"]), "/hostrun/1-2", keep_outcome=True,
                         settings=_no_settings, say=print)
    assert (outcome.exit_code, outcome.outcome, outcome.cgroup) == (7, "exit", "/hostrun/1-2")
    assert "enclosing hostrun job /hostrun/1-2" in (outcome.message or "")


def test_a_signal_is_128_plus_n() -> None:
    outcome = run_inside(RunRequest(argv=["sh", "-c", "kill -TERM $$"]), "/j", keep_outcome=True,
                         settings=_no_settings, say=print)
    assert (outcome.exit_code, outcome.outcome) == (128 + 15, "signal")


def test_a_missing_command_is_127_and_not_executable_126(tmp_path: Path) -> None:
    script = tmp_path / "plain"
    script.write_text("echo\n")  # not executable
    missing = become(RunRequest(argv=[str(tmp_path / "nope")]))
    denied = run_inside(RunRequest(argv=[str(script)]), "/j", keep_outcome=True,
                        settings=_no_settings, say=print)
    assert (missing.exit_code, denied.exit_code) == (127, 126)
    assert missing.message == f"cannot run {str(tmp_path / 'nope')!r}: No such file or directory"


def test_without_an_outcome_to_keep_it_becomes_the_command() -> None:
    """The process that called ``run_inside`` is replaced: its pid runs the command."""
    code = ("import os, sys\n"
            "from dispatch.core.request import RunRequest\n"
            "from dispatch.local.run.nested import run_inside\n"
            "print(os.getpid(), flush=True)\n"
            "run_inside(RunRequest(argv=['sh', '-c', 'echo $$; exit 3']), '/j', keep_outcome=False,\n"
            "           settings=None, say=print)\n"
            "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    before, after = done.stdout.split()
    assert (done.returncode, before) == (3, after)
