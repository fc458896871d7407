"""``hostrun hook`` (Claude Code's hooks), the ``[agents]`` table and ``hostrun agents``.

The events are the recorded ones in tests/recorded/claude (written from the published hooks
reference); every answer is checked against the documented output fields by ``schema_problems``
below (the test's own check, independent of the self-test's). Fast tests run the hook in process
with the resource table's reading replaced; the tests with the ``hostrun`` fixture run the real
thing: a real ledger, real jobs, the rewritten command run with ``bash -c``.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.errors import ConfigError
from dispatch.core.exitcodes import ExitCode
from dispatch.hooks import claude, claudealerts, install, permissions, selftest, table
from dispatch.placement import alerts
from dispatch.placement.reports import HostReading
from tests.conftest import Hostrun, wait_for
from tests.support.claude import ROOT, event, real_hook

GIB = 1 << 30

# hookSpecificOutput per event, as the hooks reference documents it
OUTPUT_FIELDS = {
    "PreToolUse": {"hookEventName": str, "permissionDecision": str, "permissionDecisionReason": str,
                   "updatedInput": dict, "additionalContext": str},
    "SessionStart": {"hookEventName": str, "additionalContext": str},
    "PostToolUse": {"hookEventName": str, "additionalContext": str},
    "PostToolUseFailure": {"hookEventName": str, "additionalContext": str},
}


def schema_problems(event: str, answer: Any) -> list[str]:
    problems = []
    if event == "Stop":  # Stop's decision control: top-level decision "block" and a reason
        if set(answer) != {"decision", "reason"} or answer["decision"] != "block":
            problems.append(f"Stop answer {answer!r}")
        if not isinstance(answer.get("reason"), str) or not answer["reason"]:
            problems.append("reason")
        return problems
    if set(answer) != {"hookSpecificOutput"}:
        problems.append(f"top-level keys {sorted(answer)}")
    out = answer.get("hookSpecificOutput", {})
    for key, value in out.items():
        kind = OUTPUT_FIELDS[event].get(key)
        if kind is None or not isinstance(value, kind):
            problems.append(f"{key}={value!r}")
    if out.get("hookEventName") != event:
        problems.append("hookEventName")
    if "permissionDecision" in out and out["permissionDecision"] not in ("allow", "deny", "ask"):
        problems.append("permissionDecision")
    return problems


def cap_of(command: str) -> str | None:
    """The ``-m`` value of a rewritten line (after ``python -m dispatch``'s own ``-m``)."""
    words = shlex.split(command)
    words = words[words.index("dispatch") + 1 : words.index("--")]
    return words[words.index("-m") + 1] if "-m" in words else None


def fake_readings(peak: int = 0, peer_down: bool = True) -> list[HostReading]:
    local = {"load": [1.5, 1.0, 1.0], "cores": 16, "heavy_threads": 16, "threads_free": 14,
             "memory": {"total": 64 * GIB, "available": 40 * GIB, "available_for_jobs": 30 * GIB},
             "slice": {"limit": 48 * GIB, "free": 20 * GIB}, "queue_length": 2, "running": [{}],
             "gpus": [{"index": 0, "total": 80 * GIB, "free": 70 * GIB}], "gpu_error": None,
             "label_peak": {"max_peak": peak} if peak else None}
    readings = [HostReading("local", local, None, 0.1)]
    if peer_down:
        readings.append(HostReading("box2", None, "ssh: connect to host box2: Connection refused", 0.2))
    return readings


class Hook:
    """The hook in process: a private config, the table's reading replaced."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp, self.config = tmp, tmp / "hosts.toml"
        self.project = tmp / "proj"
        (self.project / "sub").mkdir(parents=True)
        (self.project / ".git").mkdir()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "cache"))
        self.home = tmp / "home"  # Claude Code's user settings live here: none unless a test writes them
        monkeypatch.setenv("HOME", str(self.home))
        monkeypatch.delenv("CLAUDE_PROJECT_DIR", raising=False)
        monkeypatch.setattr(permissions, "MANAGED", str(tmp / "managed-settings.json"))
        monkeypatch.delenv("HOSTRUN_JOB", raising=False)
        monkeypatch.delenv("CLAUDE_ENV_FILE", raising=False)
        self.readings = fake_readings()
        self.read_calls = 0

        def read(settings: Any, label: str | None = None) -> list[HostReading]:
            self.read_calls += 1
            return self.readings

        monkeypatch.setattr(table, "read", read)
        self.configure("")

    def configure(self, agents: str) -> None:
        self.config.write_text(f'state_dir = "{self.tmp}/state"\n[agents]\n{agents}\n')

    def __call__(self, data: Any, *argv: str) -> tuple[Any, str]:
        stdin = data if isinstance(data, str) else json.dumps(data)
        out, err = io.StringIO(), io.StringIO()
        assert claude.main([*argv, "--config", str(self.config)], io.StringIO(stdin), out, err) == 0
        text = out.getvalue()
        return (json.loads(text) if text else None), err.getvalue()

    def bash(self, command: str, *argv: str, name: str = "pre_tool_use_bash", **changes: Any
             ) -> tuple[Any, str]:
        return self(event(name, command=command, cwd=str(self.project), **changes), "pre-tool-use", *argv)


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Hook:
    return Hook(tmp_path, monkeypatch)


# -------------------------------------------------------------------- [agents] config
def test_agents_table_is_read_and_checked(hook: Hook) -> None:
    from dispatch.config import load_settings

    hook.configure('mode = "guard"\nheavy = ["./scripts/slow-*"]\nlight = ["make docs"]\nescape_min = 20')
    agents = load_settings(str(hook.config)).agents
    assert (agents.mode, agents.heavy, agents.light, agents.escape_min) == \
        ("guard", ("./scripts/slow-*",), ("make docs",), 20)
    for bad, named in (('mode = "block"', "agents.mode"), ("heavy = [\"\"]", "agents.heavy"),
                       ("typo = 1", "agents.typo: unknown key"), ("escape_min = 0", "agents.escape_min"),
                       ('escape_env = "A B"', "agents.escape_env")):
        hook.configure(bad)
        with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
            load_settings(str(hook.config))


def test_unknown_agents_key_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "hosts.toml"
    config.write_text('[agents]\nmode = "remind"\nheavvy = ["x"]\n')
    proc = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(config), "agents", "status",
                           "--no-round-trip"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                               "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"hostrun: error: {config}: agents.heavvy: unknown key"


# -------------------------------------------------------------------- PreToolUse
@pytest.mark.parametrize("mode", ["remind", "wrap", "guard"])
@pytest.mark.parametrize("command", ["git status", "cargo --version", "ls -la | wc -l", "cargo fmt",
                                     "pytest --collect-only -q", "rg -n TODO src/"])
def test_light_commands_get_no_answer_in_every_mode(hook: Hook, mode: str, command: str) -> None:
    assert hook.bash(command, "--mode", mode) == (None, "")
    assert hook.read_calls == 0  # the light path reads no report


def test_remind_adds_the_resource_table_and_never_refuses(hook: Hook) -> None:
    hook.configure('mode = "remind"')
    answer, err = hook.bash("cargo test --workspace 2>&1 | tail -20")
    assert err == "" and schema_problems("PreToolUse", answer) == []
    out = answer["hookSpecificOutput"]
    assert set(out) == {"hookEventName", "additionalContext"}  # passes unchanged
    context = out["additionalContext"]
    assert "cargo test --workspace [heavy: cargo test]" in context
    assert ("- local: load 1.5 on 16 cores, 14 of 16 heavy threads free, memory available 30.0 GiB, "
            "slice 20.0 GiB free of 48.0 GiB, 2 queued, 1 running, GPUs: 0: 70.0 GiB free of 80.0 GiB"
            ) in context
    assert "- box2: could not read: ssh: connect to host box2: Connection refused" in context


def test_remind_for_a_gpu_command_and_a_command_already_through_hostrun(hook: Hook) -> None:
    hook.configure('mode = "remind"')
    answer, _ = hook.bash("CUDA_VISIBLE_DEVICES=0 python3 finetune.py")
    assert "[gpu: CUDA_VISIBLE_DEVICES=" in answer["hookSpecificOutput"]["additionalContext"]
    answer, _ = hook.bash("hostrun -m 4G -- cargo build", "--mode", "guard")
    assert set(answer["hookSpecificOutput"]) == {"hookEventName", "additionalContext"}


def test_wrap_rewrites_a_heavy_command_through_hostrun(hook: Hook) -> None:
    original = "cd sub && FOO='a b' cargo test --workspace 2>&1 | tail -20"
    answer, err = hook.bash(original, "--mode", "wrap")
    assert err == "" and schema_problems("PreToolUse", answer) == []
    out = answer["hookSpecificOutput"]
    assert out["permissionDecision"] == "ask"  # the user sees the rewritten command
    new = out["updatedInput"]
    assert new["description"] == "Run the workspace tests" and new["timeout"] == 600000  # kept
    words = shlex.split(new["command"])
    assert words[words.index("--") + 1:] == ["bash", "-c", original]
    assert words[:3] == [sys.executable, "-m", "dispatch"]
    assert words[words.index("--session") + 1] == "claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e"
    assert words[words.index("--label") + 1] == "proj:cargo-test"
    assert words[words.index("--config") + 1] == str(hook.config)
    assert cap_of(new["command"]) is None  # no history for the label yet
    assert new["command"] in out["additionalContext"]


def test_wrap_caps_by_the_half_rule_on_the_labels_history(hook: Hook) -> None:
    hook.readings = fake_readings(peak=3 * GIB + 1)  # worst peak: just over 3 GiB
    answer, _ = hook.bash("make -j8", "--mode", "wrap", permission_mode="bypassPermissions")
    out = answer["hookSpecificOutput"]
    assert out["permissionDecision"] == "allow"  # the user already skips every prompt
    assert cap_of(out["updatedInput"]["command"]) == "6656M"  # 2 x peak, rounded up to 512 MiB
    hook.readings = fake_readings(peak=40 * GIB)  # the half-rule cap would not fit the 48 GiB slice
    answer, _ = hook.bash("make -j8", "--mode", "wrap")
    assert cap_of(answer["hookSpecificOutput"]["updatedInput"]["command"]) is None


def test_guard_refuses_with_the_exact_command_to_run_instead(hook: Hook) -> None:
    hook.configure('mode = "guard"')
    answer, err = hook.bash("cargo build --release")
    assert err == "" and schema_problems("PreToolUse", answer) == []
    out = answer["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"
    instead = out["permissionDecisionReason"].splitlines()[1]
    assert shlex.split(instead)[-3:] == ["bash", "-c", "cargo build --release"]
    assert "--label proj:cargo-build" in instead
    assert "HOSTRUN_DIRECT" not in out["permissionDecisionReason"]  # the escape is for people
    assert "- local: load" in out["additionalContext"]


DECLARED = "kind=build; target=the parser crate; extent=one build, ~3 min; reason={reason}"


def test_guard_is_the_default_and_a_direct_run_needs_a_whole_scope_declaration(hook: Hook) -> None:
    """The design's guard: a heavy command runs directly only with a scope declaration (kind
    matching the command, target, extent, and a reason longer than 12 characters)."""
    answer, _ = hook.bash("make -j8")  # no [agents] mode: guard
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    for given, lacking in [
            ('"quick"', "no kind, no target, no extent, a reason of 5 characters (more than 12 needed)"),
            ('"bisecting a miscompile by hand"', "no kind, no target, no extent"),
            (f'"{DECLARED.format(reason="exactly 12 c")}"', "a reason of 12 characters (more than 12"),
            (f'"{DECLARED.format(reason="a bisect by hand").replace("kind=build", "kind=test")}"',
             "kind=test, but this command is a build"),
            (f'"{DECLARED.format(reason="x" * 20).replace("target=the parser crate; ", "")}"',
             "no target")]:
        answer, _ = hook.bash(f"HOSTRUN_DIRECT={given} make -j8")
        out = answer["hookSpecificOutput"]
        assert out["permissionDecision"] == "deny", given
        assert lacking in out["permissionDecisionReason"], out["permissionDecisionReason"]
    for line in (f'HOSTRUN_DIRECT="{DECLARED.format(reason="bisecting a miscompile by hand")}" make',
                 f"export HOSTRUN_DIRECT='{DECLARED.format(reason='profiling with perf')}'; make"):
        answer, _ = hook.bash(line)
        out = answer["hookSpecificOutput"]
        assert "permissionDecision" not in out
        assert out["additionalContext"].startswith("hostrun guard: direct run let through, as declared")


def test_guard_inside_a_subagent_always_refuses(hook: Hook) -> None:
    hook.configure('mode = "guard"')
    answer, _ = hook.bash(f'HOSTRUN_DIRECT="{DECLARED.format(reason="a person asked for this")}" make -j8',
                          name="pre_tool_use_subagent")
    out = answer["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"
    assert "Inside a subagent heavy work always runs through hostrun" in out["permissionDecisionReason"]
    assert schema_problems("PreToolUse", answer) == []


def test_project_patterns_from_the_agents_table(hook: Hook) -> None:
    (hook.project / "scripts").mkdir()
    hook.configure('mode = "guard"\nheavy = ["./scripts/slow-*"]\nlight = ["make docs"]')
    answer, _ = hook.bash("./scripts/slow-suite --all")
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert hook.bash("make docs") == (None, "")


# -------------------------------------------------------------------- SessionStart
@pytest.mark.parametrize("name", ["session_start_startup", "session_start_compact"])
def test_session_start_names_the_session_and_exports_it_once(hook: Hook, name: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = hook.tmp / "claude-env"
    env_file.write_text("export OTHER=1\n")
    monkeypatch.setenv("CLAUDE_ENV_FILE", str(env_file))
    data = event(name, cwd=str(hook.project))
    for _ in range(2):
        answer, err = hook(data, "session-start")
        assert err == "" and schema_problems("SessionStart", answer) == []
    context = answer["hookSpecificOutput"]["additionalContext"]
    assert "This session is hostrun session claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e" in context
    assert env_file.read_text() == \
        "export OTHER=1\nexport HOSTRUN_SESSION=claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e\n"
    # the event name from the JSON alone is enough
    assert hook(data)[0] == answer


# -------------------------------------------------------------------- never block the agent
@pytest.mark.parametrize("stdin,argv,said", [
    ("", ["pre-tool-use"], "no event on stdin"),
    ("{not json", ["pre-tool-use"], "not JSON"),
    ("[1, 2]", ["pre-tool-use"], "no event on stdin"),
    (json.dumps(event("pre_tool_use_read")), ["pre-tool-use"], "tool 'Read' is not Bash"),
    (json.dumps({**event("pre_tool_use_bash"), "tool_input": {}}), ["pre-tool-use"], "no tool_input.command"),
    (json.dumps({**event("pre_tool_use_bash"), "tool_input": "make"}), ["pre-tool-use"],
     "no tool_input.command"),
    (json.dumps({**event("pre_tool_use_bash"), "hook_event_name": "Notification"}), [],
     "event 'Notification' is not handled"),
    (json.dumps(event("pre_tool_use_bash")), ["session-start"], "called for SessionStart but the event"),
    (json.dumps(event("pre_tool_use_bash")), ["pre-tool-use", "--mode", "block"], "--mode must be one of"),
    (json.dumps(event("pre_tool_use_bash")), ["notification"], "unknown event 'notification'"),
    (json.dumps(event("pre_tool_use_bash")), ["post-tool-use"], "called for PostToolUse but the event"),
    (json.dumps({**event("post_tool_use_bash"), "session_id": ""}), ["post-tool-use"], "no session_id"),
    (json.dumps({**event("stop"), "session_id": 7}), ["stop"], "no session_id"),
    (json.dumps({**event("session_start_compact"), "session_id": None}), ["session-start"], "no session_id"),
])
def test_malformed_input_gives_no_answer_and_one_line(hook: Hook, stdin: str, argv: list[str],
                                                      said: str) -> None:
    answer, err = hook(stdin, *argv)
    assert answer is None
    assert err.count("\n") == 1 and said in err and err.startswith("hostrun hook: ")


def test_a_broken_config_does_not_block_and_is_told_once(hook: Hook) -> None:
    """Never a block because of hostrun itself; but not silent either: the first event after the
    problem appears tells the user (``systemMessage``), once; guard mode says it is off."""
    hook.configure('mode = "block"')
    answer, err = hook.bash("cargo build")
    assert "agents.mode" in err and err.count("\n") == 1
    assert answer is not None and set(answer) == {"systemMessage"}
    assert "configuration is broken" in answer["systemMessage"] and "agents.mode" in answer["systemMessage"]
    assert "hooks do nothing until it is fixed" in answer["systemMessage"]
    assert hook.bash("cargo build")[0] is None  # told once
    assert hook(event("post_tool_use_bash"), "post-tool-use")[0] is None
    hook.configure('mode = "guarded"')  # another problem: told again, and in guard mode, that it is off
    answer, _ = hook.bash("cargo build", "--mode", "guard")
    assert answer is not None and "guard mode is OFF" in answer["systemMessage"]


def test_hook_process_never_tracebacks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "c")}
    for stdin in ("", "\x00\xff garbage", json.dumps({"tool_name": "Bash", "tool_input": {"command": 5}})):
        proc = subprocess.run([sys.executable, "-m", "dispatch", "hook", "pre-tool-use"], input=stdin,
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert (proc.returncode, proc.stdout) == (0, "")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


# -------------------------------------------------------------------- alerts: SessionStart, PostToolUse, Stop
SESSION = "claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e"  # the recorded events' session


def alert(hook: Hook, label: str, session: str | None = SESSION) -> None:
    """An own-cap alert as the runner writes it, into the hook's own state dir."""
    from dispatch.config import load_settings

    path = load_settings(str(hook.config)).alerts_path
    assert alerts.write(path, alerts.record(
        "own-cap", host="local", label=label, session=session, command=f"cargo test -p {label}",
        action=f"hostrun -m 1G --label {label} -- cargo test -p {label}",
        message=f"job {label} on local was killed at its own cap 512 MiB"), print)


