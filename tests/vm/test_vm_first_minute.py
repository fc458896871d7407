"""A newcomer's first minute at 1, 2 and 3 GiB of RAM: a normal user with no configuration, on a
real Debian 12 machine (systemd, cgroup v2), following only the README.

Each size is one boot (a module fixture over ``VM(..., memory_mib=...)``; 2 GiB is the session's
VM), every check for that size made in it:

- the README's first-run line (its options, with a real command in place of ``make -j8``: the
  image has no make): at 3 GiB it runs in the default slice; at 1 and 2 GiB it exits 78 with one
  ``hostrun: no slice:`` line naming the file and the line to add, the line ``doctor`` and the
  README give too; doing exactly what it says, the line runs;
- a cap larger than the slice (243) says what to write where (or which ``-m`` fits), and doing
  what each refusal says ends in a run;
- a slice at or above the RAM is a problem ``doctor`` names;
- at 2 GiB hostrun is installed first with the README's line for machines without pipx (a venv:
  Debian 12 refuses ``pip install --user``), and that install is what the checks run.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch.core import sliceadvice as advice
from dispatch.core.exitcodes import ExitCode
from dispatch.core.units import MiB, parse_size
from tests.support.vm import MEMORY_MIB, VM, copy_checkout, ensure_image, install_hostrun

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
WHEELS = "/tmp/hostrun-wheels"
USER = "dev"
CONFIG = f"/home/{USER}/.config/hostrun/hosts.toml"
# What the first minute leaves in the user's home (and in the user manager: the default slice).
CLEAN = ("rm -rf ~/.config/hostrun ~/.local/state/hostrun ~/.local/share/hostrun ~/.local/bin/hostrun "
         "/tmp/first-minute; systemctl --user stop hostrun.slice; systemctl --user revert hostrun.slice")


def readme_line(pattern: str) -> str:
    (line,) = [line for line in README.splitlines() if re.match(pattern, line)]
    return line


FIRST_RUN = shlex.split(readme_line(r"hostrun -m \S+ -- make -j8").split("#")[0])
assert FIRST_RUN[-3:] == ["--", "make", "-j8"], FIRST_RUN
OPTIONS = FIRST_RUN[1:-3]  # the README's own options: -m 512M
JOB = ["python3", "-c", "print('built')"]


class Machine:
    """One booted VM and the hostrun its user runs (``hostrun`` as it was installed there)."""

    def __init__(self, vm: VM, hostrun: str) -> None:
        self.vm, self.hostrun = vm, hostrun

    def sh(self, script: str, timeout: float = 300) -> Any:
        """A script as the user, in a directory of its own (no ./hosts.toml: nothing configured)."""
        return self.vm.ssh(USER, f"mkdir -p /tmp/first-minute && cd /tmp/first-minute && {script}",
                           timeout=timeout, check=False)

    def run(self, *args: str) -> Any:
        return self.sh(shlex.join([self.hostrun, *args]))

    def doctor(self) -> dict[str, Any]:
        done = self.run("doctor", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def follow(self, line: str, cap: str) -> str:
        """Do what a refusal says: write the line it names into the file it names, or take the
        ``-m`` it names. Returns the cap to ask for next."""
        told = re.search(r'(add|change it to) (slice = "\d+[MG]") under \[hosts\.local\] in (\S+)$', line)
        if told is None:
            smaller = re.search(r"ask for -m (\S+) or less$", line)
            assert smaller is not None, line
            return smaller[1]
        assert told[3] == CONFIG, line  # the file hostrun reads, spelled out
        if told[1] == "add":
            script = f"mkdir -p ~/.config/hostrun && printf '[hosts.local]\\n%s\\n' '{told[2]}' >> {CONFIG}"
        else:
            script = f"sed -i 's/^slice = .*/{told[2]}/' {CONFIG}"
        assert self.vm.ssh(USER, script, check=False).returncode == 0
        return cap


@pytest.fixture(scope="module", params=[3072, MEMORY_MIB, 1024], ids=["3G", "2G", "1G"])
def machine(request: pytest.FixtureRequest, vm: VM) -> Iterator[Machine]:
    """A VM of that size with nothing configured for the user; 2 GiB is the session's VM, with
    hostrun installed by the README's venv line; the others boot once for this module."""
    size: int = request.param
    if size == vm.memory_mib:
        vm.ssh(USER, CLEAN, check=False)
        wheelhouse: Path = request.getfixturevalue("wheelhouse")
        try:
            yield Machine(vm, venv_install(vm, wheelhouse))
        finally:
            vm.ssh(USER, CLEAN, check=False)
        return
    workdir = Path(tempfile.mkdtemp(prefix=f"hostrun-vm-{size}-"))
    own = VM(ensure_image(), workdir, memory_mib=size)
    try:
        own.boot(timeout=600)
        install_hostrun(own, REPO)
        yield Machine(own, "hostrun")
    finally:
        own.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


