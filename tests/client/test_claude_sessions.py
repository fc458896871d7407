"""Agent sessions (``hostrun session``) with the real Claude Code client (pinned, from the npm registry)
headless (``claude -p``) against the fake Messages API on loopback: the client itself, the tools it
runs and the jobs it starts through hostrun, each where docs/agents.md ("Sessions under the budget")
says; and a session whose tool balloons past its cap ending 250, whole, while another session and a
job go on. Real cgroups (v1 here; the VM runs the stand-in on systemd + v2).

Tests run as root here, where the client refuses ``bypassPermissions`` unless ``IS_SANDBOX=1``
says it runs in a sandbox: these runs set it (a throwaway home, loopback only).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun, wait_for
from tests.support.claudeapi import FakeMessagesAPI
from tests.support.claudeclient import Claude, Terminal
from tests.support.claudefixtures import api, claude, client_binary, project

__all__ = ["api", "claude", "client_binary"]  # fixtures, used by name

MiB = 1 << 20


def _tree(hostrun: Hostrun, tmp_path: Path) -> Path:
    tree = tmp_path / "project"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    hostrun.configure(slice="4G", top='[sessions]\nshare = 1\ncap = "3G"\nfirst_booking = "512M"\n')
    return tree


def _session(hostrun: Hostrun, claude: Claude, tree: Path, *options: str, timeout: float = 180
             ) -> subprocess.CompletedProcess[str]:
    """``hostrun session [options] -- claude -p go`` in ``tree``, every tool permitted."""
    argv = hostrun.argv("session", *options, "--", str(claude.binary), "-p", "go", "--output-format", "json",
                        "--permission-mode", "bypassPermissions")
    return subprocess.run(argv, cwd=tree, env=claude.env(IS_SANDBOX="1"), capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def test_the_client_runs_in_its_session_cgroup_and_its_hostrun_jobs_beside_it(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """The client, its Bash tool and what that runs are in the session's cgroup in the sessions
    slice; a ``hostrun -- CMD`` the model runs is a job in the slice, booked apart; the session's
    peak (the client's own memory) is recorded under ``session:claude`` when it ends."""
    tree = _tree(hostrun, tmp_path)
    job = " ".join([*hostrun.argv("-m", "50M", "--"), "sh", "-c", "'cat /proc/self/cgroup > job.txt'"])
    api.script = [("bash", "cat /proc/self/cgroup > tool.txt"), ("bash", job), ("text", "done")]
    done = _session(hostrun, claude, tree)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])
    assert json.loads(done.stdout.strip().splitlines()[-1])["type"] == "result"
    assert f"{hostrun.cgroup}/sessions/session-" in (tree / "tool.txt").read_text()
    assert f"{hostrun.cgroup}/job-" in (tree / "job.txt").read_text()
    peaks = {p["label"]: p for p in json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]}
    assert peaks["session:claude"]["max_peak"] > 50 * MiB, peaks  # the client itself, measured
    assert hostrun.bookings() == []


