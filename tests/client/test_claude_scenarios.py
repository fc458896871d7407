"""The scenarios of the real-client tier: what the real Claude Code client (pinned, from the npm
registry) does with hostrun's hooks in each hook mode and each of its permission modes, headless
(``claude -p``) against the fake Messages API on loopback. Each test asserts where a command ran (the
cgroup it saw: a job's under hostrun's slice, or the client's own) and what the model was told.

Tests run as root here, where the client refuses ``bypassPermissions`` unless ``IS_SANDBOX=1``
says it runs in a sandbox: these runs set it (a throwaway home, loopback only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dispatch.core.exitcodes import ExitCode
from tests.conftest import Hostrun
from tests.support.claudeapi import FakeMessagesAPI
from tests.support.claudeclient import Claude
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

PERMISSION_MODES = ("default", "acceptEdits", "plan", "dontAsk", "bypassPermissions")
INSTEAD = "Run it through hostrun instead:\n"


def _user_allows(claude: Claude, *rules: str) -> None:
    """Allow rules in the user's own settings (counted whatever the workspace's trust)."""
    settings = claude.home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"permissions": {"allow": list(rules)}}))


def _headless(claude: Claude, api: FakeMessagesAPI, tree: Path, permission_mode: str, *options: str
              ) -> dict[str, object]:
    """``claude -p`` in that permission mode: it ends with its result, within seconds of the
    model's last answer (no hook of any mode holds it)."""
    proc, result = claude.print_mode("go", tree, "--permission-mode", permission_mode, *options,
                                     env=claude.env(IS_SANDBOX="1"))
    assert proc.returncode == 0 and result.get("type") == "result", (proc.stdout[-1500:], proc.stderr[-1500:])
    assert seconds_to_end(claude, api) < ENDS_WITHIN_S, seconds_to_end(claude, api)
    return result


def _instead_line(told: str) -> str:
    """The line a guard refusal gives to run instead, as a model reading it would take it."""
    return told.rsplit(INSTEAD, 1)[1].split("\n", 1)[0] if INSTEAD in told else "echo no-instead-line-given"


def _where(hostrun: Hostrun, ran: Path) -> str:
    if not ran.exists():
        return "nowhere"
    return "job" if f"{hostrun.cgroup}/job-" in ran.read_text() else "direct"


def _expected(mode: str, permission_mode: str, rule: bool) -> str:
    """Where ``make check`` runs: what the docs promise (docs/agents.md, the modes and the wrap
    table). Headless nobody answers a prompt, so a command that would prompt is refused."""
    permitted = rule or permission_mode == "bypassPermissions"
    if mode == "remind":
        return "direct" if permitted else "nowhere"
    return "job" if permitted else "nowhere"


@pytest.mark.parametrize("rule", [False, True], ids=["no-rule", "user-allows"])
@pytest.mark.parametrize("permission_mode", PERMISSION_MODES)
@pytest.mark.parametrize("mode", MODES)
def test_light_and_heavy_commands_in_each_mode_and_permission_mode(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path,
        mode: str, permission_mode: str, rule: bool) -> None:
    """A light command (``cat /proc/self/cgroup``) never goes through hostrun and gets no answer
    from it; a heavy one (``make check``) runs in a job's cgroup in wrap and guard wherever the
    client permits it (in guard: the line the refusal gives, run next), directly in remind, and
    nowhere where the client would have to ask; and whatever the model is told never says a command
    ran that did not. ``user-allows``: ``Bash(make:*)`` and hostrun's own line allowed in the user's
    settings, as docs/agents.md advises for guard."""
    tree = project(hostrun, tmp_path, mode)
    (tree / "Makefile").write_text("check:\n\tcat /proc/self/cgroup > ran.txt\n")
    if rule:
        _user_allows(claude, "Bash(make:*)", f"Bash({sys.executable}:*)")
    api.script = [("bash", "cat /proc/self/cgroup"), ("bash", "make check"),
                  ("bash", _instead_line) if mode == "guard" else ("text", "done"), ("text", "done")]
    _headless(claude, api, tree, permission_mode)
    requests = api.main_requests()
    assert len(requests) >= 3, [r.get("messages", [])[-1:] for r in requests]
    light = json.dumps(requests[1]["messages"][-2:])  # the light command's result
    assert "hostrun" not in light and f"{hostrun.cgroup}/job-" not in light, light[-1500:]
    told = api.sent_text()
    where = _where(hostrun, tree / "ran.txt")
    assert where == _expected(mode, permission_mode, rule), told[-2500:]
    assert "this command is heavy: make" in told or mode == "guard", told[-2500:]
    if mode == "guard":
        assert INSTEAD in told and "--long-job-rule" in told, told[-2500:]
    if where == "nowhere":
        assert "runs under a memory cap" not in told and "it ran" not in told, told[-2500:]
    assert hostrun.bookings() == []