def post(hook: Hook, name: str = "post_tool_use_bash") -> tuple[Any, str]:
    return hook(event(name, cwd=str(hook.project)), "post-tool-use")


def stop(hook: Hook, active: bool = False) -> tuple[Any, str]:
    return hook(event("stop", cwd=str(hook.project), stop_hook_active=active), "stop")


def context(answer: Any) -> str:
    return str(answer["hookSpecificOutput"]["additionalContext"])


def test_post_tool_use_delivers_each_unread_alert_once(hook: Hook) -> None:
    assert post(hook) == (None, "")  # nothing unread: no answer, nothing said
    alert(hook, "hog")
    alert(hook, "theirs", session="claude-someone-else")
    alert(hook, "everyone", session=None)  # addressed to every session
    answer, err = post(hook)
    assert err == "" and schema_problems("PostToolUse", answer) == []
    said = context(answer)
    assert said.startswith("hostrun: 2 new alerts for this session")
    assert f"own-cap [session {SESSION}]: job hog on local was killed" in said
    assert "hostrun -m 1G --label hog" in said and "everyone" in said and "theirs" not in said
    assert post(hook) == (None, "")  # not again
    alert(hook, "hog-2")
    said = context(post(hook)[0])
    assert "job hog-2 on" in said and "job hog on" not in said


