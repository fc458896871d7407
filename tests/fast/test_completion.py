"""Shell completion: ``hostrun completion --complete`` says what may come next (subcommands, actions,
options read from each command's own help, configured hosts, recorded labels, an option's listed
values), and the scripts of ``hostrun completion bash|zsh|fish`` hand that to the real shells: bash
through its ``complete -F`` function with ``COMP_WORDS``, zsh through the function it defines (with
``compadd`` recording what it is given, as zsh's completion system would receive it), fish through
``complete -C``, all calling the installed ``hostrun`` console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.cli.completion import candidates
from tests.conftest import _unavailable

BIN = str(Path(sys.executable).parent)  # where the venv's hostrun console script is


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two hosts, and a ledger whose peak table has two labels (recorded by real runs)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\n[hosts.box]\nssh = 'me@box'\n")
    from dispatch.local.admission.ledger import Ledger

    ledger = Ledger(str(tmp_path / "state"))
    try:
        for label in ("build-all", "test-unit"):
            ledger.record_peak(label, "local", 64 << 20, False, 1.0, cap=None)
    finally:
        ledger.close()
    return cfg


def words(cfg: Path, *typed: str) -> list[str]:
    return candidates(["--config", str(cfg), *typed])


def test_subcommands_actions_and_options(config: Path) -> None:
    assert words(config, "re") == ["report"]
    assert "history" in words(config, "") and "run" not in words(config, "")
    assert words(config, "workdir", "") == ["claim", "list", "clean"]
    assert words(config, "agents", "") == ["install", "uninstall", "status"]
    assert words(config, "hook", "s") == ["session-start", "stop"]
    assert words(config, "history", "--l") == ["--label", "--limit"]
    assert words(config, "workdir", "list", "--d") == ["--depth"]
    assert words(config, "--max") == ["--max-runtime"]  # a run's options, before --
    assert words(config, "-m", "1G", "--", "mak") == []  # the command itself: the shell's own


def test_values_hosts_labels_and_listed_choices(config: Path) -> None:
    assert words(config, "--host", "") == ["local", "box"]
    assert words(config, "report", "--host", "b") == ["box"]
    assert words(config, "-l", "") == ["build-all", "test-unit"]
    assert words(config, "history", "--label", "t") == ["test-unit"]
    assert words(config, "hook", "--mode", "") == ["remind", "wrap", "guard"]
    assert words(config, "--result-file", "") == []  # a path: the shell completes files


def run_shell(argv: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        _unavailable(f"{shell} is not installed (scripts/setup installs it)")
    assert path is not None
    return path


def test_bash_completes_through_its_script(config: Path, tmp_path: Path) -> None:
    script = 'eval "$(hostrun completion bash)"; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); ' \
             '_hostrun; printf "%s\\n" "${COMPREPLY[@]}"; complete -p hostrun'
    out = run_shell([need("bash"), "-c", script, "bash", "hostrun", "--config", str(config),
                     "report", "--host", ""], tmp_path)
    assert out.splitlines() == ["local", "box", "complete -o default -F _hostrun hostrun"]
    out = run_shell([need("bash"), "-c", script, "bash", "hostrun", "work"], tmp_path)
    assert out.splitlines()[0] == "workdir"


def test_zsh_completes_through_its_script(config: Path, tmp_path: Path) -> None:
    script = ('compdef() { :; }; compadd() { shift; print -l -- "$@"; }; _files() { print FILES; }; '
              'eval "$(hostrun completion zsh)"; words=("$@"); CURRENT=$#; _hostrun')
    out = run_shell([need("zsh"), "-f", "-c", script, "zsh", "hostrun", "--config", str(config),
                     "-l", "b"], tmp_path)
    assert out.splitlines() == ["build-all"]
    out = run_shell([need("zsh"), "-f", "-c", script, "zsh", "hostrun", "--result-file", ""], tmp_path)
    assert out.splitlines() == ["FILES"]  # no candidates: zsh's own file completion


def test_fish_completes_through_its_script(config: Path, tmp_path: Path) -> None:
    script = (f"hostrun completion fish | source; complete -C 'hostrun --config {config} agents '; "
              f"complete -C 'hostrun --config {config} --host '")
    out = run_shell([need("fish"), "--no-config", "-c", script], tmp_path)
    got = [line.split("\t")[0] for line in out.splitlines()]
    assert {"install", "uninstall", "status", "local", "box"} <= set(got)


def test_a_bad_shell_is_one_line_and_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dispatch", "completion", "tcsh"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        "hostrun: error: completion: name a shell: bash, zsh, fish (see 'hostrun completion --help')")
