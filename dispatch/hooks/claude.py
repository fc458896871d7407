"""``hostrun hook EVENT``: Claude Code's hooks (JSON event on stdin, JSON answer on stdout).

Events (docs/agents.md, "Claude Code"):

- ``pre-tool-use`` (PreToolUse, matcher ``Bash``): classify ``tool_input.command``; a light command
  gets no answer at all (the fast path: no pydantic, rich or sqlite). A heavy or GPU one, by the
  mode (``[agents] mode``, or ``--mode``): ``remind`` adds the resource table as
  ``additionalContext``; ``wrap`` also rewrites the command to run through hostrun
  (``updatedInput``); ``guard`` refuses it (``permissionDecision: "deny"``) with the exact command to
  run instead, unless a person's escape is in front of it (never inside a subagent).
- ``session-start`` (SessionStart, also after ``/compact``): what this session has running, queued,
  locked and claimed, and its unread alerts, as ``additionalContext``; and ``HOSTRUN_SESSION`` for
  the session's later shell commands, through ``$CLAUDE_ENV_FILE``.
- ``post-tool-use`` (PostToolUse, every tool): the session's unread alerts as ``additionalContext``;
  nothing unread, no answer (the fast path again: it runs after every tool call).
- ``post-tool-use-failure`` (PostToolUseFailure, every tool: a call that failed, such as a Bash
  command hostrun ended with 250/254/246/251): the same, so the failure's alert comes with it.
- ``stop`` (Stop): unread alerts block the stop once (``decision: "block"``, the alerts as ``reason``);
  never while ``stop_hook_active`` (Claude Code is already continuing because of a Stop hook).

This module is the entry: the command line, the event read from stdin (``core/jsontext``: no
``json`` on the light paths) and the handler it goes to, each imported only for its event:
``claudepre`` (PreToolUse), ``claudestart`` (SessionStart), ``claudealerts`` (PostToolUse,
PostToolUseFailure, Stop, ``rewake``: each alert reaches the agent once), all sharing ``claudeevent``
(arguments, answers) and ``claudeconfig`` (the project's settings).

A hook must never stop an agent because of itself: bad or empty JSON, another tool, a missing
command, a broken configuration, anything unexpected: one line on stderr, no answer, exit 0.
"""

from __future__ import annotations

import sys

from dispatch.hooks.claudeevent import (
    POST_TOOL_USE,
    POST_TOOL_USE_FAILURE,
    PRE_TOOL_USE,
    SESSION_START,
    STOP,
    HookArgs,
    Rewake,
    note,
)

MYPY = False
if MYPY:
    from typing import TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.hookshape import HookAnswer, HookEvent

EVENTS = {"pre-tool-use": PRE_TOOL_USE, "session-start": SESSION_START, "post-tool-use": POST_TOOL_USE,
          "post-tool-use-failure": POST_TOOL_USE_FAILURE, "stop": STOP}
MODES = ("remind", "wrap", "guard")
USAGE = ("usage: hostrun hook [pre-tool-use|session-start|post-tool-use|post-tool-use-failure|stop]"
         " [--mode remind|wrap|guard] [--config PATH] < EVENT.json")
HELP = f"""{USAGE}

Claude Code's hooks: read the event JSON on stdin, write the answer JSON on stdout.
Without EVENT, the JSON's hook_event_name says which. --mode beats [agents] mode in the config.
Always exits 0: a problem is one line on stderr, and the agent goes on. See docs/agents.md."""


def parse_args(argv: list[str]) -> HookArgs:
    """EVENT, ``--mode``, ``--config``; ValueError naming what is wrong."""
    event = mode = config = None
    rewake_ = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg in ("--mode", "--config"):
            if i + 1 >= len(argv):
                raise ValueError(f"{arg} needs a value")
            value, i = argv[i + 1], i + 1
        elif arg.startswith(("--mode=", "--config=")):
            arg, _, value = arg.partition("=")
        if arg == "--mode":
            if value not in MODES:
                raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {value!r}")
            mode = value
        elif arg == "--config":
            config = value
        elif arg == "rewake" and event is None:
            event, rewake_ = STOP, True
        elif event is None and not arg.startswith("-"):
            event = EVENTS.get(arg) or (arg if arg in EVENTS.values() else None)
            if event is None:
                raise ValueError(f"unknown event {arg!r} (one of {', '.join(EVENTS)}, rewake)")
        else:
            raise ValueError(f"unexpected argument {arg!r}")
        i += 1
    args = HookArgs(event, mode, config)
    args.rewake = rewake_
    return args


def main(argv: list[str], stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """The whole hook: always 0 (``--help`` included); the answer, if any, on ``stdout``."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if argv and argv[0] in ("-h", "--help"):
        print(HELP, file=out)
        return 0
    try:
        answer = run(argv, (stdin or sys.stdin).read(), err)
        if answer is not None:
            import json  # only for an answer: a light command's path never loads json (jsontext)

            out.write(json.dumps(answer) + "\n")
            out.flush()
    except Rewake as wake:  # asyncRewake: exit 2 wakes the idle session with stderr as its message
        err.write(wake.text + "\n")
        err.flush()
        return 2
    except Exception as exc:  # never block the agent because of the hook itself
        note(f"internal problem, nothing done: {type(exc).__name__}: {exc}", err)
    return 0


def run(argv: list[str], text: str, err: TextIO, settings: Settings | None = None
        ) -> HookAnswer | None:
    """The answer to the event in ``text`` (None: no answer), saying on ``err`` why there is none
    when that is not the normal outcome. ``settings``: use these instead of loading the config."""
    try:
        args = parse_args(argv)
    except ValueError as exc:
        note(f"{exc} ({USAGE})", err)
        return None
    args.settings = settings
    try:
        from dispatch.core.jsontext import loads

        data: HookEvent | None = loads(text) if text.strip() else None
    except ValueError as exc:
        note(f"the event on stdin is not JSON ({exc}): nothing done", err)
        return None
    if not isinstance(data, dict):
        note("no event on stdin (expected a JSON object): nothing done", err)
        return None
    named = data.get("hook_event_name")
    event = args.event or (named if named in EVENTS.values() else None)
    if event is None:
        note(f"event {named!r} is not handled (only {', '.join(EVENTS.values())}): nothing done", err)
        return None
    if args.event and isinstance(named, str) and named != args.event:
        note(f"called for {args.event} but the event is {named}: nothing done", err)
        return None
    return _handle(event, data, args, err)


def _handle(event: str, data: HookEvent, args: HookArgs, err: TextIO) -> HookAnswer | None:
    """The event's handler, its module imported only now: each path loads only its own."""
    if args.rewake:
        from dispatch.hooks.claudealerts import rewake

        rewake(data, args, err)
        return None
    if event == PRE_TOOL_USE:
        from dispatch.hooks.claudepre import pre_tool_use

        return pre_tool_use(data, args, err)
    if event in (POST_TOOL_USE, POST_TOOL_USE_FAILURE, STOP):
        from dispatch.hooks.claudealerts import post_tool_use, stop

        return stop(data, args, err) if event == STOP else post_tool_use(data, args, err, event)
    from dispatch.hooks.claudestart import session_start

    return session_start(data, args, err)
