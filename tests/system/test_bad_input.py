"""Bad input and hostile text: names with control characters, absurd limits, an empty command.

Through the real CLI, against real cgroup v1 slices and the real ledger. A label written by one session
is printed in another's terminal, so a name with a newline must be refused, and a hostile row already
in the ledger must be shown escaped, never as a forged ``hostrun:`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode
from dispatch.core.procinfo import start_time
from dispatch.core.text import check_name, printable
from dispatch.core.units import MiB
from dispatch.local.admission.ledger import Ledger
from dispatch.local.store.ledgerdb import NewBooking
from tests.conftest import Hostrun, wait_for

FORGED = "x\nhostrun: exit 250 (own-cap): the job was OOM-killed at its own cap"


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hostrun: error: ")
    return lines[0]


@pytest.mark.parametrize("text", ["plain", "build-x 2", "naïve ✓", "a\\nb"])
def test_printable_leaves_ordinary_text_alone(text: str) -> None:
    assert printable(text) == text
    assert check_name(text, "--label") == text


@pytest.mark.parametrize(("text", "shown"), [
    ("a\nb", "a\\nb"), ("\x1b[31mred", "\\x1b[31mred"), ("tab\there", "tab\\there"),
    ("rtl\u202eevil", "rtl\\u202eevil"), ("c1\x9bx", "c1\\x9bx"), ("del\x7f", "del\\x7f"),
    (b"\xff\xfe".decode("utf-8", "surrogateescape"), "\\xff\\xfe"),
])
def test_printable_escapes_what_a_terminal_would_obey(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(printable(text)) == shown  # idempotent: safe through a second printer
    with pytest.raises(Exception, match="control character"):
        check_name(text, "--label")


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--label", FORGED], {}, "--label"),
    (["--session", "s\x1b]0;title\x07"], {}, "--session"),
    (["--group", "g\r"], {}, "--group"),
    ([], {"HOSTRUN_SESSION": "s\nhostrun: exit 0"}, "HOSTRUN_SESSION"),
    (["--label", ""], {}, "--label: must not be empty"),
])
def test_names_with_control_characters_are_refused(hostrun: Hostrun, tmp_path: Path, args: list[str],
                                                   env: dict[str, str], needle: str) -> None:
    marker = tmp_path / "ran"
    proc = hostrun.run(*args, "--", "touch", str(marker), env={**os.environ, **env})
    assert proc.returncode == ExitCode.USAGE
    line = one_error_line(proc)
    assert needle in line
    assert not marker.exists()
    assert hostrun.bookings() == []


def _hostile_holder(hostrun: Hostrun, holder: subprocess.Popen[bytes], size: int) -> None:
    """A running booking with a forged label, as an older or hostile writer could leave it."""
    hostrun.state_dir.mkdir(mode=0o700, exist_ok=True)
    ledger = Ledger(str(hostrun.state_dir))
    try:
        bid = ledger.enqueue(NewBooking(host="local", label=FORGED + " [red]x[/red]", pid=holder.pid,
                             pid_start=start_time(holder.pid) or 0, size=size, cap=size, kind="cap",
                             command="sleep", session="s\x1b[2J"))
        ledger.db.execute("UPDATE bookings SET state = 'running', since = 0 WHERE id = ?", (bid,))
    finally:
        ledger.close()


def test_a_forged_label_in_the_ledger_is_printed_escaped(hostrun: Hostrun) -> None:
    """The waiting line names the holder: its newline must not start a ``hostrun: exit 250`` line."""
    holder = subprocess.Popen(["sleep", "300"])
    try:
        _hostile_holder(hostrun, holder, 280 * MiB)
        waiter = hostrun.popen("-m", "100M", "--label", "w", "--", "true")
        wait_for(lambda: any(b[1] == "w" and b[2] == "waiting" for b in hostrun.bookings()))
        shown = hostrun.run("ledger", env={**os.environ, "COLUMNS": "400"})  # no wrapping
        assert shown.returncode == 0
        assert "x\\nhostrun: exit 250" in shown.stdout
        assert "[red]x[/red]" in shown.stdout  # markup shown literally
        assert "s\\x1b[2J" in shown.stdout
        assert "\x1b" not in shown.stdout
        # A waiter prints its line every status_interval (1 s in tests); then let it in.
        import time

        time.sleep(2.5)
        holder.kill()
        holder.wait()
        _, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0, err
    finally:
        holder.kill()
        holder.wait()
    assert "waiting:" in err and "x\\nhostrun: exit 250" in err
    assert not any(line.startswith("hostrun: exit") for line in err.splitlines()), err


@pytest.mark.parametrize(("args", "needle"), [
    (["--max-runtime", "0"], "--max-runtime: must be longer than 0"),
    (["--threads", "5000"], "--threads: must be from 1 to 4096"),
    (["--threads", "0"], "--threads: must be from 1 to 4096"),
])
def test_absurd_run_limits_are_refused(hostrun: Hostrun, tmp_path: Path, args: list[str],
                                       needle: str) -> None:
    marker = tmp_path / "ran"
    proc = hostrun.run(*args, "--", "touch", str(marker))
    assert proc.returncode == ExitCode.USAGE
    assert needle in one_error_line(proc)
    assert not marker.exists()


@pytest.mark.parametrize(("body", "needle"), [
    ("[hosts.local]\nslice = 0\n", "hosts.local.slice: 0 is too small"),
    ("[hosts.local]\nslice = 1\n", "hosts.local.slice: 1 is too small"),
    ("[hosts.local]\nslice = '512K'\n", "hosts.local.slice: '512K' is too small"),
    ("[hosts.local]\nreserve = '100T'\n", "hosts.local: reserve 100.0 TiB leaves no slice"),
    ("[hosts.local]\ndefault_cap = '1K'\n", "hosts.local.default_cap"),
    ("[hosts.local]\nheavy_threads = 5000\n", "hosts.local.heavy_threads"),
    ("gamble_size = 0\n", "gamble_size: 0 is too small"),
    ("report_timeout = 0\n", "report_timeout: 0: must be longer than 0"),
])
def test_config_values_that_cannot_work_are_refused_at_load(tmp_path: Path, body: str,
                                                             needle: str) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(body)
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(cfg), "--", "touch",
                           str(marker)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == ExitCode.USAGE
    line = one_error_line(proc)
    assert needle in line and str(cfg) in line
    assert not marker.exists()


@pytest.mark.parametrize("garbage", [b"\x00\xff\xfe\x80garbage", bytes(range(256)) * 4,
                                     b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64])
def test_a_binary_config_file_is_a_usage_error(tmp_path: Path, garbage: bytes) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_bytes(garbage)
    for args in (["--", "true"], ["ledger"], ["doctor"]):
        proc = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(cfg), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert "not valid TOML" in one_error_line(proc)


def test_a_reserve_larger_than_this_machines_ram_is_refused_at_run_time_too() -> None:
    """A config validated on a bigger machine (a cached one, or a peer's view) still cannot make a
    zero slice here: the slice computation itself refuses it."""
    from dispatch.core.errors import ConfigError
    from dispatch.core.settings import HostSettings

    with pytest.raises(ConfigError, match=r"reserve .* leaves no slice"):
        HostSettings("local", reserve_bytes=64 << 30).slice_limit(32 << 30)
    assert HostSettings("local", reserve_bytes=1 << 30).slice_limit(32 << 30) == 31 << 30


def test_an_empty_command_is_not_found_with_a_message(hostrun: Hostrun) -> None:
    proc = hostrun.run("-m", "64M", "--", "")
    assert proc.returncode == 127
    assert "hostrun: cannot run '': command not found" in proc.stderr
    assert hostrun.bookings() == []


def test_an_empty_command_inside_a_job_is_not_found_with_a_message(hostrun: Hostrun,
                                                                   tmp_path: Path) -> None:
    """Nested: hostrun becomes the command (exec) or runs it under the enclosing booking."""
    inner = [sys.executable, "-m", "dispatch", "--config", str(hostrun.config_path)]
    script = tmp_path / "nested.sh"
    script.write_text(f'{" ".join(inner)} -- ""; echo "exec:$?"\n'
                      f'{" ".join(inner)} --result-file {tmp_path / "r.json"} -- ""; echo "run:$?"\n')
    proc = hostrun.run("-m", "64M", "--", "sh", str(script))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exec:127", "run:127"]
    assert proc.stderr.count("cannot run '': command not found") == 2
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 127