def test_a_subagents_tool_call_leaves_the_alerts_for_the_main_agent(hook: Hook) -> None:
    assert post(hook) == (None, "")
    alert(hook, "hog")
    assert post(hook, "post_tool_use_subagent") == (None, "")
    assert "hog" in context(post(hook)[0])


def test_pre_tool_use_delivers_no_alerts(hook: Hook) -> None:
    alert(hook, "hog")
    answer, _ = hook.bash("cargo build")
    assert "hog" not in context(answer)
    assert "hog" in context(post(hook)[0])


def test_stop_blocks_once_with_the_alerts_and_never_while_stop_hook_active(hook: Hook) -> None:
    assert stop(hook) == (None, "")
    alert(hook, "hog")
    assert stop(hook, active=True) == (None, "")  # already continuing: never block again
    answer, err = stop(hook)
    assert err == "" and schema_problems("Stop", answer) == []
    assert answer["reason"].startswith("hostrun: 1 alert for this session arrived while you worked")
    assert "job hog on local was killed" in answer["reason"] and "-m 1G" in answer["reason"]
    assert stop(hook) == (None, "")  # once
    assert post(hook) == (None, "")  # and not again elsewhere


def test_session_start_after_compaction_shows_unread_alerts_once(hook: Hook) -> None:
    alert(hook, "hog")
    alert(hook, "theirs", session="claude-someone-else")
    data = event("session_start_compact", cwd=str(hook.project))
    answer, _ = hook(data, "session-start")
    assert schema_problems("SessionStart", answer) == []
    said = context(answer)
    assert "Unread hostrun alert for this session (1;" in said and "job hog on local" in said
    assert "theirs" not in said
    again, _ = hook(data, "session-start")
    assert "alert" not in context(again) and post(hook) == (None, "")


