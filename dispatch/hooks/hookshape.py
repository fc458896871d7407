"""The declared shape of a Claude Code hook's event (JSON on stdin, ``claude.run``) and of the
answer a handler gives (JSON on stdout). The event is Claude Code's: only the fields hostrun reads
are declared, and each is checked where it is read (``isinstance``: an older or newer Claude Code
may send another shape). The meanings: Claude Code's hooks reference; docs/agents.md.

Type-checking only: the hook modules import it under ``if MYPY:`` (a hook's light path imports
neither ``typing`` nor ``json``, tests/system/test_hot_path.py).
"""

from __future__ import annotations

from typing import TypedDict


class ToolInput(TypedDict, total=False):
    """A Bash tool call's input (other keys are the tool's own, passed through unchanged)."""

    command: str
    description: str
    timeout: int
    run_in_background: bool


class HookEvent(TypedDict, total=False):
    hook_event_name: str  # PreToolUse, PostToolUse, PostToolUseFailure, Stop, SessionStart
    session_id: str
    agent_id: str  # a subagent's (its alerts are its parent session's)
    cwd: str  # the agent's shell directory
    permission_mode: str  # PreToolUse: default, acceptEdits, plan, bypassPermissions
    tool_name: str
    tool_input: ToolInput
    stop_hook_active: bool  # Stop: already continuing because of a Stop hook
    source: str  # SessionStart: startup, resume, clear, compact


class HookOutput(TypedDict, total=False):
    """``hookSpecificOutput`` (``claudeevent.answer``)."""

    hookEventName: str
    additionalContext: str  # cut to claudeevent.MAX_CONTEXT
    permissionDecision: str  # PreToolUse: allow, ask, deny
    permissionDecisionReason: str
    updatedInput: ToolInput  # PreToolUse: the command rewritten


# ``continue`` is a Python keyword, but hostrun never sends it: the class form serves.
class HookAnswer(TypedDict, total=False):
    hookSpecificOutput: HookOutput
    decision: str  # Stop: "block" keeps the agent going, ``reason`` its next instruction
    reason: str
    systemMessage: str  # shown to the user (a broken configuration, once per problem)
