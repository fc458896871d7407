"""``hostrun agents status``'s self-test: sample events through the hooks, in process, and the
answers checked against the fields Claude Code's hooks reference documents.

The PreToolUse samples read this host for real (the resource table). The others run against a
private, temporary state directory: the alert samples write their own alerts there, so the user's
alert file (which a ``hostrun watch --exec`` may follow) and read cursors are never touched."""

from __future__ import annotations

import io
import json
import os

MYPY = False
if MYPY:
    from typing import Any

# hookSpecificOutput fields per event (Claude Code hooks reference)
FIELDS = {
    "PreToolUse": {"hookEventName", "permissionDecision", "permissionDecisionReason", "updatedInput",
                   "additionalContext"},
    "SessionStart": {"hookEventName", "additionalContext"},
    "PostToolUse": {"hookEventName", "additionalContext"},
    "PostToolUseFailure": {"hookEventName", "additionalContext"},
}
# top-level keys per event: the hooks above answer in hookSpecificOutput; Stop with decision + reason
TOP = {"PreToolUse": {"hookSpecificOutput"}, "SessionStart": {"hookSpecificOutput"},
       "PostToolUse": {"hookSpecificOutput"}, "PostToolUseFailure": {"hookSpecificOutput"},
       "Stop": {"decision", "reason"}}
DECISIONS = ("allow", "deny", "ask")
SESSION_ID = "hostrun-self-test"
ALERT_MARK = "hostrun self-test alert"


def answer_problems(event: str, answer: object) -> list[str]:
    """What is wrong with ``answer`` as a command hook's JSON output for ``event`` (empty: fine)."""
    if not isinstance(answer, dict):
        return ["not a JSON object"]
    problems = [f"unexpected top-level key {k!r}" for k in answer if k not in TOP.get(event, ())]
    if event == "Stop":
        if answer.get("decision") != "block":
            problems.append(f"decision {answer.get('decision')!r} is not 'block'")
        if not isinstance(answer.get("reason"), str) or not answer["reason"]:
            problems.append("block without a reason")
        return problems
    out = answer.get("hookSpecificOutput")
    if not isinstance(out, dict):
        return [*problems, "no hookSpecificOutput object"]
    if out.get("hookEventName") != event:
        problems.append(f"hookEventName is {out.get('hookEventName')!r}, not {event!r}")
    problems += [f"field {k!r} is not one of {event}'s" for k in out if k not in FIELDS.get(event, ())]
    for key in ("permissionDecisionReason", "additionalContext"):
        if key in out and not isinstance(out[key], str):
            problems.append(f"{key} is not a string")
    if "permissionDecision" in out and out["permissionDecision"] not in DECISIONS:
        problems.append(f"permissionDecision {out['permissionDecision']!r} not one of {DECISIONS}")
    if "updatedInput" in out:
        new = out["updatedInput"]
        if not isinstance(new, dict) or not isinstance(new.get("command"), str):
            problems.append("updatedInput has no command")
        if out.get("permissionDecision") not in ("allow", "ask"):
            problems.append("updatedInput without permissionDecision allow or ask")
    if out.get("permissionDecision") == "deny" and not out.get("permissionDecisionReason"):
        problems.append("deny without a reason")
    return problems


def _event(event: str, **fields: Any) -> str:
    data = {"session_id": SESSION_ID, "transcript_path": "/dev/null", "cwd": os.getcwd(),
            "permission_mode": "default", "hook_event_name": event, **fields}
    return json.dumps(data)


def _bash(command: str) -> str:
    return _event("PreToolUse", tool_name="Bash", tool_input={"command": command}, tool_use_id="t1")


def _post() -> str:
    return _event("PostToolUse", tool_name="Bash", tool_input={"command": "git status"},
                  tool_response={"stdout": "", "stderr": "", "interrupted": False}, tool_use_id="t2")


def _failed() -> str:
    return _event("PostToolUseFailure", tool_name="Bash", tool_input={"command": "hostrun -- make"},
                  tool_use_id="t3", error="Exit code 250", is_interrupt=False)


class Case:
    """One sample: the hook's argv and stdin, what is expected (none | remind | wrap | deny |
    context | block), on the private state (``private``) and after writing an alert (``alert``)."""

    def __init__(self, name: str, argv: list[str], stdin: str, expect: str, private: bool = False,
                 alert: bool = False) -> None:
        self.name, self.argv, self.stdin, self.expect = name, argv, stdin, expect
        self.private, self.alert = private, alert


