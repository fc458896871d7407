"""``hostrun agents status``'s self-test: sample events through the hooks, in process, and the
answers checked against the fields Claude Code's hooks reference documents."""

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
}
DECISIONS = ("allow", "deny", "ask")


def answer_problems(event: str, answer: object) -> list[str]:
    """What is wrong with ``answer`` as a command hook's JSON output for ``event`` (empty: fine)."""
    if not isinstance(answer, dict):
        return ["not a JSON object"]
    problems = [f"unexpected top-level key {k!r}" for k in answer if k != "hookSpecificOutput"]
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
    data = {"session_id": "hostrun-self-test", "transcript_path": "/dev/null", "cwd": os.getcwd(),
            "permission_mode": "default", "hook_event_name": event, **fields}
    return json.dumps(data)


def _bash(command: str) -> str:
    return _event("PreToolUse", tool_name="Bash", tool_input={"command": command}, tool_use_id="t1")


def cases() -> list[tuple[str, list[str], str, str]]:
    """(name, argv, stdin, what is expected: none | remind | wrap | deny | context)."""
    return [
        ("light command: no answer", ["pre-tool-use"], _bash("git status"), "none"),
        ("another tool: no answer", ["pre-tool-use"],
         _event("PreToolUse", tool_name="Read", tool_input={"file_path": "/etc/hostname"}), "none"),
        ("malformed event: no answer", ["pre-tool-use"], "{not json", "none"),
        ("heavy, remind: the resource table", ["pre-tool-use", "--mode", "remind"],
         _bash("cargo build --release"), "remind"),
        ("heavy, wrap: rewritten through hostrun", ["pre-tool-use", "--mode", "wrap"],
         _bash("cargo build --release"), "wrap"),
        ("heavy, guard: refused with the command to run", ["pre-tool-use", "--mode", "guard"],
         _bash("cargo build --release"), "deny"),
        ("session start after compaction: context", ["session-start"],
         _event("SessionStart", source="compact"), "context"),
    ]


def run_all(config: str | None) -> list[dict[str, Any]]:
    from dispatch.hooks.claude import run

    results = []
    saved = os.environ.pop("CLAUDE_ENV_FILE", None)  # the self-test exports nothing
    try:
        for name, argv, stdin, expect in cases():
            err = io.StringIO()
            try:
                answer = run(argv + (["--config", config] if config else []), stdin, err)
                problem = _problem(argv, answer, expect)
            except Exception as exc:  # a failing hook is the finding
                problem = f"raised {type(exc).__name__}: {exc}"
            results.append({"name": name, "ok": problem is None, "problem": problem,
                            "stderr": err.getvalue().strip()})
    finally:
        if saved is not None:
            os.environ["CLAUDE_ENV_FILE"] = saved
    return results


def _problem(argv: list[str], answer: object, expect: str) -> str | None:
    if expect == "none":
        return None if answer is None else f"answered {json.dumps(answer)[:200]}"
    event = "SessionStart" if argv[0] == "session-start" else "PreToolUse"
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
    return "; ".join(problems) or None
