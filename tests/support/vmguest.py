"""One hostrun set-up inside the test VM (tests/support/vm.py), as root or as a normal user.

Each has its own directory under /tmp/hostrun-tests (owned by that user, so the trust rules accept
its config), a state directory in it and its own slice unit (``hostrun-t<hex>.slice``, inside
``hostrun.slice``), so tests neither share bookings nor counters. ``leaks`` is the teardown's check.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import uuid
from typing import Any

from tests.support.vm import VM

ROOT = "/tmp/hostrun-tests"


class Guest:
    def __init__(self, vm: VM, user: str, name: str) -> None:
        self.vm = vm
        self.user = user
        tag = uuid.uuid4().hex[:8]
        self.dir = f"{ROOT}/{user}-{tag}"
        self.config = f"{self.dir}/hosts.toml"
        self.state = f"{self.dir}/state"
        self.slice_unit = f"hostrun-t{tag}.slice"
        self.name = name
        self.systemctl = "systemctl" if user == "root" else "systemctl --user"
        vm.ssh("root", f"mkdir -p -m 1777 {ROOT}")
        self.sh(f"mkdir -m 700 {self.dir}")

    def configure(self, slice: str = "300M", extra: str = "", host: str = "") -> None:
        text = (f'state_dir = "{self.state}"\nkill_grace = "2s"\nstatus_interval = "1s"\n'
                f'gamble_size = "50M"\n{extra}\n[hosts.local]\nslice = "{slice}"\n'
                f'cgroup = "/{self.slice_unit}"\n{host}\n')
        self.sh(f"cat > {self.config}", input=text)

    def sh(self, script: str, timeout: float = 300, check: bool = True,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
        """A shell script run in the guest as this user, in its directory (``cd`` is a command of its
        own: ``cd X && A & B`` would put ``cd X && A`` in a subshell, and ``$!`` would not be A)."""
        return self.vm.ssh(self.user, f"cd {ROOT} || exit 99\n{script}", timeout=timeout, check=check,
                           input=input)

    def detached(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``script`` run in the guest apart from any ssh session, read back when it ends. For a
        script that takes the whole VM to its memory limit: while the kernel reclaims its last page
        cache (an emulated machine can spend minutes there before its OOM killer acts), no ssh
        session answers its keepalives, and one that carried the script would end 255 with it."""
        run = f"{self.dir}/detached-{uuid.uuid4().hex[:8]}"
        self.sh(f"cat > {run}.sh", input=script)
        self.sh(f"setsid sh -c 'cd {ROOT} && sh {run}.sh > {run}.out 2> {run}.err; "
                f"echo $? > {run}.rc.tmp && mv {run}.rc.tmp {run}.rc' < /dev/null > /dev/null 2>&1 &")
        deadline = time.monotonic() + timeout
        while True:
            try:
                done = self.sh(f"cat {run}.rc 2>/dev/null", timeout=60, check=False)
                if done.returncode == 0 and done.stdout.strip():
                    break
            except subprocess.TimeoutExpired:
                pass  # the guest too busy to answer yet: ask again
            if time.monotonic() > deadline:
                raise AssertionError(f"the detached script did not end within {timeout:g} s")
            time.sleep(2)
        out = self.sh(f"cat {run}.out").stdout
        err = self.sh(f"cat {run}.err").stdout
        return subprocess.CompletedProcess(["detached", run], int(done.stdout.strip()), out, err)

    def hostrun_cmd(self, *args: str) -> str:
        return shlex.join(["hostrun", "--config", self.config, *args])

    def run(self, *args: str, timeout: float = 300,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.sh(self.hostrun_cmd(*args), timeout=timeout, check=False, input=input)

    def result(self, path: str) -> dict[str, Any]:
        return json.loads(self.sh(f"cat {path}").stdout)  # type: ignore[no-any-return]

    def ledger(self) -> dict[str, Any]:
        done = self.run("ledger", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def slice_dir(self) -> str:
        root = "" if self.user == "root" else (
            f"/user.slice/user-{self.uid}.slice/user@{self.uid}.service")
        return f"/sys/fs/cgroup{root}/hostrun.slice/{self.slice_unit}"

    @property
    def uid(self) -> int:
        return 0 if self.user == "root" else int(self.sh("id -u").stdout)

    def leaks(self, settle: float = 15.0) -> list[str]:
        """Job scopes in this slice (and session scopes in its sessions slice), keeper processes of
        this user, bookings in this ledger."""
        script = (
            f"ls -d {self.slice_dir()}/hostrun-job-* {self.slice_dir()}/*-sessions.slice/hostrun-session-*"
            " 2>/dev/null | sed 's/^/scope /'; "
            f"pgrep -u {self.user} -f '^hostrun-scope-keeper' | sed 's/^/keeper pid /'; "
            f"{self.hostrun_cmd('ledger', '--json')} 2>/dev/null | python3 -c \""
            "import json, sys; d = json.load(sys.stdin); "
            "[print('booking', b['id'], b['label'], b['state']) for b in d['running'] + d['queue']]\"")
        deadline = time.monotonic() + settle
        while True:
            found = [line for line in self.sh(script, check=False).stdout.splitlines() if line.strip()]
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def as_peer(self) -> None:
        """Make this set-up the login's own configuration (``~/.config/hostrun/hosts.toml``), which
        the agent a controller sends over ssh reads."""
        self.peer = True
        self.sh(f"mkdir -p ~/.config/hostrun && cp {self.config} ~/.config/hostrun/hosts.toml")

    def host_table(self, name: str = "vm", extra: str = "") -> str:
        """A controller's [hosts.NAME] table reaching this user in the VM."""
        return (f'[hosts.{name}]\nssh = "vm-{self.user}"\nssh_config = "{self.vm.ssh_config}"\n'
                f'work_root = "{self.dir}/work"\n{extra}\n')

    def clean_up(self) -> None:
        peer = " ~/.config/hostrun/hosts.toml" if getattr(self, "peer", False) else ""
        self.sh(f"{self.systemctl} stop {self.slice_unit} 2>/dev/null; rm -rf {self.dir}{peer}", check=False)
