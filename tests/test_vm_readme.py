"""The README's first command on a stock workstation: ``./scripts/demo`` run from a checkout in the
test VM (Debian 12, systemd + cgroup v2) by its normal user and by root, with nothing set up
beforehand (as root the demo must not need the test suite's Debian packages: the VM has no mirror). The
demo's own ``scripts/setup`` makes the virtualenv; the VM reaches no index, so pip is pointed at the
wheels built and downloaded here (``tests.support.vm.build_wheelhouse``, the ``wheelhouse`` fixture).

Not run in the VM: ``./scripts/test`` itself (mypy and 1,400 tests in an emulated machine take far
longer than the suite's budget); as a normal user it is run on this machine instead
(``test_scripts_test_as_a_normal_user_names_what_it_did_not_run``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.vm import copy_checkout

REPO = Path(__file__).resolve().parent.parent
WHEELS = "/tmp/hostrun-wheels"


@pytest.mark.parametrize("user", ["dev", "root"])
def test_the_demo_runs_on_systemd(vm: Any, guest: Any, wheelhouse: Path, user: str) -> None:
    g = guest(user)
    checkout = f"{g.dir}/hostrun"
    copy_checkout(vm, user, REPO, checkout)
    done = g.sh(f"cd {checkout} && PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_NO_COMPILE=1 "
                "./scripts/demo 2>&1; echo demo-exit=$?", timeout=1200, check=False)
    out = done.stdout
    assert "demo-exit=0" in out, out[-3000:]
    assert "backend:  systemd" in out
    if user == "dev":
        assert "in the user manager" in out
    else:  # the system manager's slice, under hostrun.slice
        assert "in the user manager" not in out and "(/sys/fs/cgroup/hostrun.slice/hostrun-demo" in out
    assert "allocated 100 MiB under a 300 MiB cap" in out
    assert "exit 250 (250 = OOM-killed at its own cap" in out
    assert '"outcome": "own-cap"' in out
    assert "demo: to try two machines" in out  # the sshd peer is for cgroup v1; no qemu in the VM
    # Its slice unit and private directory are gone.
    manager = "systemctl --user" if user == "dev" else "systemctl"
    left = g.sh(f"{manager} list-units --all --plain --no-legend 'hostrun-demo*'; "
                "ls -d /tmp/hostrun-demo.* 2>/dev/null", check=False).stdout.strip()
    assert left == ""
