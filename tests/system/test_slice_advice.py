"""One source of slice advice (dispatch/core/sliceadvice.py): the README's figures, the 78 of a
default reserve that leaves no slice, the 243 of a cap over the slice and ``doctor``'s problems
say the same line, and doing what it says works.

Pure checks of the rule and the README; real runs (cgroup v1) for the 243 and ``doctor``. The same
at 1, 2 and 3 GiB of RAM on a real systemd machine, as a user with no configuration, is
tests/vm/test_vm_first_minute.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.core import sliceadvice as advice
from dispatch.core.errors import NoSliceError
from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import MIN_DEFAULT_SLICE, HostSettings
from dispatch.core.units import GiB, MiB, format_size, parse_size
from tests.conftest import Hostrun

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TWO_GIB_MACHINES = range(1900 * MiB, 2040 * MiB, 4 * MiB)  # MemTotal of a 2 GiB machine or VM


def test_the_readme_says_what_the_78_says() -> None:
    (shown,) = re.findall(r"^    (hostrun: no slice: .*)$", README, re.M)
    configured = "/home/you/.config/hostrun/hosts.toml"
    for mem in TWO_GIB_MACHINES:
        with pytest.raises(NoSliceError) as err:
            HostSettings("local").slice_limit(mem, configured, parse_size(first_run_cap()))
        said = f"hostrun: {err.value.prefix}: {err.value}"
        if format_size(mem) == "1.9 GiB":  # the README's machine: its whole line
            assert said == shown
        tail = "leaves no slice for them: "
        assert said.split(tail)[1] == shown.split(tail)[1], (mem, said)  # the line to add, at any of them
    threshold = re.search(r"Under ([\d.]+) GiB of RAM that leaves none", README)
    assert threshold is not None and float(threshold[1]) * GiB == 2 * GiB + MIN_DEFAULT_SLICE


def first_run_cap() -> str:
    (line,) = re.findall(r"^hostrun -m (\S+) -- make -j8 ", README, re.M)
    return line


def test_the_readmes_first_run_fits_the_default_slice_of_a_3_gib_machine() -> None:
    mem = 3072 * MiB - 100 * MiB  # MemTotal of a 3 GiB VM
    assert parse_size(first_run_cap()) <= HostSettings("local").slice_limit(mem)


def test_the_78_is_not_an_error_line_and_names_the_file_and_line() -> None:
    from dispatch.cli.main import error_line

    with pytest.raises(NoSliceError) as err:
        HostSettings("local").slice_limit(972 * MiB, "/home/u/.config/hostrun/hosts.toml", 512 * MiB)
    assert err.value.exit_code == ExitCode.NOT_RUN
    line = error_line(err.value, "run")
    assert line.startswith("hostrun: no slice: this machine has 972 MiB of RAM") and "error" not in line
    assert line.endswith('add slice = "512M" under [hosts.local] in /home/u/.config/hostrun/hosts.toml')


@pytest.mark.parametrize("mem", [512 * MiB, 972 * MiB, 1968 * MiB, 2970 * MiB, 16 * GiB, 60 * GiB])
def test_advice_holds_its_cap_never_takes_the_machine_and_names_a_cap_that_it_holds(mem: int) -> None:
    half = advice.advised(mem)
    assert half is not None and advice.LEAST <= half <= max(advice.LEAST, mem // 2)
    for cap in (64 * MiB, 512 * MiB, GiB, 4 * GiB, 40 * GiB):
        size = advice.advised(mem, cap)
        fix = advice.bigger("local", cap, mem, "/c", "")
        if size is None:  # no advised slice holds it: the fix is a cap that one does
            smaller = re.search(r"ask for -m (\S+) or less", fix)
            assert smaller is not None, fix
            assert advice.advised(mem, parse_size(smaller[1])) is not None
        else:
            assert cap <= size <= advice.most(mem) < mem and size % advice.STEP == 0
            assert f'add slice = "{advice.toml_size(size)}" under [hosts.local] in /c' in fix


def test_the_line_says_add_change_or_replace_as_the_table_needs() -> None:
    assert advice.line_to_add("local", GiB, "/c") == 'add slice = "1G" under [hosts.local] in /c'
    assert advice.line_to_add("local", 896 * MiB, "/c", "slice").startswith('change it to slice = "896M"')
    assert advice.line_to_add("local", GiB, "/c", "reserve").startswith(
        'replace hosts.local.reserve with slice = "1G"')  # both set is refused (exit 2)


def test_the_file_named_is_the_one_in_use_else_the_per_user_one() -> None:
    assert advice.config_file("/etc/hostrun/hosts.toml", {}) == "/etc/hostrun/hosts.toml"
    env = {"HOME": "/home/u"}
    assert advice.config_file("<built-in default>", env) == "/home/u/.config/hostrun/hosts.toml"
    env["XDG_CONFIG_HOME"] = "/home/u/conf"
    assert advice.config_file("<built-in default>", env) == "/home/u/conf/hostrun/hosts.toml"


def test_a_243_names_where_the_slice_came_from_and_doing_what_it_says_runs(hostrun: Hostrun) -> None:
    config = str(hostrun.config_path)
    refused = hostrun.run("-m", "2G", "--", "true")
    assert refused.returncode == ExitCode.NEVER_FITS, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith("hostrun: error: cap 2.0 GiB is larger than the whole slice (300 MiB: "
                           f"hosts.local.slice in {config}); it could never be admitted: "), line
    told = re.search(r'ask for a smaller -m, or change it to (slice = "\d+[MG]") under \[hosts\.local\] '
                     r"in (\S+)$", line)
    assert told is not None and told[2] == config, line
    text = hostrun.config_path.read_text()
    hostrun.config_path.write_text(re.sub(r'^slice = "300M"$', told[1], text, flags=re.M))
    done = hostrun.run("-m", "2G", "--", "true")
    assert done.returncode == 0, done.stderr


def doctor(config: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(config), "doctor", "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_doctor_names_a_slice_at_or_above_the_ram(tmp_path: Path) -> None:
    from dispatch.core.hostfacts import read_meminfo

    ram = read_meminfo().total
    config = tmp_path / "hosts.toml"
    for size, problem in ((ram // MiB * MiB + MiB, True), (ram // 2 // MiB * MiB, False)):
        config.write_text(f'state_dir = "{tmp_path / "state"}"\n[hosts.local]\nslice = {size}\n')
        data = doctor(config)
        said = [p for p in data["problems"] if "is not less than this machine's" in p]  # type: ignore[attr-defined]
        assert bool(said) == problem, data["problems"]
        assert data["slice_from"] == f"hosts.local.slice in {config}"
        if problem:
            (line,) = said
            assert line.startswith(f"hosts.local.slice {format_size(size)} is not less than this "
                                   f"machine's {format_size(ram)} of RAM")
            size_told = advice.toml_size(advice.advised(ram) or 0)
            assert line.endswith(f'change it to slice = "{size_told}" under [hosts.local] in {config}')
