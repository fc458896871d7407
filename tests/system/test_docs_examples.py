"""The docs' console examples, run: what README.md and docs/*.md show is what hostrun does.

The convention, for whoever writes a page: an example is a fenced block marked ``console``, or an
indented block (four spaces) whose first line is a ``$ `` command. A line starting ``$ `` is a
command (prose after two spaces and ``#`` is a comment); the lines up to the next ``$ `` are what it
prints, stdout and stderr together, as a terminal shows them; a command ending ``; echo $?`` (or a
following ``$ echo $?``) shows its exit status as the last line.

Each example is in ``RUN`` (run here, as root, in one bash per block, against a private config, state
dir and slice cgroup: "local"; a real sshd peer: "peer"; the private one-node Slurm cluster:
"cluster") or in ``NOT_RUN`` with the reason; an example in neither, or an entry no page holds any
more, fails the test, so a new or changed example is looked at. What varies from run to run is
replaced on both sides by its own narrow pattern (``VOLATILE``), and a page's fixed path under
/tmp by the test's own (``PRIVATE``); everything else must match line for line.
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

ROOT = Path(__file__).resolve().parents[2]
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
    ("docs/exit-codes.md", 'hostrun -m 100M --result-file /tmp/r.json -- python3 -c '
                           '"x=bytearray(300<<20)"'): "local",
    ("docs/exit-codes.md", "echo $?"): "local",
    ("docs/preflight.md", "hostrun -- ./build.sh"): "local",
    ("docs/slurm.md", "hostrun --host cluster -- sh -c 'echo built; exit 3'; echo $?"): "cluster",
}

NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/backends.md", "hostrun doctor"):
        "a normal user's systemd user manager on cgroup v2 (the VM tests run it: "
        "tests/vm/test_vm_systemd.py)",
    ("docs/backends.md", "hostrun -m 1G -- make -j8"): "no output shown; needs make and a Makefile",
    ("docs/backends.md", "hostrun -m 12G -- make -j8"):
        "a shared slice of 24 GiB with another member's job holding 16 GiB "
        "(tests/system/test_shared_daemon.py)",
    ("docs/backends.md", "hostrun shared status"): "the same shared slice, two members' jobs and ages",
    ("docs/cli.md", "hostrun -m 4G -- cargo build --release"): "no output shown; needs cargo and a crate",
    ("docs/cli.md", "hostrun -l unit-tests --max-runtime 30m -- pytest -n 8"):
        "no output shown; needs a test suite with pytest-xdist",
    ("docs/cli.md", "hostrun -m 200M -- make -j8"):
        "needs another job holding 400 MiB while it waits (the wait line: tests/system/test_admission.py)",
    ("docs/cli.md", "hostrun ledger"): "a moment of a running holder and a waiter; ids, pids, ages",
    ("docs/cli.md", "hostrun report"): "this machine's RAM, load and cores, and a peer with a bad key",
    ("docs/cli.md", "hostrun history --label test --limit 2"): "a recorded history of cargo runs",
    ("docs/cli.md", "hostrun alerts"): "alerts from a peer-could-take moment, with their times",
    ("docs/cli.md", "hostrun alerts --session agent-1 --unread"): "an own-cap alert with its time",
    ("docs/capacity.md", "hostrun capacity --slice 2G"):
        "the test VM's peak table (VM examples need the VM: tests/vm/test_vm_*.py)",
    ("docs/capacity.md", "hostrun capacity --sessions"):
        "a peak table with recorded session peaks on a 60 GiB slice (the same figures on a real ledger: "
        "tests/system/test_capacity_sessions.py)",
    ("docs/peers.md", "hostrun dispatch -m 500M -- make"):
        "two hosts with 300 MiB and 1 GiB slices read at one moment (tests/system/test_two_hosts.py)",
    ("docs/peers.md", "hostrun --auto -m 600M -- make test"): "needs make and a peer with a 1 GiB slice",
    ("docs/peers.md", "cd ~/src/app/sub && hostrun --peer -m 600M --return out/count.txt -- sh -c "
                      "'pwd; mkdir -p out; wc -l < input.txt > out/count.txt'"):
        "a user's home and tree (the same run: tests/system/test_peer_run.py)",
    ("docs/peers.md", "cat out/count.txt"): "the previous example's file",
    ("docs/peers.md", "scripts/peer start peer1 127.0.0.2"):
        "starts a peer under a fixed name in /tmp, shared by every session on the machine",
    ("docs/peers.md", "scripts/vm start /tmp/vm"): "boots the test VM (about a minute; VM tests only)",
    ("docs/peers.md", "scripts/vm stop /tmp/vm"): "stops the test VM",
    ("docs/preflight.md", "hostrun -- ./scripts/crash.sh; echo $?"):
        "the page's script with its recorded inputs and another instance running, at their times",
    ("docs/preflight.md", "hostrun preflight ./scripts/crash.sh; echo $?"):
        "the page's script with its recorded inputs, at their times",
}

# A page's fixed path under /tmp, replaced by one in the test's own directory (and only in the
# command: the shown output names none of them).
PRIVATE = {"/tmp/r.json": "r.json"}

# Volatile parts, each replaced on both sides by its own placeholder (narrow on purpose).
VOLATILE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^srun: error: [\w.-]+: task "), "srun: error: NODE: task "),  # the node's name
    # the slice advice (dispatch/core/sliceadvice.py): the config file named, the size from the RAM
    (re.compile(r"(?<= in )/\S+/hosts\.toml\b"), "CONFIG"),
    (re.compile(r'(?<=slice = ")\d+[MG](?=")'), "SIZE"),
]


class Example:
    def __init__(self, page: str, line: int, block: int, command: str) -> None:
        self.page, self.line, self.block, self.command = page, line, block, command
        self.shown: list[str] = []

    @property
    def key(self) -> tuple[str, str]:
        return (self.page, self.command)


def examples() -> list[Example]:
    """Every ``$ `` command of every example block, with the lines shown after it: the fenced
    ``console`` blocks, and the indented blocks (four spaces) whose first line is a ``$ `` command."""
    found: list[Example] = []
    block = 0
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        fenced = indented = False
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if text.startswith("```"):
                fenced = text.strip() == "```console"
                block += 1
                continue
            if indented and not text.startswith("    "):
                indented = False
            if not fenced and not indented and text.startswith("    $ ") and not text[:1].strip():
                indented = True
                block += 1
            if not (fenced or indented):
                continue
            line = text[4:] if indented else text
            if line.startswith("$ "):
                command = re.sub(r"\s{2,}#.*$", "", line[2:]).strip()
                found.append(Example(page, number, block, command))
            elif found and found[-1].block == block:
                found[-1].shown.append(line.rstrip())
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


MARK = "\x1e"  # printed before each command: splits the block's output into each command's


def blocks(how: str) -> list[list[Example]]:
    """The blocks that hold a command run ``how``, each as the list of those commands, in order."""
    grouped: dict[int, list[Example]] = {}
    for example in examples():
        if RUN.get(example.key) == how:
            grouped.setdefault(example.block, []).append(example)
    return list(grouped.values())


def run_block(block: list[Example], tmp_path: Path, config: Path, cwd: Path,
              own_python: bool = True) -> None:
    """The block's commands in one bash, in order (so ``$ echo $?`` reads the previous command's
    status, a ``cd`` holds for the next), ``hostrun`` being this tree's under the private config;
    each command's output as a terminal shows it (stdout and stderr together, in order) compared
    with the lines the page shows after it. The pages' ``python3`` is this interpreter; for a peer
    (``own_python`` False) the system's, the one the peer's login PATH finds (a different version
    there would rightly be refused, 247)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "hostrun"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m dispatch --config {config} "$@"\n')
    wrapper.chmod(0o755)
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert own_python or system, "no python3 on the system PATH for the peer's login"
    (bin_dir / "python3").symlink_to(sys.executable if own_python else str(system))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    env.pop("HOSTRUN_SESSION", None)
    # Each command after its mark, with the status of the one before it kept across the printf.
    script = "".join(f"status=$?; printf '{MARK}%s\\n' {i}; (exit $status)\n"
                     f"{concrete(e.command, tmp_path)}\n" for i, e in enumerate(block))
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          check=False)
    said: list[list[str]] = []
    for line in done.stdout.split("\n"):
        before, mark, _ = line.partition(MARK)
        if mark:
            if before and said:
                said[-1].append(before)  # a last line without its newline
            said.append([])
        elif said:
            said[-1].append(line)
    said = [lines[:-1] if lines and lines[-1] == "" else lines for lines in said]
    assert len(said) == len(block), done.stdout
    for example, output in zip(block, said):
        assert normalised(output) == normalised(example.shown), \
            f"{example.page}:{example.line}: $ {example.command}"


