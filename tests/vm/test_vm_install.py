"""The README's install and first run, on a stock workstation: ``pipx install`` of hostrun's wheel
as a normal user (and as root) in the test VM (Debian 12, systemd + cgroup v2), then ``hostrun
doctor`` and capped runs with nothing configured but a slice size (the VM has 2 GiB, so its default
reserve leaves none). The VM reaches no index: the wheel and its dependencies' wheels are built and
downloaded here first (``tests.support.vm.build_wheelhouse``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WHEELS = "/tmp/hostrun-wheels"


def test_pipx_install_then_doctor_and_a_capped_run_as_both_users(vm: Any, guest: Any,
                                                                  wheelhouse: Path) -> None:
    def install_and_run(user: str) -> None:
        g = guest(user)
        home_bin = "~/.local/bin/hostrun"
        try:
            # The README's command; pip is told where the wheels are (the VM reaches no index), and not
            # to byte-compile them (minutes in the emulated VM).
            g.sh(f"PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_NO_COMPILE=1 pipx install "
                 f"{WHEELS}/{wheelhouse.name}", timeout=900)
            g.sh("mkdir -p ~/.config/hostrun && printf '[hosts.local]\\nslice = \"1G\"\\n' "
                 "> ~/.config/hostrun/hosts.toml")
            doctor = g.sh(f"{home_bin} doctor --json")
            assert '"backend": "systemd"' in doctor.stdout, f"{user}: {doctor.stdout}"
            assert '"problems": []' in doctor.stdout, f"{user}: {doctor.stdout}"
            ran = g.sh(f"{home_bin} -m 100M -- sh -c 'echo hello'; echo exit=$?")
            assert "hello" in ran.stdout and "exit=0" in ran.stdout, f"{user}: {ran.stdout}"
            hog = g.sh(f"{home_bin} -m 20M -- dd if=/dev/zero of=/dev/null bs=64M count=1; echo exit=$?",
                       check=False)
            assert "exit=250" in hog.stdout, f"{user}: {hog.stderr}"
        finally:
            g.sh("pipx uninstall hostrun >/dev/null 2>&1; rm -rf ~/.config/hostrun ~/.local/state/hostrun",
                 check=False)

    with ThreadPoolExecutor(2) as pool:  # one emulated CPU each: both in the time of one
        list(pool.map(install_and_run, ("dev", "root")))  # re-raises the first failure