def test_many_alerts_show_the_latest_and_say_where_the_rest_are(hook: Hook) -> None:
    assert post(hook) == (None, "")
    for i in range(claudealerts.MAX_ALERTS + 3):
        alert(hook, f"job{i:02d}")
    said = context(post(hook)[0]).splitlines()
    assert said[0].startswith(f"hostrun: {claudealerts.MAX_ALERTS + 3} new alerts")
    assert said[1] == f"- (3 older ones: `hostrun alerts --session {SESSION}`)"
    assert "job03" in said[2] and "job22" in said[-1] and len(said) == claudealerts.MAX_ALERTS + 2
    alert(hook, "x" * 3000)  # a huge label: its line is cut, the answer stays whole
    (line,) = context(post(hook)[0]).splitlines()[1:]
    assert line.endswith("...") and len(line) == claudealerts.MAX_ALERT_LINE + 2


def test_an_unusable_alert_cursor_is_one_line_and_no_answer(hook: Hook) -> None:
    from dispatch.config import load_settings

    assert post(hook) == (None, "")
    alert(hook, "hog")
    cursor = Path(alerts.cursor_path(load_settings(str(hook.config)), SESSION))
    cursor.chmod(0o644)
    for answer, err in (post(hook), stop(hook)):
        assert answer is None and err.count("\n") == 1 and "could not read the alerts" in err
    cursor.chmod(0o600)
    assert "hog" in context(post(hook)[0])  # still unread