def concrete(command: str, tmp_path: Path) -> str:
    """A page's fixed path under /tmp made this test's own (``PRIVATE``): nothing shared is written."""
    for shared, name in PRIVATE.items():
        command = command.replace(shared, str(tmp_path / name))
    return command


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
    build = work / "build.sh"  # preflight.md: a malformed header on line 3
    build.write_text("#!/bin/sh\n# a build script\n# run-condition: frobnicate\necho built\n")
    build.chmod(0o755)
    return work


def block_id(block: list[Example]) -> str:
    return f"{block[0].page}:{block[0].line}"


@pytest.mark.parametrize("block", blocks("local"), ids=block_id)
def test_local_examples(block: list[Example], hostrun: Hostrun, tmp_path: Path) -> None:
    run_block(block, tmp_path, local_config(hostrun), prepare(tmp_path))


@pytest.mark.parametrize("block", blocks("peer"), ids=block_id)
def test_peer_examples(block: list[Example], hostrun: Hostrun, peers: Callable[..., Any],
                       tmp_path: Path) -> None:
    _, tree = peer_setup(hostrun, peers, tmp_path)
    run_block(block, tmp_path, hostrun.config_path, tree, own_python=False)


@pytest.mark.parametrize("block", blocks("cluster"), ids=block_id)
def test_cluster_examples(block: list[Example], slurm: Any, tmp_path: Path) -> None:
    """Against the private one-node Slurm cluster (tests/support/slurmcluster.py), named as the
    page names it."""
    config = tmp_path / "hosts.toml"
    config.write_text(f"enable_across_machines = true\nstate_dir = '{tmp_path / 'state'}'\n"
                      f"[hosts.cluster]\nkind = 'slurm'\nslurm_conf = '{slurm.conf}'\n")
    run_block(block, tmp_path, config, prepare(tmp_path))
