"""The docs' console examples, run: what README.md and docs/*.md show is what hostrun does.

The convention (docs/cli.md, "Examples in these pages"): a fenced block marked ``console`` holds
examples; a line starting ``$ `` is a command (a comment after two spaces and ``#`` is prose), the
lines up to the next ``$ `` are what it prints, stdout and stderr together, as a terminal shows them;
``; echo $?`` ends a command whose exit status the page shows as its last line.

Every example is either in ``RUN`` (run here, as root, against a private config, state dir and slice
cgroup, the peer one against a real sshd peer from tests/support) or in ``NOT_RUN`` with the reason;
an example in neither, or a table entry no page holds any more, fails the test, so a new or changed
example is looked at. Volatile parts are normalised on both sides, each by its own narrow pattern
(``VOLATILE``); everything else must match line for line.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hostrun
from tests.support.peers import setup as peer_setup

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Each run under a private config: what the page's prose says the example ran on.
SLICE_500M = "500M"

# (page, command) -> how it is run: "local" (this host, a 500 MiB slice) or "peer" (an sshd peer).
RUN: dict[tuple[str, str], str] = {
    ("docs/cli.md", "hostrun -- sh -c 'exit 3'; echo $?"): "local",
    ("docs/cli.md", 'hostrun -m 100M -- python3 -c "x=bytearray(300<<20)"; echo $?'): "local",
    ("docs/cli.md", "hostrun --max-runtime 1s -- sleep 10; echo $?"): "local",
    ("docs/cli.md", "hostrun -m 2G -- true; echo $?"): "local",
    ("docs/cli.md", "hostrun -m 512K -- true; echo $?"): "local",
    ("docs/cli.md", "hostrun -- /nonexistent; echo $?"): "local",
    ("docs/cli.md", "hostrun -- ./script-without-shebang; echo $?"): "local",
    ("docs/cli.md", "hostrun codes --json | head -7"): "local",
    ("docs/peers.md", "hostrun --peer -m 50M -- python3 -c 'x=bytearray(200<<20)'; echo $?"): "peer",
}

NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/cli.md", "hostrun -m 4G -- cargo build --release"): "no output shown; needs cargo and a crate",
    ("docs/cli.md", "hostrun -l unit-tests --max-runtime 30m -- pytest -n 8"):
        "no output shown; needs a test suite with pytest-xdist",
    ("docs/cli.md", "hostrun -m 200M -- make -j8"):
        "needs another job holding 400 MiB while it waits (the wait line: tests/test_admission.py)",
    ("docs/cli.md", "hostrun ledger"): "a moment of a running holder and a waiter; ids, pids, ages",
    ("docs/cli.md", "hostrun report"): "this machine's RAM, load and cores, and a peer with a bad key",
    ("docs/cli.md", "hostrun history --label test --limit 2"): "a recorded history of cargo runs",
    ("docs/cli.md", "hostrun alerts"): "alerts from a peer-could-take moment, with their times",
    ("docs/cli.md", "hostrun alerts --session agent-1 --unread"): "an own-cap alert with its time",
    ("docs/capacity.md", "hostrun capacity --slice 2G"):
        "the test VM's peak table (VM examples need the VM: tests/test_vm_*.py)",
    ("docs/peers.md", "hostrun dispatch -m 500M -- make"):
        "two hosts with 300 MiB and 1 GiB slices read at one moment (tests/test_two_hosts.py)",
    ("docs/peers.md", "hostrun --auto -m 600M -- make test"): "needs make and a peer with a 1 GiB slice",
    ("docs/peers.md", "cd ~/src/app/sub && hostrun --peer -m 600M --return out/count.txt -- sh -c "
                      "'pwd; mkdir -p out; wc -l < input.txt > out/count.txt'"):
        "a user's home and tree (the same run: tests/test_peer_run.py)",
    ("docs/peers.md", "cat out/count.txt"): "the previous example's file",
    ("docs/peers.md", "scripts/peer start peer1 127.0.0.2"):
        "starts a peer under a fixed name in /tmp, shared by every session on the machine",
    ("docs/peers.md", "scripts/vm start /tmp/vm"): "boots the test VM (about a minute; VM tests only)",
    ("docs/peers.md", "scripts/vm stop /tmp/vm"): "stops the test VM",
    ("docs/preflight.md", "hostrun -- ./scripts/crash.sh; echo $?"):
        "the page's script with its recorded inputs and another instance running, at their times",
    ("docs/preflight.md", "hostrun preflight ./scripts/crash.sh; echo $?"):
        "the page's script with its recorded inputs, at their times",
    ("docs/preflight.md", "hostrun -- ./build.sh"): "the page's build.sh is only sketched there",
}

# Volatile parts, each replaced on both sides by its own placeholder (narrow on purpose).
VOLATILE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\(pid \d+"), "(pid PID"),
    (re.compile(r"\b\d+(\.\d+)? s\)"), "SECONDS s)"),
]


class Example:
    def __init__(self, page: str, line: int, command: str, shown: list[str]) -> None:
        self.page, self.line, self.command, self.shown = page, line, command, shown

    @property
    def key(self) -> tuple[str, str]:
        return (self.page, self.command)


def examples() -> list[Example]:
    """Every ``$ `` command of every ``console`` block, with the lines shown after it."""
    found: list[Example] = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        inside = False
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if text.startswith("```"):
                inside = text.strip() == "```console"
                continue
            if not inside:
                continue
            if text.startswith("$ "):
                command = re.sub(r"\s{2,}#.*$", "", text[2:]).strip()
                found.append(Example(page, number, command, []))
            elif found and found[-1].page == page:
                found[-1].shown.append(text.rstrip())
    return found


def normalised(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern, placeholder in VOLATILE:
            line = pattern.sub(placeholder, line)
        out.append(line.rstrip())
    return out


def test_every_console_example_is_run_or_says_why() -> None:
    keys = [e.key for e in examples()]
    unlisted = [f"{page}: $ {command}" for page, command in keys
                if (page, command) not in RUN and (page, command) not in NOT_RUN]
    assert not unlisted, f"console examples neither run nor excused (add them to RUN or NOT_RUN): {unlisted}"
    gone = [f"{page}: $ {command}" for page, command in [*RUN, *NOT_RUN] if (page, command) not in keys]
    assert not gone, f"listed examples no page shows any more: {gone}"
    assert not set(RUN) & set(NOT_RUN)


def shell(tmp_path: Path, config: Path, command: str, cwd: Path, own_python: bool = True) -> str:
    """``command`` in bash, ``hostrun`` being this tree's under the private config; its output as a
    terminal shows it (stdout and stderr together, in order). The pages' ``python3`` is this
    interpreter; for a peer (``own_python`` False) the system's, the one the peer's login PATH finds
    (a different version there would rightly be refused, 247)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "hostrun"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m dispatch --config {config} "$@"\n')
    wrapper.chmod(0o755)
    python3 = bin_dir / "python3"
    if not python3.exists():
        system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        assert own_python or system, "no python3 on the system PATH for the peer's login"
        python3.symlink_to(sys.executable if own_python else str(system))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    env.pop("HOSTRUN_SESSION", None)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                          check=False)
    return done.stdout