# -------------------------------------------------------------------- agents install / uninstall
def agents(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``hostrun agents ...`` with this virtualenv's ``bin`` (its ``hostrun``) first on PATH, as after
    ``./scripts/setup`` and activating it: installed commands that say ``hostrun`` then work."""
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home), "XDG_CACHE_HOME": str(home / "c"),
           "PATH": path}
    return subprocess.run([sys.executable, "-m", "dispatch", "agents", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60)


CMD = f"{shlex.quote(sys.executable)} -m dispatch"  # how an install from `python -m dispatch` calls it


def test_install_is_idempotent_and_keeps_other_hooks_and_keys(tmp_path: Path) -> None:
    project, home = tmp_path / "proj", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    home.mkdir()
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    theirs = {"model": "opus", "permissions": {"allow": ["Bash(git status)"]}, "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify.sh"}]}]}}
    settings.write_text(json.dumps(theirs))
    settings.chmod(0o640)
    assert agents("install", "claude-code", "--mode", "wrap", cwd=project / "src", home=home).returncode == 0
    first = settings.read_text()
    data = json.loads(first)
    assert data["model"] == "opus" and data["permissions"] == theirs["permissions"]
    assert data["hooks"]["Stop"] == [*theirs["hooks"]["Stop"], {"hooks": [
        {"type": "command", "command": f"{CMD} hook stop --mode wrap", "timeout": 30},
        {"type": "command", "command": f"{CMD} hook rewake --mode wrap", "timeout": 3600,
         "asyncRewake": True}]}]
    assert data["hooks"]["PostToolUse"] == [{"hooks": [
        {"type": "command", "command": f"{CMD} hook post-tool-use --mode wrap", "timeout": 10}]}]
    assert data["hooks"]["PreToolUse"][0] == theirs["hooks"]["PreToolUse"][0]
    assert data["hooks"]["PreToolUse"][1] == {"matcher": "Bash", "hooks": [
        {"type": "command", "command": f"{CMD} hook pre-tool-use --mode wrap", "timeout": 60}]}
    assert data["hooks"]["SessionStart"] == [{"hooks": [
        {"type": "command", "command": f"{CMD} hook session-start --mode wrap", "timeout": 30}]}]
    assert settings.stat().st_mode & 0o777 == 0o640
    again = agents("install", "claude-code", "--mode", "wrap", cwd=project, home=home)
    assert again.returncode == 0 and "already installed" in again.stderr
    assert settings.read_text() == first
    # another mode replaces ours where it stands
    assert agents("install", "claude-code", cwd=project, home=home).returncode == 0
    data = json.loads(settings.read_text())
    assert data["hooks"]["PreToolUse"][1]["hooks"][0]["command"] == f"{CMD} hook pre-tool-use"
    assert len(data["hooks"]["SessionStart"]) == 1
    status = agents("status", "--json", cwd=project, home=home)
    places = json.loads(status.stdout)["installed"]
    assert places[0]["hooks"] == {"PreToolUse": [f"{CMD} hook pre-tool-use"],
                                  "SessionStart": [f"{CMD} hook session-start"],
                                  "PostToolUse": [f"{CMD} hook post-tool-use"],
                                  "PostToolUseFailure": [f"{CMD} hook post-tool-use-failure"],
                                  "Stop": [f"{CMD} hook stop", f"{CMD} hook rewake"]}
    assert len(data["hooks"]["Stop"]) == 2 and len(data["hooks"]["PostToolUse"]) == 1
    assert places[1] == {"scope": "local", "path": str(project / ".claude" / "settings.local.json"),
                         "hooks": {}, "error": None, "real_run": []}
    assert places[2] == {"scope": "user", "path": str(home / ".claude" / "settings.json"), "hooks": {},
                         "error": None, "real_run": []}
    assert [r["ok"] for r in places[0]["real_run"]] == [True] * (len(install.EVENTS) + 1)
    assert agents("uninstall", "claude-code", cwd=project, home=home).returncode == 0
    assert json.loads(settings.read_text()) == theirs
    assert agents("uninstall", "claude-code", cwd=project, home=home).returncode == 0
    assert json.loads(settings.read_text()) == theirs


def test_an_older_install_gains_the_new_entries_on_reinstall(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    older = {"hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [
            {"type": "command", "command": "hostrun hook pre-tool-use", "timeout": 60}]}],
        "SessionStart": [{"hooks": [{"type": "command", "command": "hostrun hook session-start",
                                     "timeout": 30}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify.sh"}]}]}}
    settings.write_text(json.dumps(older))
    status = agents("status", cwd=tmp_path, home=home)
    assert status.returncode == 0, status.stdout + status.stderr
    assert ("(missing PostToolUse, PostToolUseFailure, Stop: run 'hostrun agents install' again)"
            in status.stdout)
    assert agents("install", "claude-code", "--user", "--command", "hostrun", cwd=tmp_path,
                  home=home).returncode == 0
    data = json.loads(settings.read_text())
    assert data["hooks"]["PreToolUse"] == older["hooks"]["PreToolUse"]
    assert data["hooks"]["SessionStart"] == older["hooks"]["SessionStart"]
    assert data["hooks"]["Stop"] == [*older["hooks"]["Stop"], {"hooks": [
        {"type": "command", "command": "hostrun hook stop", "timeout": 30},
        {"type": "command", "command": "hostrun hook rewake", "timeout": 3600, "asyncRewake": True}]}]
    assert data["hooks"]["PostToolUse"] == [{"hooks": [
        {"type": "command", "command": "hostrun hook post-tool-use", "timeout": 10}]}]
    again = agents("install", "claude-code", "--user", "--command", "hostrun", cwd=tmp_path, home=home)
    assert again.returncode == 0 and "already installed" in again.stderr
    assert "missing" not in agents("status", cwd=tmp_path, home=home).stdout
    assert agents("uninstall", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert json.loads(settings.read_text()) == {"hooks": {"Stop": older["hooks"]["Stop"]}}


def test_agents_status_exits_78_when_a_hook_does_not_deliver(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "hosts.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(table, "read", lambda settings, label=None: fake_readings())
    assert install.status(["--config", str(config)]) == 0
    assert capsys.readouterr().out.count("self-test ok") == 15
    monkeypatch.setattr(claudealerts, "alert_lines", lambda *args: [])  # alerts never delivered
    assert install.status(["--config", str(config)]) == ExitCode.NOT_RUN == 78
    out = capsys.readouterr().out
    assert "self-test FAIL after a tool, an alert: delivered: no answer" in out
    assert "self-test FAIL stop with an unread alert: blocks once: no answer" in out
    assert not (tmp_path / "state" / "alerts.jsonl").exists()  # the samples' alerts stay private


def test_install_user_creates_a_private_file_and_uninstall_restores_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    settings = home / ".claude" / "settings.json"
    assert settings.stat().st_mode & 0o777 == 0o600
    assert (home / ".claude").stat().st_mode & 0o777 == 0o700
    assert install.installed(json.loads(settings.read_text())).keys() == {
        "PreToolUse", "SessionStart", "PostToolUse", "PostToolUseFailure", "Stop"}
    assert agents("uninstall", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert not settings.exists() and not (home / ".claude").exists()  # as before the install


USERS_OWN = """{
    "theme": "dark",
    "hooks": {
        "Stop": []
    },
    "permissions": {"allow": ["Bash(ls:*)"]}
}
"""


@pytest.mark.parametrize("text", [USERS_OWN, '{\n\t"hooks": {}\n}\n', "{}"])
def test_uninstall_gives_the_file_back_byte_for_byte(tmp_path: Path, text: str) -> None:
    """Before, uninstall re-indented a 4-space or tab file to 2 spaces and removed the user's own
    empty ``"hooks": {}`` or ``"Stop": []``. Now the install remembers the text, and uninstall,
    finding only the install's own change, puts it back as it was."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    settings = home / ".claude" / "settings.json"
    settings.write_text(text)
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    installed_text = settings.read_text()
    assert "hook rewake" in installed_text
    if "    " in text:
        assert '\n    "hooks": {' in installed_text  # the install kept the file's indentation too
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert agents("uninstall", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert settings.read_text() == text


def test_uninstall_after_the_user_edited_the_file_removes_only_ours(tmp_path: Path) -> None:
    """A file changed since the install cannot be put back: our entries go, the user's edit and the
    file's indentation stay."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    settings = home / ".claude" / "settings.json"
    settings.write_text(USERS_OWN)
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    data = json.loads(settings.read_text())
    data["model"] = "sonnet"
    settings.write_text(json.dumps(data, indent=4) + "\n")
    assert agents("uninstall", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    after = settings.read_text()
    assert json.loads(after)["model"] == "sonnet" and "hostrun" not in after
    assert '\n    "theme": "dark"' in after


def test_install_through_a_symlink_writes_the_target(tmp_path: Path) -> None:
    home, dotfiles = tmp_path / "home", tmp_path / "dotfiles"
    (home / ".claude").mkdir(parents=True)
    dotfiles.mkdir()
    (dotfiles / "claude.json").write_text('{"theme": "dark"}')
    (home / ".claude" / "settings.json").symlink_to(dotfiles / "claude.json")
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert (home / ".claude" / "settings.json").is_symlink()
    assert json.loads((dotfiles / "claude.json").read_text())["theme"] == "dark"


@pytest.mark.parametrize("content,said", [("{hooks: 1", "not valid JSON"), ("[]", "not a JSON object"),
                                          ('{"hooks": []}', "'hooks' is not an object"),
                                          ('{"hooks": {"Stop": {}}}', "hooks.Stop is not a list")])
def test_install_refuses_a_settings_file_it_cannot_read(tmp_path: Path, content: str, said: str) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(content)
    for action in ("install", "uninstall"):
        proc = agents(action, "claude-code", cwd=tmp_path, home=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"hostrun: error: {settings}: {said}") and proc.stderr.count("\n") == 1
        assert settings.read_text() == content


def test_install_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in (["install"], ["install", "cursor"], ["install", "claude-code", "--user", "--project"],
                 ["install", "claude-code", "--mode", "block"], ["frobnicate"]):
        proc = agents(*args, cwd=tmp_path, home=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, args


def test_wrapped_command_runs_through_hostrun_with_its_exit_code_and_cwd(hostrun: Hostrun,
                                                                       tmp_path: Path) -> None:
    hostrun.configure(slice="1G", top='[agents]\nmode = "wrap"\nheavy = ["pwd"]')
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    original = "cd sub && pwd > where.txt && FOO=kept sh -c 'echo $FOO > foo.txt; exit 7'"
    data = event("pre_tool_use_bash", command=original, cwd=str(project))
    answer = real_hook(hostrun, data, "pre-tool-use")
    assert answer is not None and schema_problems("PreToolUse", answer) == []
    rewritten = answer["hookSpecificOutput"]["updatedInput"]["command"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", "-c", rewritten], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert (project / "sub" / "where.txt").read_text() == f"{project / 'sub'}\n"
    assert (project / "sub" / "foo.txt").read_text() == "kept\n"
    runs = json.loads(hostrun.run("history", "--json").stdout)
    assert [(r["label"], r["session"], r["exit_code"], r["command"]) for r in runs] == [
        ("proj:pwd", "claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e", 7, f"bash -c {original}")]
    # a failed run teaches nothing (docs/capacity.md): the next rewrite still has no cap of its own
    again = real_hook(hostrun, data, "pre-tool-use")
    assert again is not None
    assert cap_of(again["hookSpecificOutput"]["updatedInput"]["command"]) is None
    # once a run of the label succeeds, the next rewrite caps it by the half rule (at least 512 MiB)
    passing = event("pre_tool_use_bash", command="cd sub && pwd > where.txt", cwd=str(project))
    answer = real_hook(hostrun, passing, "pre-tool-use")
    assert answer is not None
    rewritten = answer["hookSpecificOutput"]["updatedInput"]["command"]
    proc = subprocess.run(["bash", "-c", rewritten], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    again = real_hook(hostrun, data, "pre-tool-use")
    assert again is not None
    assert cap_of(again["hookSpecificOutput"]["updatedInput"]["command"]) == "512M"
    assert hostrun.bookings() == []


def test_remind_reads_this_hosts_report_and_says_an_unreachable_peer(hostrun: Hostrun,
                                                                    tmp_path: Path) -> None:
    hostrun.configure(top="enable_across_machines = true\nreport_deadline = \"5s\"",
                      peers='[hosts.gone]\nssh = "nobody@127.0.0.1"\nport = 1\n')
    answer = real_hook(hostrun, event("pre_tool_use_bash", cwd=str(tmp_path)), "pre-tool-use")
    assert answer is not None and schema_problems("PreToolUse", answer) == []
    lines = answer["hookSpecificOutput"]["additionalContext"].splitlines()
    assert any(line.startswith("- local: load ") and "slice 300 MiB free of 300 MiB" in line
               for line in lines)
    assert any(line.startswith("- gone: could not read: ") for line in lines)


def test_session_start_lists_the_sessions_jobs_locks_and_workdirs(hostrun: Hostrun, tmp_path: Path) -> None:
    session = "claude-0f6c2d1e-8b7a-4c55-9e0a-2f4d6b8a1c3e"
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    env = {**os.environ, "HOSTRUN_SESSION": session}
    job = hostrun.popen("-m", "64M", "--label", "long-build", "--", "sleep", "30", env=env)
    other = hostrun.popen("-m", "64M", "--label", "not-mine", "--session", "someone-else", "--",
                          "sleep", "30")
    (project / "src").mkdir()
    lock = hostrun.popen("lock", str(project / "src"), "--", "sleep", "30", env=env)
    try:
        assert hostrun.run("workdir", "claim", str(project / "build-a"), "--purpose", "fuzzing corpus",
                           env=env).returncode == 0
        assert hostrun.run("workdir", "claim", str(project / "build-b"), "--purpose", "theirs",
                           "--session", "someone-else").returncode == 0
        wait_for(lambda: len([b for b in hostrun.bookings() if b[2] == "running"]) == 2, timeout=30)
        wait_for(lambda: (project / "src" / ".hostrun-lock.json").exists(), timeout=30)
        answer = real_hook(hostrun, event("session_start_compact", cwd=str(project)), "session-start")
        assert answer is not None and schema_problems("SessionStart", answer) == []
        context = answer["hookSpecificOutput"]["additionalContext"]
        assert "long-build" in context and "sleep 30" in context
        assert "not-mine" not in context and "theirs" not in context
        assert f"holds the lock of {project / 'src'}" in context
        assert f"claimed {project / 'build-a'}" in context and "fuzzing corpus" in context
    finally:
        for proc in (job, other, lock):
            proc.terminate()
            proc.wait(timeout=30)
    wait_for(lambda: hostrun.bookings() == [], timeout=30)


def test_own_cap_kill_reaches_its_session_through_the_hooks_once(hostrun: Hostrun, tmp_path: Path) -> None:
    def kill(label: str, session: str) -> None:
        proc = hostrun.run("-m", "100M", "--label", label, "--session", session, "--",
                           sys.executable, "-c", "x = bytearray(300 << 20)")
        assert proc.returncode == ExitCode.OWN_CAP, proc.stderr

    def hook_at(name: str, *argv: str, **changes: Any) -> dict[str, Any] | None:
        return real_hook(hostrun, event(name, cwd=str(tmp_path), **changes), *argv)

    assert hook_at("post_tool_use_bash", "post-tool-use") is None  # the session's cursor starts
    kill("hog", SESSION)
    kill("not-mine", "claude-someone-else")
    answer = hook_at("post_tool_use_bash", "post-tool-use")
    assert answer is not None and schema_problems("PostToolUse", answer) == []
    said = context(answer)
    assert "job hog on local was killed at its own cap 100 MiB" in said and "-m 512M" in said
    assert "not-mine" not in said
    assert hook_at("post_tool_use_bash", "post-tool-use") is None
    kill("hog-after-compact", SESSION)
    answer = hook_at("session_start_compact", "session-start")
    assert answer is not None and "job hog-after-compact on local" in context(answer)
    kill("hog-at-stop", SESSION)
    assert hook_at("stop", "stop", stop_hook_active=True) is None
    answer = hook_at("stop", "stop")
    assert answer is not None and schema_problems("Stop", answer) == []
    assert "job hog-at-stop on local" in answer["reason"] and "not-mine" not in answer["reason"]
    assert hook_at("stop", "stop") is None and hook_at("post_tool_use_bash", "post-tool-use") is None
    # The failed call itself (a Bash command exiting 250 fires PostToolUseFailure, not PostToolUse):
    # its alert comes with the failure, once.
    kill("hog-failed", SESSION)
    answer = hook_at("post_tool_use_failure_bash", "post-tool-use-failure")
    assert answer is not None and schema_problems("PostToolUseFailure", answer) == []
    assert "job hog-failed on local was killed at its own cap 100 MiB" in context(answer)
    assert "may say why this call failed" in context(answer)
    assert hook_at("post_tool_use_failure_bash", "post-tool-use-failure") is None
    assert hook_at("post_tool_use_bash", "post-tool-use") is None
    assert hostrun.bookings() == []


def test_agents_status_self_test_passes(hostrun: Hostrun, tmp_path: Path) -> None:
    proc = hostrun.run("agents", "status", "--no-round-trip", cwd=tmp_path,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("self-test ok") == len(selftest.cases()) == 15 and "FAIL" not in proc.stdout


# -------------------------------------------------------------------- the project's config, install
def hook_process(data: dict[str, Any], cwd: Path, env: dict[str, str]) -> dict[str, Any] | None:
    """The hook as Claude Code runs it: its own process, in the agent's current directory, without
    --config."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTRUN_", "CLAUDE_"))}
    full.update(PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run([sys.executable, "-m", "dispatch", "hook", "pre-tool-use"], input=json.dumps(data),
                          capture_output=True, text=True, env=full, cwd=cwd, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout) if proc.stdout else None


@pytest.mark.parametrize("found_by", ["CLAUDE_PROJECT_DIR", "git top of the event's cwd"])
def test_the_projects_config_applies_after_cd(tmp_path: Path, found_by: str) -> None:
    """A guard-mode project's hosts.toml at its root; the agent has done ``cd sub`` (the event's
    cwd and the hook's own working directory): the project's guard still applies, found through
    ``$CLAUDE_PROJECT_DIR`` or else the git top level of the event's cwd."""
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / ".git").mkdir()
    (project / "hosts.toml").write_text(f'state_dir = "{tmp_path}/state"\n[agents]\nmode = "guard"\n')
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    if found_by == "CLAUDE_PROJECT_DIR":
        env["CLAUDE_PROJECT_DIR"] = str(project)
    data = event("pre_tool_use_bash", command="cargo build --release", cwd=str(project / "sub"))
    answer = hook_process(data, project / "sub", env)
    assert answer is not None and answer["hookSpecificOutput"]["permissionDecision"] == "deny", answer


