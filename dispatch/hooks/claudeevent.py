"""What every Claude Code event handler shares: the hook's arguments, the events' names, the
event's directory, the shape and size of an answer, and how the hook talks on stderr.

The handlers (``claudepre``, ``claudestart``, ``claudealerts``) and the entry (``claude``) import
this module, never each other's; it stays small and imports nothing beyond ``os``: it is on the
path of every hook call.
"""

from __future__ import annotations

import os

MYPY = False
if MYPY:
    from typing import TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.hookshape import HookAnswer, HookEvent, HookOutput, ToolInput

PRE_TOOL_USE, SESSION_START = "PreToolUse", "SessionStart"
POST_TOOL_USE, POST_TOOL_USE_FAILURE, STOP = "PostToolUse", "PostToolUseFailure", "Stop"
MAX_CONTEXT = 9000  # characters of additionalContext (Claude Code caps what a hook injects)


class HookArgs:
    """What ``hostrun hook`` was given on its command line."""

    def __init__(self, event: str | None, mode: str | None, config: str | None) -> None:
        self.event, self.mode, self.config = event, mode, config
        self.settings: Settings | None = None  # given instead of loading (the self-test's private state)
        self.problem: str | None = None  # why the configuration could not be loaded
        self.rewake = False  # ``hostrun hook rewake``: wait for alerts while the session is idle


class Rewake(Exception):
    """The idle session has alerts: exit 2 with them on stderr (``asyncRewake`` wakes it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def note(line: str, err: TextIO) -> None:
    """One ``hostrun hook: …`` line on ``err`` (Claude Code keeps it in its debug log); a closed
    stream is no reason to fail."""
    try:
        err.write(f"hostrun hook: {line}\n")
        err.flush()
    except (OSError, ValueError):
        pass


def event_cwd(data: HookEvent) -> str:
    """The event's ``cwd`` (the agent's shell directory), else this process's."""
    cwd = data.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else os.getcwd()


def answer(event: str, *, additionalContext: str | None = None,
           permissionDecision: str | None = None, permissionDecisionReason: str | None = None,
           updatedInput: ToolInput | None = None) -> HookAnswer:
    """``hookSpecificOutput`` for ``event`` with the fields given (None left out), its
    ``additionalContext`` cut to ``MAX_CONTEXT``."""
    output: HookOutput = {"hookEventName": event}
    if additionalContext is not None:
        output["additionalContext"] = additionalContext if len(additionalContext) <= MAX_CONTEXT \
            else additionalContext[: MAX_CONTEXT - 3] + "..."
    if permissionDecision is not None:
        output["permissionDecision"] = permissionDecision
    if permissionDecisionReason is not None:
        output["permissionDecisionReason"] = permissionDecisionReason
    if updatedInput is not None:
        output["updatedInput"] = updatedInput
    return {"hookSpecificOutput": output}


def short(command: str, limit: int = 200) -> str:
    """``command`` cut to ``limit`` characters for a message."""
    return command if len(command) <= limit else command[: limit - 3] + "..."
