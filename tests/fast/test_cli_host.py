"""``hostrun --host NAME``: which host, and the one-line errors (no cluster or peer contacted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode

TABLE = "[hosts.farm]\nkind = 'slurm'\nslurm_conf = '/nonexistent/slurm.conf'\n"


def run(tmp_path: Path, top: str, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path / 'state'}'\n{top}\n{TABLE}")
    return subprocess.run([sys.executable, "-m", "dispatch", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("top", "args", "code", "line"), [
    ("enable_across_machines = true", ("--host", "nope", "--", "true"), ExitCode.USAGE,
     "hostrun: error: --host nope: no such host (configured: farm, local) (see 'hostrun --help')"),
    ("enable_across_machines = true", ("--host", "farm", "--peer=farm", "--", "true"), ExitCode.USAGE,
     "hostrun: error: --host NAME says where the job runs: not with --peer or --auto "
     "(see 'hostrun --help')"),
    ("enable_across_machines = true", ("--host", "farm", "--auto", "--", "true"), ExitCode.USAGE,
     "hostrun: error: --host NAME says where the job runs: not with --peer or --auto "
     "(see 'hostrun --help')"),
    ("", ("--host", "farm", "--", "true"), ExitCode.ACROSS_DISABLED,
     "hostrun: error: --host farm: enable_across_machines is off (set it in the config or "
     "ENABLE_ACROSS_MACHINES=1); not running locally instead"),
])
def test_host_errors_are_one_line(tmp_path: Path, top: str, args: tuple[str, ...], code: int,
                                  line: str) -> None:
    done = run(tmp_path, top, *args)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (code, [line], "")


def test_a_missing_slurm_conf_is_said_at_once(tmp_path: Path) -> None:
    """Slurm's clients would retry a missing SLURM_CONF for 60 s: hostrun says it before srun."""
    done = run(tmp_path, "enable_across_machines = true", "--host", "farm", "--", "true")
    assert (done.returncode, done.stderr.splitlines()) == (ExitCode.USAGE, [
        "hostrun: error: hosts.farm.slurm_conf: /nonexistent/slurm.conf: no such file; nothing ran"])