def test_install_carries_config_and_refuses_a_command_that_does_not_work(tmp_path: Path) -> None:
    project, home = tmp_path / "proj", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    home.mkdir()
    config = tmp_path / "team.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    settings = project / ".claude" / "settings.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home), "XDG_CACHE_HOME": str(home / "c")}
    done = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(config), "agents", "install",
                           "claude-code"], capture_output=True, text=True, env=env, cwd=project, timeout=60)
    assert done.returncode == 0, done.stderr
    commands = [h["command"] for groups in json.loads(settings.read_text())["hooks"].values()
                for group in groups for h in group["hooks"]]
    assert len(commands) == len(install.EVENTS) + 1  # Stop's rewake waiter too
    assert all(c.startswith(f"{CMD} hook ") and c.endswith(f" --config {config}") for c in commands)
    before = settings.read_text()
    bad = agents("install", "claude-code", "--command", "/nonexistent/hostrun", cwd=project, home=home)
    assert bad.returncode == ExitCode.NOT_RUN
    assert "the hooks would call '/nonexistent/hostrun', which does not work here" in bad.stderr
    assert settings.read_text() == before


def test_status_runs_the_installed_commands_for_real(tmp_path: Path) -> None:
    """An installed command that cannot start (here: a hostrun that is not there, as a bare
    ``hostrun`` off Claude Code's PATH would be) is what ``status`` finds and says, exit 78, even
    though the in-process self-test passes."""
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "/nonexistent/bin/hostrun hook pre-tool-use", "timeout": 60}]}]}}))
    status = agents("status", cwd=tmp_path, home=home)
    assert status.returncode == ExitCode.NOT_RUN, status.stdout + status.stderr
    assert "FAIL as installed: /nonexistent/bin/hostrun hook pre-tool-use: exit 127" in status.stdout
    assert "self-test FAIL" not in status.stdout
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert agents("uninstall", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    assert agents("install", "claude-code", "--user", cwd=tmp_path, home=home).returncode == 0
    status = agents("status", cwd=tmp_path, home=home)
    assert status.returncode == 0, status.stdout + status.stderr
    expected = f"ok as installed: each of its {len(install.EVENTS) + 1} commands starts and answers"
    assert expected in status.stdout


def test_install_local_and_from_a_subdirectory(tmp_path: Path) -> None:
    """``--local`` writes Claude Code's uncommitted ``settings.local.json`` at the project root;
    installing from a subdirectory says where Claude Code must be started to read it."""
    project, home = tmp_path / "proj", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    (project / "sub").mkdir()
    home.mkdir()
    done = agents("install", "claude-code", "--local", cwd=project / "sub", home=home)
    assert done.returncode == 0, done.stderr
    local = project / ".claude" / "settings.local.json"
    assert install.installed(json.loads(local.read_text())).keys() == install.EVENTS.keys()
    assert local.stat().st_mode & 0o777 == 0o600
    assert f"note: Claude Code reads {local} when it is started in {project}" in done.stderr
    status = json.loads(agents("status", "--json", cwd=project, home=home).stdout)
    assert [p["scope"] for p in status["installed"] if p["hooks"]] == ["local"]
    assert agents("uninstall", "claude-code", "--local", cwd=project, home=home).returncode == 0
    assert not local.exists() and not local.parent.exists()


# -------------------------------------------------------------------- wrap: the user's permission rules
def claude_settings(path: Path, **lists: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"permissions": lists}))


