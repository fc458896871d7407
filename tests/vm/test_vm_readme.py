"""The README's first command on a stock workstation: ``./scripts/demo`` run from a checkout in the
test VM (Debian 12, systemd + cgroup v2) by its normal user and by root, with nothing set up
beforehand (as root the demo must not need the test suite's Debian packages: the VM has no mirror). The
demo's own ``scripts/setup`` makes the virtualenv; the VM reaches no index, so pip is pointed at the
wheels built and downloaded here (``tests.support.vm.build_wheelhouse``, the ``wheelhouse`` fixture).

The README's test command, ``./scripts/test``, runs in the VM too, by both users at once, on a narrow
selection (one file of pure tests, one of tests that need root and cgroup v1: ~2,000 tests in an
emulated machine take far longer than the suite's budget): set-up from nothing, ruff, mypy --strict on
the whole package, and the one line naming what did not run and why. As root the VM has no package
mirror: set-up says what it could not install and goes on.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.vm import copy_checkout

REPO = Path(__file__).resolve().parents[2]
WHEELS = "/tmp/hostrun-wheels"


USERS = ("dev", "root")


def from_checkout_as_both_users(vm: Any, guest: Any, command: str, timeout: float) -> dict[str, str]:
    """``command`` run from a fresh copy of this checkout in the VM by its normal user and by root at
    once (one emulated CPU each: both in the time of one), pip pointed at the wheelhouse and told not
    to byte-compile (minutes in the emulated VM): each one's output, ending ``exit=N``."""
    def one(user: str) -> str:
        g = guest(user)
        checkout = f"{g.dir}/hostrun"
        copy_checkout(vm, user, REPO, checkout)
        return g.sh(f"cd {checkout} && PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_NO_COMPILE=1 "
                    f"{command} 2>&1; echo exit=$?", timeout=timeout, check=False).stdout

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(USERS, pool.map(one, USERS)))


def test_the_demo_runs_on_systemd_as_both_users(vm: Any, guest: Any, wheelhouse: Path) -> None:
    outputs = from_checkout_as_both_users(vm, guest, "./scripts/demo", timeout=1200)
    for user, out in outputs.items():
        # Once both have ended: its slice unit and private directory are gone.
        manager = "systemctl --user" if user == "dev" else "systemctl"
        left = vm.ssh(user, f"{manager} list-units --all --plain --no-legend 'hostrun-demo*'; "
                      "ls -d /tmp/hostrun-demo.* 2>/dev/null", check=False).stdout.strip()
        assert out.rstrip().endswith("exit=0"), f"{user}: {out[-3000:]}"
        assert "backend:  systemd" in out
        if user == "dev":
            assert "in the user manager" in out
        else:  # the system manager's slice, under hostrun.slice
            assert "in the user manager" not in out and "(/sys/fs/cgroup/hostrun.slice/hostrun-demo" in out
        assert "allocated 100 MiB under a 300 MiB cap" in out
        assert "exit 250 (250 = OOM-killed at its own cap" in out
        assert '"outcome": "own-cap"' in out
        assert "demo: to try two machines" in out  # the sshd peer is for cgroup v1; no qemu in the VM
        assert left == "", f"{user}: {left}"


def test_scripts_test_runs_on_systemd_as_both_users(vm: Any, guest: Any, wheelhouse: Path) -> None:
    outputs = from_checkout_as_both_users(
        vm, guest,
        "./scripts/test -q -p no:cacheprovider tests/fast/test_units.py tests/system/test_run_local.py",
        timeout=2400)
    for user, out in outputs.items():
        print(f"--- {user}: ./scripts/test's set-up, not-run and summary lines\n"  # pytest -rP shows it
              + "\n".join(line for line in out.splitlines()
                          if line.startswith(("setup:", "not run here:")) or " passed" in line))
        assert out.rstrip().endswith("exit=0"), f"{user}: {out[-3000:]}"
        assert "setup: ready" in out and "Success: no issues found" in out, f"{user}: {out[-3000:]}"
        not_run = [line for line in out.splitlines() if line.startswith("not run here:")]
        assert len(not_run) == 1, f"{user}: {out[-2000:]}"
        assert " passed" in out and " skipped" in out
        if user == "dev":
            assert "need root (real cgroups, a second user)" in not_run[0], not_run[0]
        else:  # root, but the suite's own cgroup tests are cgroup v1's; and no mirror for the packages
            assert "need cgroup v1 (the suite's own cgroup tests" in not_run[0], not_run[0]
            assert "setup: could not install" in out and "no package mirror?" in out