def venv_install(vm: VM, wheelhouse: Path) -> str:
    """The README's install line for machines without pipx, run as it is in a copy of this checkout
    (pip pointed at the wheelhouse: the VM reaches no index). Returns the hostrun it put on PATH."""
    line = readme_line(r"python3 -m venv ")
    checkout = "/tmp/first-minute-checkout"
    vm.ssh(USER, f"rm -rf {checkout}", check=False)
    copy_checkout(vm, USER, REPO, checkout)
    # The line the README gave before: refused by Debian's own pip (PEP 668), where pip is installed
    # at all (this image has none outside a venv, as a stock Debian without python3-pip).
    refused = vm.ssh(USER, f"cd {checkout} && PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} python3 -m pip "
                           "install --user . 2>&1; echo exit=$?", check=False, timeout=600).stdout
    assert not refused.rstrip().endswith("exit=0"), refused[-2000:]
    assert "externally-managed-environment" in refused or "No module named pip" in refused, refused
    done = vm.ssh(USER, f"cd {checkout} && export PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_NO_COMPILE=1 "
                        f"&& {line} 2>&1; echo exit=$?", check=False, timeout=1200).stdout
    vm.ssh(USER, f"rm -rf {checkout}", check=False)
    assert done.rstrip().endswith("exit=0"), done[-3000:]
    assert "hostrun" in vm.ssh(USER, "ls ~/.local/bin").stdout
    return f"/home/{USER}/.local/bin/hostrun"


def test_the_readmes_first_run_line_runs_or_says_what_to_write_where(machine: Machine) -> None:
    mem = machine.doctor()["memory_total"]
    cap = parse_size(OPTIONS[OPTIONS.index("-m") + 1])
    first = machine.run(*OPTIONS, "--", *JOB)
    if machine.vm.memory_mib >= 3072:  # the default slice holds the README's cap
        assert first.returncode == 0 and first.stdout == "built\n", first.stderr
        assert machine.doctor()["problems"] == []
        return
    assert first.returncode == ExitCode.NOT_RUN, first.stderr
    (line,) = first.stderr.splitlines()
    assert line.startswith("hostrun: no slice: this machine has "), line
    told = f'add slice = "{advice.toml_size(advice.advised(mem, cap) or 0)}" under [hosts.local] in {CONFIG}'
    assert line.endswith(told), line
    if machine.vm.memory_mib == MEMORY_MIB:  # the README's own example machine
        to_add = line.split("for them: ")[1].rsplit(" in ", 1)[0]  # the README's user is not dev
        assert f"for them: {to_add} in /home/you/" in readme_line(r"    hostrun: no slice: "), to_add
    data = machine.doctor()
    (problem,) = [p for p in data["problems"] if "the default reserve" in p]
    assert problem.endswith(f'add slice = "{advice.toml_size(advice.advised(mem) or 0)}" under '
                            f"[hosts.local] in {CONFIG}"), problem
    assert data["slice_limit"] is None
    shown = machine.run("doctor").stdout
    assert "slice:    none: the default reserve" in shown and "limit -" not in shown, shown
    machine.follow(line, OPTIONS[1])
    again = machine.run(*OPTIONS, "--", *JOB)
    assert again.returncode == 0 and again.stdout == "built\n", again.stderr
    assert machine.doctor()["problems"] == []


def test_a_cap_over_the_slice_says_what_to_write_where_and_doing_it_runs(machine: Machine) -> None:
    cap = "1G"
    for _ in range(3):
        done = machine.run("-m", cap, "--", *JOB)
        if done.returncode == 0:
            break
        assert done.returncode in (ExitCode.NEVER_FITS, ExitCode.NOT_RUN), done.stderr
        (line,) = done.stderr.splitlines()
        if done.returncode == ExitCode.NEVER_FITS:
            assert "is larger than the whole slice (" in line and "it could never be admitted: " in line
        else:  # no slice at all yet: the 78 says the line to add, one that holds this cap
            assert line.startswith("hostrun: no slice: "), line
        if machine.vm.memory_mib >= 3072:  # no configuration yet: it says what took the rest
            assert "of RAM less the default reserve of 2.0 GiB" in line, line
        cap = machine.follow(line, cap)
    assert done.returncode == 0 and done.stdout == "built\n", done.stderr


def test_a_slice_at_or_above_the_ram_is_a_problem_doctor_names(machine: Machine) -> None:
    mem = machine.doctor()["memory_total"]
    whole = f"{-(-mem // MiB)}M"  # the RAM, rounded up
    machine.vm.ssh(USER, f"mkdir -p ~/.config/hostrun && printf '[hosts.local]\\nslice = \"{whole}\"\\n' "
                         f"> {CONFIG}")
    problems = machine.doctor()["problems"]
    (said,) = [p for p in problems if "is not less than this machine's" in p]
    assert said.endswith(f'change it to slice = "{advice.toml_size(advice.advised(mem) or 0)}" under '
                         f"[hosts.local] in {CONFIG}"), said