@pytest.mark.parametrize(("mode", "rules", "expected"), [
    # no rule: the modes that prompt prompt; dontAsk and plan decide the original themselves
    ("default", {}, "ask"),
    ("acceptEdits", {}, "ask"),
    ("dontAsk", {}, "leave"),
    ("plan", {}, "leave"),
    ("bypassPermissions", {}, "allow"),
    # the user's allow rule for the original command: no prompt, in every mode (-p and dontAsk too)
    ("default", {"allow": ["Bash(cargo test:*)"]}, "allow"),
    ("dontAsk", {"allow": ["Bash(cargo test:*)"]}, "allow"),
    ("default", {"allow": ["Bash(cargo test *)"]}, "allow"),
    ("dontAsk", {"allow": ["Bash"]}, "allow"),
    ("default", {"allow": ["Bash(cargo:*)"]}, "allow"),
    ("default", {"allow": ["Bash(cargo test --release)"]}, "ask"),  # exact: another command
    ("default", {"allow": ["Bash(carg:*)"]}, "ask"),  # a prefix is a whole word
    # an ask rule still asks, a deny rule is Claude Code's to apply (to the command as it is)
    ("bypassPermissions", {"ask": ["Bash(cargo test:*)"]}, "ask"),
    ("default", {"allow": ["Bash"], "deny": ["Bash(cargo test:*)"]}, "leave"),
])
def test_wrap_decides_as_the_users_rules_would_for_the_original_command(
        hook: Hook, mode: str, rules: dict[str, list[str]], expected: str) -> None:
    claude_settings(hook.home / ".claude" / "settings.json", **rules)
    answer, err = hook.bash("cargo test -p core", "--mode", "wrap", permission_mode=mode)
    assert err == "" and schema_problems("PreToolUse", answer) == []
    out = answer["hookSpecificOutput"]
    if expected == "leave":
        assert "permissionDecision" not in out and "updatedInput" not in out
        assert "not rewritten: your permission rules or mode decide" in out["additionalContext"]
    else:
        assert out["permissionDecision"] == expected
        assert "-m dispatch --config" in out["updatedInput"]["command"]  # rewritten through hostrun


def trust(hook: Hook, directory: Path) -> None:
    """What accepting Claude Code's trust dialog for ``directory`` writes into ``~/.claude.json``."""
    hook.home.mkdir(parents=True, exist_ok=True)
    (hook.home / ".claude.json").write_text(json.dumps(
        {"projects": {str(directory.resolve()): {"hasTrustDialogAccepted": True}}}))


def test_a_projects_allow_rules_count_only_once_the_workspace_is_trusted(hook: Hook) -> None:
    """Claude Code ignores a checkout's own ``permissions.allow`` until the user trusted the
    workspace (never, in a fresh CI checkout). Before, the hook read them anyway and said ``allow``,
    so the heavy command ran without the approval the client alone would have asked for. A deny
    rule of the project's counts either way; the user's own allow rules too."""
    claude_settings(hook.project / ".claude" / "settings.json", allow=["Bash(make:*)"])
    decision = lambda: hook.bash("make -j8", "--mode", "wrap")[0]["hookSpecificOutput"].get(  # noqa: E731
        "permissionDecision")
    assert decision() == "ask"
    trust(hook, hook.project.parent)  # a directory above counts, as in the client
    assert decision() == "allow"
    (hook.home / ".claude.json").unlink()
    claude_settings(hook.home / ".claude" / "settings.json", allow=["Bash(make:*)"])
    assert decision() == "allow"


