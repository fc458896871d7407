"""The rules that turn what happened into a number live in ``dispatch.core.exitcodes`` alone
(docs/design.md, "Exit codes"), and a verdict carries its code and outcome name together."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode, exec_failure, from_wait_status, interrupted
from dispatch.core.outcome import Outcome

PACKAGE = Path(__file__).resolve().parents[2] / "dispatch"
HOSTRUN_CODES = {int(c) for c in ExitCode} | {126, 127, 130, 141}


def _status(argv: list[str]) -> int:
    pid = os.posix_spawnp(argv[0], argv, dict(os.environ))
    return os.waitpid(pid, 0)[1]


def test_a_wait_status_becomes_the_jobs_code_or_128_plus_the_signal() -> None:
    assert from_wait_status(_status(["sh", "-c", "exit 7"])) == (7, "exit")
    assert from_wait_status(_status(["sh", "-c", "kill -TERM $$"])) == (128 + signal.SIGTERM, "signal")
    assert interrupted(signal.SIGINT) == 130 and interrupted(signal.SIGPIPE) == 141


def test_a_command_that_cannot_start_is_127_or_126_as_a_shell_says(tmp_path: Path) -> None:
    not_executable = tmp_path / "no-exec"
    not_executable.write_text("#!/bin/sh\n")
    for target in (not_executable, tmp_path / "missing"):
        shell = subprocess.run(["sh", "-c", str(target)], capture_output=True, check=False).returncode
        with pytest.raises(OSError) as refused:
            subprocess.run([str(target)], check=False)
        assert exec_failure(refused.value)[0] == shell, target
    assert exec_failure(ValueError("embedded null byte"))[0] == 127


def test_a_verdict_sets_the_code_and_its_outcome_name_together() -> None:
    outcome = Outcome.of(ExitCode.NOT_RUN, host="local", label="x", argv=["true"], message="m")
    assert (outcome.exit_code, outcome.outcome, outcome.message) == (78, "not-run", "m")
    outcome.mark(ExitCode.SYNC_FAILED)
    assert (outcome.exit_code, outcome.outcome) == (252, "sync-failed")


def _literals(source: str) -> list[tuple[int, int]]:
    """Where ``source`` writes one of hostrun's codes as a number (``return 141``, ``os._exit(127)``,
    ``exit_code=246``). 2 is left out: ``argparse``-style usage errors and many counts use it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        value = None
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            value = node.value.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            if ast.unparse(node.func) in ("os._exit", "sys.exit", "exit", "leave"):
                value = node.args[0].value
        elif (isinstance(node, ast.keyword) and node.arg == "exit_code"
              and isinstance(node.value, ast.Constant)):
            value = node.value.value
        if type(value) is int and value in HOSTRUN_CODES and value != 2:
            found.append((getattr(node, "lineno", 0), value))
    return found


def test_the_literal_check_finds_each_form() -> None:
    source = "def f(x):\n    if x:\n        return 141\n    g(exit_code=246)\n    os._exit(127)\n"
    assert sorted(v for _, v in _literals(source)) == [127, 141, 246]
    assert _literals("def f():\n    return 0\n") == []


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py") if p.name != "exitcodes.py"),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_exit_code_literal_outside_exitcodes(path: Path) -> None:
    """A code written as a number outside the table would drift from it and from the docs."""
    assert _literals(path.read_text()) == [], f"{path.relative_to(PACKAGE)}: codes as numbers"
