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
    from typing import Any, TextIO

    from dispatch.core.settings import Settings

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


def event_cwd(data: dict[str, Any]) -> str:
    """The event's ``cwd`` (the agent's shell directory), else this process's."""
    cwd = data.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else os.getcwd()


def answer(event: str, **fields: Any) -> dict[str, Any]:
    """``hookSpecificOutput`` for ``event`` with the fields given (None left out), its
    ``additionalContext`` cut to ``MAX_CONTEXT``."""
    output = {"hookEventName": event}
    output.update({k: v for k, v in fields.items() if v is not None})
    if isinstance(output.get("additionalContext"), str) and len(output["additionalContext"]) > MAX_CONTEXT:
        output["additionalContext"] = output["additionalContext"][: MAX_CONTEXT - 3] + "..."
    return {"hookSpecificOutput": output}


def short(command: str, limit: int = 200) -> str:
    """``command`` cut to ``limit`` characters for a message."""
    return command if len(command) <= limit else command[: limit - 3] + "..."