def test_wrap_reads_every_settings_file_and_never_preapproves_a_compound_command(hook: Hook) -> None:
    claude_settings(hook.project / ".claude" / "settings.local.json", allow=["Bash(make:*)"])
    trust(hook, hook.project)
    assert hook.bash("make -j8", "--mode", "wrap")[0]["hookSpecificOutput"]["permissionDecision"] == "allow"
    # a second command riding on an allowed first one is not pre-approved (Claude Code checks each)
    answer, _ = hook.bash("make -j8 && rm -rf /tmp/x", "--mode", "wrap")
    assert answer["hookSpecificOutput"]["permissionDecision"] == "ask"
    # a redirection is not a second command
    assert hook.bash("make -j8 2>&1", "--mode", "wrap")[0]["hookSpecificOutput"]["permissionDecision"] \
        == "allow"
    claude_settings(Path(permissions.MANAGED), deny=["Bash(make:*)"])  # the administrator's word wins
    answer, _ = hook.bash("make -j8", "--mode", "wrap")
    assert "permissionDecision" not in answer["hookSpecificOutput"]


def test_a_hung_peer_is_skipped_for_a_while_and_the_table_is_bounded(hostrun: Hostrun,
                                                                   tmp_path: Path) -> None:
    """A peer whose ssh never connects (its ProxyCommand logs each start, then hangs), with a
    report_timeout far past the hook's own timeout: the first heavy command's table gives up at the
    hook's deadline (here 3 s, ``HOSTRUN_HOOK_DEADLINE``; 15 s by default) and says so; the next
    ones skip that peer, without starting ssh again, and say why, until it is tried again."""
    log = tmp_path / "proxy.log"
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host *\n  ProxyCommand sh -c 'echo start >> {log}; exec sleep 600'\n")
    hostrun.configure(top='enable_across_machines = true\nreport_timeout = "100s"\n'
                          'report_deadline = "120s"\n[agents]\nmode = "remind"',
                      peers=f'[hosts.hung]\nssh = "hung"\nssh_config = "{ssh_config}"\n')
    env = {"HOSTRUN_HOOK_DEADLINE": "3", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = event("pre_tool_use_bash", command="cargo build --release", cwd=str(tmp_path))
    try:
        first = real_hook(hostrun, data, "pre-tool-use", env=env)
        assert first is not None
        said = context(first)
        assert "- hung: could not read: no answer within the 3 s deadline" in said, said
        starts = log.read_text().count("start")
        second = real_hook(hostrun, data, "pre-tool-use", env=env)
        assert second is not None
        assert "- hung: could not read: skipped: it did not answer" in context(second)
        assert "(tried again after 60 s)" in context(second)
        assert log.read_text().count("start") == starts  # no ssh started for the skipped peer
        assert "- local: load" in context(second)
    finally:
        subprocess.run(["pkill", "-f", f"echo start >> {log}"], check=False)
        from tests.conftest import _stop_masters

        _stop_masters(hostrun.state_dir)


def test_a_huge_command_is_not_echoed_back_whole(hook: Hook) -> None:
    hook.configure('mode = "guard"')
    command = "cargo build --release " + "x" * 1_000_000
    answer, _ = hook.bash(command)
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert len(json.dumps(answer)) < 20_000
    assert "characters in all, not repeated here" in answer["hookSpecificOutput"]["permissionDecisionReason"]


# -------------------------------------------------------------------- waking an idle main agent
def test_an_idle_session_is_woken_by_its_alert_once(hostrun: Hostrun, tmp_path: Path) -> None:
    """``hostrun hook rewake`` (Stop, ``asyncRewake``) as Claude Code runs it in the background
    once the agent is idle: an alert for the session written meanwhile ends it with exit 2 and the
    alert on stderr (which wakes the session). A newer Stop's waiter replaces an older one, which
    ends quietly; an alert already read (by the next event) is not given again."""
    env = {**os.environ, "HOSTRUN_REWAKE_POLL": "0.2", "HOSTRUN_REWAKE_FOR": "60",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "CLAUDE_CODE_ENTRYPOINT": "cli"}
    stop_event = json.dumps(event("stop", cwd=str(tmp_path)))

    def waiter() -> subprocess.Popen[str]:
        proc = hostrun.popen("hook", "rewake", stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(stop_event)
        proc.stdin.close()
        return proc

    def kill(label: str) -> None:
        proc = hostrun.run("-m", "100M", "--label", label, "--session", SESSION, "--",
                           sys.executable, "-c", "x = bytearray(300 << 20)")
        assert proc.returncode == ExitCode.OWN_CAP, proc.stderr

    first = waiter()
    wait_for(lambda: any((tmp_path / "cache" / "hostrun" / "hooks").glob("rewake-*.pid")), timeout=30)
    second = waiter()
    assert first.wait(timeout=30) == 0 and first.stderr.read() == ""  # type: ignore[union-attr]
    kill("idle-hog")
    assert second.wait(timeout=30) == 2
    woken = second.stderr.read()  # type: ignore[union-attr]
    assert "job idle-hog on local was killed at its own cap 100 MiB" in woken
    # the next waiter: that alert was given; a new one wakes it again, and only the new one
    third = waiter()
    kill("idle-hog-2")
    assert third.wait(timeout=30) == 2
    said = third.stderr.read()  # type: ignore[union-attr]
    assert "idle-hog-2" in said and "job idle-hog on" not in said
    assert not list((tmp_path / "cache" / "hostrun" / "hooks").glob("rewake-*.pid"))


@pytest.mark.parametrize("command", [
    "cargo test", "cargo test --workspace", "hostrun -m 8G -- cargo test --workspace", "pytest",
    "go test ./...", "make check", "npm test", "hostrun -- bash -c 'cd x && cargo nextest run'", "ctest -j8"])
def test_a_subagent_never_runs_the_whole_suite_even_through_hostrun(hook: Hook, command: str) -> None:
    answer, _ = hook.bash(command, name="pre_tool_use_subagent")
    out = answer["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny", command
    assert "runs the whole test suite, which is the main agent's to run" in out["permissionDecisionReason"]


@pytest.mark.parametrize("command", [
    "hostrun -- cargo test -p core", "hostrun -- pytest tests/test_x.py", "hostrun -- pytest -k parser",
    "hostrun -- go test ./pkg/parser", "hostrun -- ctest -R parser"])
def test_a_subagent_runs_narrow_tests_through_hostrun(hook: Hook, command: str) -> None:
    answer, _ = hook.bash(command, name="pre_tool_use_subagent")
    assert "permissionDecision" not in answer["hookSpecificOutput"], command


def test_the_main_agent_and_allow_leave_the_suite_alone(hook: Hook) -> None:
    assert "permissionDecision" not in hook.bash("hostrun -- cargo test --workspace")[0]["hookSpecificOutput"]
    hook.configure('subagent_suite = "allow"')
    answer, _ = hook.bash("hostrun -- cargo test", name="pre_tool_use_subagent")
    assert "permissionDecision" not in answer["hookSpecificOutput"]
