"""Sentences of the docs that an audit found false (issue 27, items 3-5), each tied to the run that
shows it: the page must say what hostrun does, and hostrun must do it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatch.cli.common import COMMANDS
from tests.conftest import Hostrun

ROOT = Path(__file__).resolve().parents[2]


def page(name: str) -> str:
    """The page's text with its line breaks and indentation folded to single spaces."""
    return " ".join((ROOT / name).read_text().split())


def says(name: str, phrase: str) -> bool:
    """Whether page ``name`` holds ``phrase``, line breaks and indents aside (a bool, so a failure
    does not print the page)."""
    return " ".join(phrase.split()) in " ".join(page(name).split())


def hostrun_cmd(config: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatch", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def test_peers_md_says_rsync_is_skipped_when_nothing_changed() -> None:
    """Item 3: the skip exists (tests/system/test_peer_sync_skip.py runs it); no sentence denies it."""
    assert not says("docs/peers.md", "It runs every time")
    assert not says("docs/peers.md", "**not implemented**: every run walks the tree with rsync")
    assert says("docs/peers.md", "not at all when neither your tree nor the peer's copy changed since "
                "the last sync")


def test_state_dir_modes_are_as_admission_md_says(hostrun: Hostrun) -> None:
    """Item 4: a 0755 state_dir is tightened to 0700; a group-writable one is refused (exit 2)."""
    assert not says("docs/admission.md", "An existing directory keeps its mode")
    assert says("docs/admission.md", "(say 0755) is tightened to 0700; one that group or others can write")
    hostrun.state_dir.mkdir(mode=0o755)
    os.chmod(hostrun.state_dir, 0o755)
    assert hostrun.run("--", "true").returncode == 0
    assert hostrun.state_dir.stat().st_mode & 0o777 == 0o700
    os.chmod(hostrun.state_dir, 0o775)
    refused = hostrun.run("--", "true")
    assert refused.returncode == 2 and "refusing" in refused.stderr, refused.stderr


@pytest.fixture
def unreachable_peer(tmp_path: Path) -> Path:
    """A config with a peer nobody answers for (connection refused at once: no sshd needed)."""
    config = tmp_path / "hosts.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nenable_across_machines = true\n'
                      '[hosts.local]\nslice = "300M"\n[hosts.peer1]\nssh = "127.0.0.1"\nport = 1\n')
    return config


def test_a_failed_peer_run_s_result_names_the_peer(unreachable_peer: Path, tmp_path: Path) -> None:
    """Item 5: exit-codes.md said ``host`` is ``local`` for 246/247/251."""
    assert not says("docs/exit-codes.md", "there `host` is `local` in this version")
    assert says("docs/exit-codes.md", "there `host` is the peer's name")
    out = tmp_path / "r.json"
    done = hostrun_cmd(unreachable_peer, "--peer", "--result-file", str(out), "--", "true")
    assert done.returncode == 246, done.stderr
    result = json.loads(out.read_text())
    assert (result["host"], result["outcome"]) == ("peer1", "peer-unreachable")


def test_peer_name_with_a_space_then_dashes_is_a_usage_error(unreachable_peer: Path) -> None:
    """Item 5: ``--peer NAME -- CMD`` is exit 2, as peers.md now says (not "part of the command")."""
    assert not says("docs/peers.md", "`--peer NAME` makes NAME part of the command")
    assert says("docs/peers.md", "`--peer NAME -- CMD` is a usage error, exit 2")
    done = hostrun_cmd(unreachable_peer, "--peer", "peer1", "--", "true")
    assert done.returncode == 2
    assert done.stderr == ("hostrun: error: unrecognized arguments: peer1; --peer takes a name only as "
                           "--peer=peer1 (see 'hostrun --help')\n")


@pytest.mark.parametrize(("args", "help_of"), [
    (("--host", "nope", "--", "true"), "hostrun"),
    (("--tree", "x", "--", "true"), "hostrun"),
    (("lock", "--status", "/nonexistent"), "hostrun lock"),
    (("lock", "--status", "/", "--bogus"), "hostrun lock"),
    (("alerts", "--unread"), "hostrun alerts"),
    (("ledger", "--bogus"), "hostrun ledger"),
    (("workdir", "frobnicate"), "hostrun workdir"),
])
def test_every_usage_error_says_where_help_is(unreachable_peer: Path, args: tuple[str, ...],
                                              help_of: str) -> None:
    """Item 5: cli.md promises ``hostrun: error: … (see 'hostrun --help')`` for a usage error."""
    env_free = {k: v for k, v in os.environ.items() if k != "HOSTRUN_SESSION"}
    done = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(unreachable_peer), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL, env=env_free)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("hostrun: error: ") and line.endswith(f"(see '{help_of} --help')"), line
    assert line.count("--help')") == 1, line


def test_a_configuration_error_names_its_own_fix_without_the_help_pointer(tmp_path: Path) -> None:
    config = tmp_path / "hosts.toml"
    config.write_text("[hosts.local]\nslice = \"lots\"\n")
    done = hostrun_cmd(config, "--", "true")
    assert done.returncode == 2 and "--help" not in done.stderr, done.stderr


def test_cli_md_lists_every_name_that_needs_dashes() -> None:
    """Item 5: the names a command must follow ``--`` to use are exactly the subcommands."""
    text = page("docs/cli.md")
    sentence = re.search(r"or when its name is (.*?) \(`hostrun top` is the live view", text)
    assert sentence is not None
    listed = set(re.findall(r"`([a-z]+)`", sentence.group(1)))
    assert listed == set(COMMANDS)


def test_agents_md_shows_the_absolute_path_the_rewrite_writes() -> None:
    """Item 5: the rewritten line starts with hostrun's absolute path (or this Python -m dispatch)."""
    from dispatch.hooks.rewrite import hostrun_argv

    assert says("docs/agents.md", "`/ABS/PATH/hostrun --session claude-<session_id>")
    first = hostrun_argv(None)[0]
    assert os.path.isabs(first)


def test_a_silent_peer_reads_as_the_report_timeout_set(tmp_path: Path) -> None:
    """Item 5: "no answer within 1.49718 s" for a 3 s ``report_timeout``; peers.md shows the line.
    The peer here accepts the connection and never says a word (no SSH banner)."""
    assert says("docs/peers.md", "peer1: could not read: peer peer1: no answer within 12 s")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=hold)
    thread.start()
    config = tmp_path / "hosts.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nenable_across_machines = true\n'
                      'report_timeout = "2s"\n[hosts.local]\nslice = "300M"\n[hosts.peer1]\n'
                      f'ssh = "127.0.0.1"\nport = {listener.getsockname()[1]}\n')
    try:
        done = hostrun_cmd(config, "report", "--host", "peer1")
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    assert done.returncode == 246, done.stderr
    assert done.stdout + done.stderr == "peer1: could not read: peer peer1: no answer within 2 s\n"


def test_every_page_of_docs_the_code_cites_exists() -> None:
    """A docstring's ``docs/NAME.md`` is where a maintainer goes next: it must be there."""
    cited = {(path.relative_to(ROOT), name) for path in (ROOT / "dispatch").rglob("*.py")
             for name in re.findall(r"docs/([\w-]+\.md)", path.read_text())}
    assert cited and [c for c in cited if not (ROOT / "docs" / c[1]).exists()] == []