def local_config(hostrun: Hostrun) -> Path:
    """A private config with every default the pages assume (kill_grace 10 s, no gamble size)."""
    hostrun.config_path.write_text(f'state_dir = "{hostrun.state_dir}"\n[hosts.local]\n'
                                   f'slice = "{SLICE_500M}"\ncgroup = "{hostrun.cgroup}"\n')
    return hostrun.config_path


def prepare(tmp_path: Path) -> Path:
    """The working directory the examples run in, with the files they name."""
    work = tmp_path / "work"
    work.mkdir()
    script = work / "script-without-shebang"
    script.write_text("echo no shebang\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return work


def _by_key() -> dict[tuple[str, str], Example]:
    return {e.key: e for e in examples()}


@pytest.mark.parametrize("key", [k for k, how in RUN.items() if how == "local"],
                         ids=lambda k: f"{k[0]}:{k[1][:40]}")
def test_local_example(key: tuple[str, str], hostrun: Hostrun, tmp_path: Path) -> None:
    example = _by_key()[key]
    said = shell(tmp_path, local_config(hostrun), example.command, prepare(tmp_path))
    assert normalised(said.splitlines()) == normalised(example.shown), \
        f"{example.page}:{example.line}: $ {example.command}"


@pytest.mark.parametrize("key", [k for k, how in RUN.items() if how == "peer"],
                         ids=lambda k: f"{k[0]}:{k[1][:40]}")
def test_peer_example(key: tuple[str, str], hostrun: Hostrun, peers: Callable[..., Any],
                      tmp_path: Path) -> None:
    example = _by_key()[key]
    _, tree = peer_setup(hostrun, peers, tmp_path)
    said = shell(tmp_path, hostrun.config_path, example.command, tree, own_python=False)
    assert normalised(said.splitlines()) == normalised(example.shown), \
        f"{example.page}:{example.line}: $ {example.command}"
