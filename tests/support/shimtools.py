"""PATH shims under test: a fake ``cargo`` (a shell script that prints its arguments and whether it
runs inside a hostrun job), installing the shims, and running a line the way an agent's shell would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import Hostrun

FAKE_CARGO = """#!/bin/sh
echo "fake cargo $*"
[ -n "$HOSTRUN_JOB" ] && echo "in-job $HOSTRUN_JOB"
exit "${FAKE_EXIT:-0}"
"""


def fake_tools(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cargo").write_text(FAKE_CARGO)
    (bin_dir / "cargo").chmod(0o755)
    return bin_dir


def install(hostrun: Hostrun, directory: Path, *tools: str) -> subprocess.CompletedProcess[str]:
    args = ["shims", "install", str(directory)] + (["--tools", ",".join(tools)] if tools else [])
    return hostrun.run(*args)


def env_with(hostrun: Hostrun, *path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOSTRUN_JOB", "HOSTRUN_SESSION")}
    env["PATH"] = os.pathsep.join([*map(str, path), env["PATH"]])
    env["HOSTRUN_CONFIG"] = str(hostrun.config_path)
    env.update(extra)
    return env


def sh(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], env=env, cwd=cwd, text=True, capture_output=True,
                          timeout=120, check=False)
