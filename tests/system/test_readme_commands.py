"""The README's test command as a normal user on this machine: ``./scripts/test`` run by a real second
local user from a copy of the checkout sets itself up without root, runs what needs no root, and ends
with one line naming what it did not run and why.

A narrow selection keeps it short (one file of pure tests and one of tests that need root); the
line it ends with is the same for the whole suite. The README's other command, ``./scripts/demo``,
runs as root on this machine in ``test_the_demo_runs_as_root_here`` and as a normal user in the test
VM (tests/vm/test_vm_readme.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import OtherUser

REPO = Path(__file__).resolve().parents[2]


def _copy_checkout(target: Path) -> None:
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if not rel or not (REPO / rel).exists():
            continue
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)


def test_scripts_test_as_a_normal_user_names_what_it_did_not_run(other_user: OtherUser) -> None:
    checkout = other_user.home / "hostrun"
    _copy_checkout(checkout)
    other_user.chown(checkout)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(other_user.home),
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    done = other_user.run(["./scripts/test", "-q", "tests/fast/test_units.py",
                           "tests/system/test_run_local.py"],
                          cwd=checkout, env=env, check=False, timeout=1200)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "setup: ready" in out
    lines = [line for line in out.splitlines() if line.startswith("not run here:")]
    assert len(lines) == 1, out[-2000:]
    assert "need root (real cgroups, a second user)" in lines[0]
    assert " passed" in out and " skipped" in out


@pytest.mark.system  # needs root: a local sshd peer (it uses no system fixture)
def test_the_demo_runs_as_root_here() -> None:
    """The README's first command as root on this machine (cgroup v1, a local sshd peer)."""
    if os.geteuid() != 0:
        from tests.conftest import _unavailable

        _unavailable("the demo's second machine here needs root (a local sshd peer)")
    done = subprocess.run(["./scripts/demo"], cwd=REPO, capture_output=True, text=True, timeout=900,
                          check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "exit 250 (250 = OOM-killed at its own cap" in out
    assert "both hosts, read in parallel over SSH" in out
    assert "exit 250 (250 on the peer, under its own cap)" in out