def test_a_session_whose_tool_balloons_ends_250_whole_while_another_and_a_job_go_on(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """The model's Bash tool allocates past the session's cap: the session (the client with it)
    ends 250; a second session (a stand-in) and a job started before it end 0; the alert says how
    to resume it (``claude --continue``)."""
    tree = _tree(hostrun, tmp_path)
    other = hostrun.popen("session", "--label", "other", "-m", "100M", "--", "sleep", "20")
    job = hostrun.popen("-m", "100M", "--", "sleep", "20")
    wait_for(lambda: len(hostrun.job_dirs()) == 2, timeout=30)
    balloon = f"{sys.executable} -c 'import time; x = bytearray(1500 << 20); time.sleep(30)'"
    api.script = [("bash", balloon), ("text", "done")]
    done = _session(hostrun, claude, tree, "-m", "1G")
    assert done.returncode == ExitCode.OWN_CAP, (done.stdout[-1500:], done.stderr[-1500:])
    assert other.wait(timeout=60) == 0 and job.wait(timeout=60) == 0
    alerts = [json.loads(line) for line in (hostrun.state_dir / "alerts.jsonl").read_text().splitlines()]
    (alert,) = [a for a in alerts if a["label"] == "session:claude"]
    assert alert["kind"] == "own-cap" and "--continue" in alert["action"], alert
    assert alert["action"].startswith("hostrun session --label claude -m "), alert


def test_a_session_started_without_the_wrapper_is_placed_at_its_start(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """``[sessions] place = true`` and the hooks installed: the client's SessionStart hook books the
    session and moves the client into the sessions slice, so the Bash tool it runs later is there
    too; the model is told so; when the client ends its booking is released and its peak (what it
    allocated once inside) recorded."""
    tree = project(hostrun, tmp_path, "remind")
    hostrun.configure(slice="4G", top='[sessions]\nplace = true\nshare = 1\ncap = "3G"\n'
                                      'first_booking = "512M"\n')
    wait = ("for i in $(seq 100); do grep -q /sessions/ /proc/$$/cgroup && break; sleep 0.1; done; "
            "cat /proc/$$/cgroup > tool.txt")
    api.script = [("bash", wait), ("text", "done")]
    proc, result = claude.print_mode("go", tree, "--permission-mode", "bypassPermissions",
                                     env=claude.env(IS_SANDBOX="1"))
    assert proc.returncode == 0 and result.get("type") == "result", (proc.stdout[-1500:], proc.stderr[-1500:])
    assert f"{hostrun.cgroup}/sessions/session-" in (tree / "tool.txt").read_text()
    assert "booked as an agent session" in api.sent_text()
    wait_for(lambda: hostrun.bookings() == [], timeout=30)
    peaks = {p["label"]: p for p in json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]}
    # What it allocated once inside: the kernel does not move what was charged before (docs/agents.md)
    assert peaks["session:claude"]["max_peak"] > 0, peaks


def _cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def test_the_terminal_ui_is_placed_at_its_start_and_released_when_it_quits(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """The client's terminal UI in tmux, started as plain ``claude`` with ``[sessions] place = true``
    and the hooks installed: at its start it is booked as ``session:claude`` and its process moved
    into the sessions slice; ``/exit`` ends it, and its booking is released and its peak recorded."""
    tree = project(hostrun, tmp_path, "remind")
    hostrun.configure(slice="4G", top='[sessions]\nplace = true\nshare = 1\ncap = "3G"\n'
                                      'first_booking = "512M"\n')
    ui = Terminal(claude, tree, f"hostrun-cs-{os.getpid()}")
    try:
        wait_for(lambda: "\u276f" in ui.screen(), timeout=60, interval=0.5)  # its prompt
        pid = ui.pid  # the pane runs ``env … claude``: env execs the client
        wait_for(lambda: f"{hostrun.cgroup}/sessions/session-" in _cgroup_of(pid), timeout=60, interval=0.3)
        assert [(b[1], b[2]) for b in hostrun.bookings()] == [("session:claude", "running")]
        ui.send("/exit", "Enter")
        wait_for(lambda: hostrun.bookings() == [], timeout=60, interval=0.3)
    finally:
        ui.close()
    peaks = {p["label"] for p in json.loads(hostrun.run("ledger", "--json").stdout)["peaks"]}
    assert "session:claude" in peaks


def test_the_terminal_ui_runs_under_hostrun_session(hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI,
                                                    tmp_path: Path) -> None:
    """``hostrun session -- claude`` in a terminal: the UI comes up (the terminal handed to it),
    its process is in the session's cgroup, and ``/exit`` ends the session 0 with its peak recorded."""
    tree = _tree(hostrun, tmp_path)
    argv = hostrun.argv("session", "--label", "tui", "--result-file", str(tmp_path / "r.json"), "--",
                        str(claude.binary))
    state = {"hasCompletedOnboarding": True, "theme": "dark",
             "customApiKeyResponses": {"approved": ["sk-fake-test"], "rejected": []},
             "projects": {str(tree): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}
    (claude.home / ".claude.json").write_text(json.dumps(state))
    name = f"hostrun-cst-{os.getpid()}"
    words = ["env", *(f"{k}={v}" for k, v in claude.env().items()), *argv]
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "50", "-c", str(tree),
                    " ".join(map(shlex.quote, words))], check=True, timeout=30)
    try:
        screen = lambda: subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,  # noqa: E731
                                        text=True, timeout=30).stdout
        wait_for(lambda: "\u276f" in screen(), timeout=60, interval=0.5)
        (session_dir,) = wait_for(lambda: list(hostrun.slice_dir.glob("sessions/session-*")), timeout=30)
        assert (session_dir / "cgroup.procs").read_text().split()  # the client runs in it
        subprocess.run(["tmux", "send-keys", "-t", name, "/exit", "Enter"], check=True, timeout=30)
        wait_for(lambda: (tmp_path / "r.json").exists(), timeout=60, interval=0.3)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True, timeout=30, check=False)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["exit_code"] == 0 and result["label"] == "session:tui", result