def test_a_job_over_its_cap_reaches_the_model_as_250_with_its_alert(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """The model runs a job through hostrun itself, which outgrows its cap: the command fails with
    250 (the client reports the exit code) and the job's alert, the kill and what to do, arrives
    with that failure (PostToolUseFailure), in the same turn."""
    tree = project(hostrun, tmp_path, "wrap")
    line = " ".join([*hostrun.argv("-m", "100M", "--label", "over-its-cap", "--"), sys.executable,
                     "-c", "'x = bytearray(300 << 20)'"])
    api.script = [("bash", line), ("text", "done")]
    _headless(claude, api, tree, "bypassPermissions")
    told = api.sent_text()
    assert f"Exit code {int(ExitCode.OWN_CAP)}" in told, told[-2500:]
    alert = told.rsplit(f"Exit code {int(ExitCode.OWN_CAP)}", 1)[1]
    assert "over-its-cap" in alert and "cap" in alert, told[-2500:]
    assert hostrun.bookings() == [] and hostrun.job_dirs() == []


@pytest.mark.parametrize("mode", MODES)
def test_a_subagents_whole_suite_is_refused_even_through_hostrun(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path, mode: str) -> None:
    """A subagent (the client's Agent tool) runs ``make check`` through hostrun with every
    permission granted: refused in every mode, remind included (docs/agents.md: remind refuses in a
    subagent as every mode does), with the advice to run what it changed. The main agent's own
    ``make check`` then goes where its mode sends it: as written in remind, in a job's cgroup in
    wrap, nowhere in guard (refused with the line to run instead)."""
    tree = project(hostrun, tmp_path, mode)
    (tree / "Makefile").write_text("check:\n\tcat /proc/self/cgroup >> ran.txt\n")
    api.script = [("agent", "run the whole suite"), ("bash", "make check"), ("text", "done")]
    api.subagent_script = [("bash", " ".join(hostrun.argv("--", "make", "check"))), ("text", "sub done")]
    _headless(claude, api, tree, "bypassPermissions")
    sub = api.subagent_text()
    assert "whole test suite" in sub and "sub done" in api.sent_text(), sub[-2500:]
    ran = tree / "ran.txt"
    runs = ran.read_text().strip().splitlines() if ran.exists() else []
    jobs = [line for line in runs if f"{hostrun.cgroup}/job-" in line]
    # the main agent's run only (one "memory" line per run of `cat /proc/self/cgroup`)
    expected = {"remind": (1, 0), "wrap": (1, 1), "guard": (0, 0)}[mode]
    assert (len([line for line in runs if "memory" in line]), len(jobs)) == expected, (runs, sub[-1500:])


def test_a_declared_direct_run_goes_through_guard_and_an_incomplete_one_is_told_what_it_lacks(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """guard's scope declaration, as a person writes it in front of a line: complete, the command
    runs as written, outside any job; without its extent, refused with what it lacks."""
    tree = project(hostrun, tmp_path, "guard")
    (tree / "Makefile").write_text("check:\n\tcat /proc/self/cgroup > ran-$(N).txt\n")
    declared = ('HOSTRUN_DIRECT="kind=build; target=the check target; extent=one run, ~1 s; '
                'reason=bisecting a flaky step by hand" make check N=1')
    lacking = 'HOSTRUN_DIRECT="kind=build; target=the check target; reason=bisecting by hand" make check N=2'
    api.script = [("bash", declared), ("bash", lacking), ("text", "done")]
    _headless(claude, api, tree, "bypassPermissions")
    assert _where(hostrun, tree / "ran-1.txt") == "direct"
    assert not (tree / "ran-2.txt").exists()
    told = api.sent_text()
    assert "direct run let through, as declared" in told and "has no extent" in told, told[-2500:]


def test_a_script_written_and_run_in_one_line_is_judged_by_what_it_writes(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """``printf … > build.sh && sh build.sh``: the script does not exist when the hook decides, yet
    its heavy line is read from the command that writes it; guard refuses, and the line it gives
    runs the whole thing in a job's cgroup."""
    tree = project(hostrun, tmp_path, "guard")
    (tree / "Makefile").write_text("all:\n\tcat /proc/self/cgroup > ran.txt\n")
    api.script = [("bash", "printf 'make -j2\\n' > build.sh && sh build.sh"), ("bash", _instead_line),
                  ("text", "done")]
    _headless(claude, api, tree, "bypassPermissions")
    told = api.sent_text()
    assert "written in this command" in told, told[-2500:]
    assert _where(hostrun, tree / "ran.txt") == "job", told[-2500:]


def test_an_alert_reaches_the_resumed_session(
        hostrun: Hostrun, claude: Claude, api: FakeMessagesAPI, tmp_path: Path) -> None:
    """A session ends; one of its jobs is killed at its cap afterwards (a job of a session that is
    gone). ``claude -p --resume`` is told at its SessionStart (``resume``), and the alert is then
    read: it is not told again."""
    tree = project(hostrun, tmp_path, "wrap")
    api.script = [("text", "first")]
    session = str(_headless(claude, api, tree, "default")["session_id"])
    proc = hostrun.run("-m", "100M", "--label", "while-away", "--session", f"claude-{session}", "--",
                       sys.executable, "-c", "x = bytearray(300 << 20)")
    assert proc.returncode == ExitCode.OWN_CAP, proc.stderr
    api.script = [("text", "first"), ("text", "resumed")]
    _headless(claude, api, tree, "default", "--resume", session)
    assert "while-away" in api.sent_text(), api.sent_text()[-2500:]
    unread = hostrun.run("alerts", "--unread", "--session", f"claude-{session}")
    assert "while-away" not in unread.stdout, unread.stdout
