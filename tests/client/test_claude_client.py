"""hostrun's hooks under the real Claude Code client (tests/support/claudeclient.py, pinned; from
the npm registry, cached), talking to a fake Messages API of our own on loopback
(tests/support/claudeapi.py), with the client's non-essential traffic off: nothing leaves the
machine. The client runs the hooks ``hostrun agents install`` wrote, as it does for a user.

Where the client cannot be installed (no npm, no registry) the tier is not run and says so in the
suite's not-run line; on CI that is a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun, wait_for
from tests.support.claudeapi import FakeMessagesAPI
from tests.support.claudeclient import VERSION, Claude, Terminal
from tests.support.claudefixtures import (
    ENDS_WITHIN_S,
    MODES,
    api,
    claude,
    client_binary,
    project,
    seconds_to_end,
)

__all__ = ["api", "claude", "client_binary"]  # fixtures, used by name


def test_the_pinned_client_is_the_one_run(client_binary: Path) -> None:
    said = subprocess.run([str(client_binary), "--version"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert said.stdout.startswith(VERSION), said.stdout


@pytest.mark.parametrize("mode", MODES)
def test_print_mode_finishes_in_an_installed_project(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path, mode: str) -> None:
    """``claude -p`` waits for every Stop hook, background ones too, before it prints its result:
    before, the rewake waiter held every ``-p`` run in an installed project for its whole 55 min
    (this test's 120 s hang detector ended it, no result printed). Now the waiter is not started
    headless, and the run ends with its result within seconds of the model's last answer."""
    tree = project(hostrun, tmp_path, mode)
    api.script = [("bash", "echo light-command-ran"), ("text", "all done")]
    proc, result = claude.print_mode("go", tree, "--allowedTools", "Bash")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert seconds_to_end(claude, api) < ENDS_WITHIN_S, seconds_to_end(claude, api)
    assert result.get("result") == "all done" and not result.get("is_error"), result
    assert "light-command-ran" in api.sent_text()  # the command ran and its output reached the model
    assert not list((tmp_path / "client-home").rglob("rewake-*.pid"))


def _hog(hostrun: Hostrun, label: str, session: str) -> None:
    proc = hostrun.run("-m", "100M", "--label", label, "--session", session, "--",
                       sys.executable, "-c", "x = bytearray(300 << 20)")
    assert proc.returncode == ExitCode.OWN_CAP, proc.stderr


def _idle(claude: Claude, tree: Path, hooks: Path) -> tuple[Terminal, str, str]:
    """The terminal UI after one turn, idle with its rewake waiter: (ui, session, waiter's pid)."""
    ui = Terminal(claude, tree, f"hostrun-cc-{os.getpid()}", HOSTRUN_REWAKE_POLL="0.3")
    wait_for(lambda: "\u276f" in ui.screen(), timeout=60, interval=0.5)  # its prompt
    ui.send("hi", "Enter")
    markers = wait_for(lambda: list(hooks.glob("rewake-*.pid")), timeout=60, interval=0.3)
    return ui, markers[0].name.removeprefix("rewake-").removesuffix(".pid"), markers[0].read_text()


def test_an_idle_terminal_session_is_woken_by_each_alert(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """The terminal UI in tmux: after its turn the session idles and the rewake waiter watches it.
    A job of the session killed at its cap wakes it with the alert (the model is sent it). Before,
    the Stop ending that woken turn (``stop_hook_active``) started no waiter, so a second kill
    reached nobody until the user typed; now it wakes the session again."""
    tree = project(hostrun, tmp_path, "wrap")
    hooks = tmp_path / "client-home" / ".cache" / "hostrun" / "hooks"
    ui, session, first_waiter = _idle(claude, tree, hooks)
    try:
        _hog(hostrun, "idle-hog", session)
        wait_for(lambda: "idle-hog" in api.sent_text(), timeout=60, interval=0.3)
        wait_for(lambda: any(m.read_text() != first_waiter for m in hooks.glob("rewake-*.pid")),
                 timeout=60, interval=0.3)  # the woken turn's Stop armed a new waiter
        _hog(hostrun, "second-hog", session)
        wait_for(lambda: "second-hog" in api.sent_text(), timeout=60, interval=0.3)
    finally:
        ui.close()


def test_a_killed_clients_waiter_ends_and_leaves_the_next_alert_unread(
        hostrun: Hostrun, claude: Claude, tmp_path: Path) -> None:
    """The client is killed while idle: before, its waiter went on and took the session's next
    alert, which then reached nobody (not ``alerts --unread``, not a resumed session); now the
    waiter ends with its client and the alert stays unread."""
    tree = project(hostrun, tmp_path, "wrap")
    hooks = tmp_path / "client-home" / ".cache" / "hostrun" / "hooks"
    ui, session, _ = _idle(claude, tree, hooks)
    try:
        os.kill(ui.pid, signal.SIGKILL)
        wait_for(lambda: not list(hooks.glob("rewake-*.pid")), timeout=30, interval=0.3)
        _hog(hostrun, "after-the-client", session)
        unread = hostrun.run("alerts", "--unread", "--session", session)
        assert "after-the-client" in unread.stdout, (unread.stdout, unread.stderr)
    finally:
        ui.close()


# A project's own settings, as a person writes them: 4-space indentation, an empty Stop list of their
# own (before, uninstall re-indented the file and removed the list).
OWN_SETTINGS = """{
    "hooks": {
        "Stop": []
    },
    "permissions": {"deny": ["Bash(rm -rf /:*)"]}
}
"""


@pytest.mark.parametrize("before", [None, OWN_SETTINGS], ids=["no-settings", "own-settings"])
def test_install_and_uninstall_round_trip_leaves_the_project_as_it_was(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path, before: str | None) -> None:
    """Installed, the client runs hostrun's hooks (SessionStart exports the session's name to its
    shell: a command the model runs sees ``HOSTRUN_SESSION``); uninstalled, after the client has
    used the project, the checkout is as it was: no ``.claude/`` where there was none (before: a
    ``{}`` file in a new directory), the project's own file byte for byte (before: re-indented, its
    empty ``Stop`` list gone), and the client runs without the hooks."""
    tree = project(hostrun, tmp_path, "remind", settings=before)
    api.script = [("bash", "echo session=$HOSTRUN_SESSION"), ("text", "ok")]
    proc, result = claude.print_mode("go", tree, "--allowedTools", "Bash")
    assert proc.returncode == 0 and result.get("result") == "ok", proc.stderr[-2000:]
    assert f"session=claude-{result['session_id']}" in api.sent_text()
    done = hostrun.run("agents", "uninstall", "claude-code", cwd=tree)
    assert done.returncode == 0, done.stderr
    if before is None:
        assert sorted(p.name for p in tree.iterdir()) == [".git"]
    else:
        assert sorted(p.name for p in (tree / ".claude").iterdir()) == ["settings.json"]
        assert (tree / ".claude" / "settings.json").read_text() == before
    proc, result = claude.print_mode("go", tree, "--allowedTools", "Bash")
    assert proc.returncode == 0 and "session=\n" in api.sent_text() + "\n", api.sent_text()[-500:]


def test_wrap_honours_a_projects_allow_rule_only_in_a_trusted_workspace(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """A checkout that allows ``Bash(make:*)`` itself: the client ignores that until the user trusts
    the workspace. Before, wrap read the rule anyway and answered ``allow``, so ``make check`` ran
    under ``claude -p`` where the client alone would have refused it; now it is refused there, and
    once the workspace is trusted it runs, through hostrun, in a job's cgroup. The refusal's text,
    which is all the model is told, says that nothing ran."""
    tree = project(hostrun, tmp_path, "wrap")
    settings = tree / ".claude" / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()),
                                    "permissions": {"allow": ["Bash(make:*)"]}}))
    (tree / "Makefile").write_text("check:\n\tcat /proc/self/cgroup > ran.txt\n")
    api.script = [("bash", "make check"), ("text", "ok")]
    proc, _ = claude.print_mode("go", tree)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tree / "ran.txt").exists(), api.sent_text()[-1000:]
    # headless, the hook's ask became a denial whose text is the hook's reason: it must not say
    # the command ran (before: "runs under a memory cap, booked in hostrun's ledger")
    told = api.sent_text()
    assert "hostrun wrap: heavy" in told and "if it was refused, nothing ran" in told, told[-1500:]
    (claude.home / ".claude.json").write_text(json.dumps(
        {"projects": {str(tree.resolve()): {"hasTrustDialogAccepted": True}}}))
    proc, _ = claude.print_mode("go", tree)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{hostrun.cgroup}/job-" in (tree / "ran.txt").read_text()