def cases() -> list[Case]:
    return [
        Case("light command: no answer", ["pre-tool-use"], _bash("git status"), "none"),
        Case("another tool: no answer", ["pre-tool-use"],
             _event("PreToolUse", tool_name="Read", tool_input={"file_path": "/etc/hostname"}), "none"),
        Case("malformed event: no answer", ["pre-tool-use"], "{not json", "none"),
        Case("heavy, remind: the resource table", ["pre-tool-use", "--mode", "remind"],
             _bash("cargo build --release"), "remind"),
        Case("heavy, wrap: rewritten through hostrun", ["pre-tool-use", "--mode", "wrap"],
             _bash("cargo build --release"), "wrap"),
        Case("heavy, guard: refused with the command to run", ["pre-tool-use", "--mode", "guard"],
             _bash("cargo build --release"), "deny"),
        Case("session start after compaction: context", ["session-start"],
             _event("SessionStart", source="compact"), "context", private=True),
        Case("after a tool, nothing unread: no answer", ["post-tool-use"], _post(), "none",
             private=True),
        Case("after a tool, an alert: delivered", ["post-tool-use"], _post(), "context", private=True,
             alert=True),
        Case("after the next tool: not again", ["post-tool-use"], _post(), "none", private=True),
        Case("after a failed call, an alert: delivered with it", ["post-tool-use-failure"], _failed(),
             "context", private=True, alert=True),
        Case("after the next failed call: not again", ["post-tool-use-failure"], _failed(), "none",
             private=True),
        Case("stop while stop_hook_active: never blocks", ["stop"],
             _event("Stop", stop_hook_active=True), "none", private=True, alert=True),
        Case("stop with an unread alert: blocks once", ["stop"], _event("Stop", stop_hook_active=False),
             "block", private=True),
        Case("stop again: does not block", ["stop"], _event("Stop", stop_hook_active=False), "none",
             private=True),
    ]


def run_all(config: str | None) -> list[dict[str, Any]]:
    import tempfile

    from dispatch.config import load_settings
    from dispatch.hooks.claude import run
    from dispatch.local.alertlog import append, record

    results = []
    saved = os.environ.pop("CLAUDE_ENV_FILE", None)  # the self-test exports nothing
    try:
        with tempfile.TemporaryDirectory(prefix="hostrun-self-test-") as tmp:
            private = load_settings(config)._replace(state_dir=tmp, alert_file=None)
            for case in cases():
                err = io.StringIO()
                try:
                    if case.alert:
                        append(private.alerts_path, record(
                            "waiting", host="local", label="self-test", session=f"claude-{SESSION_ID}",
                            command="true", action="nothing", message=f"{ALERT_MARK} ({case.name})"))
                    answer = run(case.argv + (["--config", config] if config else []), case.stdin, err,
                                 private if case.private else None)
                    problem = _problem(case, answer)
                except Exception as exc:  # a failing hook is the finding
                    problem = f"raised {type(exc).__name__}: {exc}"
                results.append({"name": case.name, "ok": problem is None, "problem": problem,
                                "stderr": err.getvalue().strip()})
    finally:
        if saved is not None:
            os.environ["CLAUDE_ENV_FILE"] = saved
    return results


EVENT_OF = {"pre-tool-use": "PreToolUse", "session-start": "SessionStart", "post-tool-use": "PostToolUse",
            "post-tool-use-failure": "PostToolUseFailure", "stop": "Stop"}


def _problem(case: Case, answer: object) -> str | None:
    expect = case.expect
    if expect == "none":
        return None if answer is None else f"answered {json.dumps(answer)[:200]}"
    event = EVENT_OF[case.argv[0]]
    if answer is None:
        return "no answer"
    problems = answer_problems(event, answer)
    out = answer.get("hookSpecificOutput", {}) if isinstance(answer, dict) else {}
    decision = out.get("permissionDecision")
    if expect in ("remind", "context") and (decision is not None or not out.get("additionalContext")):
        problems.append("expected only additionalContext")
    if expect == "wrap" and "hostrun" not in str((out.get("updatedInput") or {}).get("command")):
        problems.append("expected updatedInput.command through hostrun")
    if expect == "deny" and decision != "deny":
        problems.append("expected permissionDecision deny")
    said = str(out.get("additionalContext") or "")
    if isinstance(answer, dict):
        said += str(answer.get("reason") or "")
    if (event in ("PostToolUse", "PostToolUseFailure") or expect == "block") and ALERT_MARK not in said:
        problems.append("expected the alert")
    return "; ".join(problems) or None
