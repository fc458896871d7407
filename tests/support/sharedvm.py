"""The shared slice in the test VM, for tests/vm/test_vm_shared.py and tests/vm/test_vm_shared_hostile.py:
its real users (``User``: one user's hostrun under ``runuser``), the module fixture ``shared`` that
installs the daemon and uninstalls it at the end, and a booked job that holds until released."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch.core.units import MiB

GROUP = "hostrun-shared"
ROOT = "/tmp/hostrun-shared-tests"
SLICE = 400 * MiB


class User:
    """One user's hostrun in the VM: its own directory, config and state; run through ``runuser``
    from root's ssh login, so a group just added applies (an existing login would not have it)."""

    def __init__(self, vm: Any, name: str) -> None:
        self.vm = vm
        self.name = name
        self.dir = f"{ROOT}/{name}"
        self.config = f"{self.dir}/hosts.toml"
        text = (f'state_dir = "{self.dir}/state"\nstatus_interval = "1s"\nkill_grace = "2s"\n'
                'gamble_size = "50M"\n[hosts.local]\nslice = "1G"\n')
        vm.ssh("root", f"mkdir -p -m 1777 {ROOT} && rm -rf {self.dir} && "
                       f"runuser -u {name} -- mkdir -m 700 {self.dir}")
        self.sh(f"cat > {self.config}", input=text)

    def sh(self, script: str, timeout: float = 300, check: bool = True,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.vm.ssh("root", f"cd {ROOT} && runuser -u {self.name} -- sh -c "
                                   f"{shlex.quote(f'cd {self.dir} || exit 99; {script}')}",
                           timeout=timeout, check=check, input=input)

    def cmd(self, *args: str) -> str:
        return shlex.join(["hostrun", "--config", self.config, *args])

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.sh(self.cmd(*args), timeout=timeout, check=False)

    def status(self) -> dict[str, Any]:
        done = self.run("shared", "status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def shared(vm: Any) -> Iterator[dict[str, User]]:
    vm.ssh("root", f"getent group {GROUP} >/dev/null || groupadd {GROUP}; "
                   f"for u in dev2 dev3; do id $u >/dev/null 2>&1 || useradd -m -s /bin/sh $u; done; "
                   f"usermod -aG {GROUP} dev && usermod -aG {GROUP} dev2")
    done = vm.ssh("root", f"hostrun shared install --group {GROUP} --size {SLICE}", check=False)
    assert done.returncode == 0, done.stderr
    assert "shared slice hostrun.slice of 400 MiB" in done.stderr
    users = {name: User(vm, name) for name in ("dev", "dev2", "dev3")}
    try:
        yield users
    finally:
        done = vm.ssh("root", "hostrun shared uninstall; ls /run/hostrun/shared.sock "
                              "/etc/systemd/system/hostrun-shared.* 2>&1; "
                              "ls -d /sys/fs/cgroup/hostrun.slice/hostrun-shared-* 2>/dev/null; "
                              f"rm -rf {ROOT}", check=False)
        assert "removed hostrun-shared.socket, hostrun-shared.service" in done.stderr
        assert "hostrun-shared-" not in done.stdout, done.stdout  # no scope left behind
        assert done.stdout.count("No such file") == 2, done.stdout


def _holder_script(u: User, size_m: int, touch_m: int, label: str) -> str:
    """A job booked at ``size_m`` MiB that touches ``touch_m`` MiB, writes its pid to ``ready``, and
    holds on until ``release`` exists."""
    job = ["python3", "-c", f"import os, time; x = bytearray({touch_m} << 20); "
                            f"open('{u.dir}/ready', 'w').write(str(os.getpid()))\n"
                            f"while not os.path.exists('{u.dir}/release'): time.sleep(0.1)"]
    return u.cmd("-m", f"{size_m}M", "--label", label, "--", *job)