def _status(hostrun: Hostrun, claude: Claude, tree: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``hostrun agents status`` with the client on PATH, as ``claude``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "claude").exists():
        (bin_dir / "claude").symlink_to(claude.binary)
    env = claude.env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    return hostrun.run("agents", "status", cwd=tree, env=env, timeout=180)


def test_agents_status_makes_one_real_round_trip_through_the_client(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """With ``claude`` on PATH, status runs it once headless in the project: the client read the
    installed settings and ran hostrun's SessionStart and Stop hooks, and ended (the rewake waiter
    did not hold it). One request, to the cheap model, with no tools."""
    tree = project(hostrun, tmp_path, "guard")
    api.script = [("text", "ok")]
    done = _status(hostrun, claude, tree, tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("client round trip"))
    assert line.startswith(f"client round trip ok: Claude Code {VERSION}"), line
    assert "SessionStart, Stop" in line, line
    asked = [r for r in api.requests if "connectivity check by hostrun" in json.dumps(r.get("messages"))]
    assert len(asked) == 1 and "haiku" in str(asked[0].get("model")) and not asked[0].get("tools"), asked


def test_agents_status_fails_when_the_client_does_not_run_hostruns_hooks(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """A settings file hostrun reads as installed but the client will not use (a hook entry it
    rejects: a timeout that is not a number): the self-test alone passes; the round trip shows the
    client never ran hostrun's SessionStart hook, and status exits 78."""
    tree = project(hostrun, tmp_path, "wrap")
    settings = tree / ".claude" / "settings.json"
    data = json.loads(settings.read_text())
    for group in data["hooks"]["SessionStart"]:
        for hook in group["hooks"]:
            hook["timeout"] = "thirty"
    settings.write_text(json.dumps(data))
    api.script = [("text", "ok")]
    done = _status(hostrun, claude, tree, tmp_path)
    assert done.returncode == ExitCode.NOT_RUN, (done.stdout[-2000:], done.stderr[-2000:])
    assert "client round trip FAIL" in done.stdout and "did not run hostrun's SessionStart" in done.stdout, \
        done.stdout[-2000:]
    assert "self-test FAIL" not in done.stdout, done.stdout[-3000:]
