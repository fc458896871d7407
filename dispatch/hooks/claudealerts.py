"""hostrun's alerts brought to the agent whose job they are about: at PostToolUse and
PostToolUseFailure (after every tool call), at Stop (blocking the stop once), and to a session that
has gone idle (``rewake``, the background waiter that exit 2 wakes).

``alert_lines`` goes through ``dispatch.placement.alerts.unread``, which moves the session's read
cursor, so each alert reaches the agent exactly once, at whichever of these events comes first.
PreToolUse delivers none (its answer may be a denial, and a light command must stay off the
cursor); a subagent's PostToolUse delivers none either (the alerts are the main agent's to decide).
PostToolUse with nothing unread is the usual case and runs after every tool call: the config from its
cache and the cursor, nothing more.
"""

from __future__ import annotations

import os

from dispatch.hooks.claudeconfig import hook_settings, problem_answer
from dispatch.hooks.claudeevent import (
    MAX_CONTEXT,
    POST_TOOL_USE,
    POST_TOOL_USE_FAILURE,
    SESSION_START,
    STOP,
    Rewake,
    answer,
    note,
    short,
)
from dispatch.hooks.session import claude_session

MYPY = False
if MYPY:
    from typing import TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.claudeevent import HookArgs
    from dispatch.hooks.hookshape import HookAnswer, HookEvent

MAX_ALERTS = 20  # alerts shown per delivery; older ones are counted and named where to read
MAX_ALERT_LINE = 420  # characters of one alert's line: MAX_ALERTS of them fit in MAX_CONTEXT
REWAKE_POLL = 1.0  # seconds between looks at the alert file while the session is idle
REWAKE_FOR = 3300.0  # the longest a waiter waits (under its installed 3600 s timeout)
REWAKE_POLL_ENV, REWAKE_FOR_ENV = "HOSTRUN_REWAKE_POLL", "HOSTRUN_REWAKE_FOR"  # tests: shorter
# Claude Code tells its hooks how it was started: ``cli`` is the terminal UI; ``sdk-cli`` is
# ``claude -p``, and the SDKs have their own names. Only the terminal UI has an idle session to wake.
ENTRYPOINT_ENV, INTERACTIVE = "CLAUDE_CODE_ENTRYPOINT", "cli"

ALERT_HEADINGS = {
    SESSION_START: "Unread hostrun alert{s} for this session ({n}; each is shown once, and hostrun "
                   "never acts on one itself: decide, or tell the user):",
    POST_TOOL_USE: "hostrun: {n} new alert{s} for this session (shown once; hostrun never acts on one "
                   "itself: decide what to do, or tell the user):",
    POST_TOOL_USE_FAILURE: "hostrun: {n} new alert{s} for this session, which may say why this call "
                           "failed (shown once; hostrun never acts on one itself: decide what to do, "
                           "or tell the user):",
    STOP: "hostrun: {n} alert{s} for this session arrived while you worked (shown once). Before you "
          "stop, act on them or tell the user what they say; hostrun never acts on one itself:",
}


def alert_lines(settings: Settings, session: str, event: str, err: TextIO) -> list[str]:
    """This session's unread alerts as lines under a heading for ``event`` (none: no lines), marked
    read: each alert reaches the agent once, at the first event that asks. A cursor that cannot be
    read or written is one line on ``err`` and no alerts (they stay unread)."""
    from dispatch.placement import alerts

    try:
        found = alerts.unread(settings, session, mark=True)
    except Exception as exc:  # an unusable cursor must not stop the agent
        note(f"could not read the alerts for {session}: {exc}", err)
        return []
    if not found:
        return []
    shown = found[-MAX_ALERTS:]
    lines = [ALERT_HEADINGS[event].format(n=len(found), s="" if len(found) == 1 else "s")]
    if len(found) > len(shown):
        lines.append(f"- ({len(found) - len(shown)} older ones: `hostrun alerts --session {session}`)")
    lines += [f"- {short(alerts.describe(item), MAX_ALERT_LINE)}" for item in shown]
    return lines


def post_tool_use(data: HookEvent, args: HookArgs, err: TextIO, event: str = POST_TOOL_USE
                  ) -> HookAnswer | None:
    """The session's unread alerts, once, as ``additionalContext``; nothing unread: no answer.

    ``PostToolUseFailure`` (a tool call that failed: a Bash command that exited non-zero, as a job
    hostrun stopped with 250, 254, 246 or 251 does) gets the same answer, so the failed call's own
    alert reaches the agent with the failure itself, not at some later call."""
    if data.get("agent_id"):
        return None  # a subagent's tool call: the alerts wait for the main agent
    lines = _unread(data, args, err, event)
    if args.problem:
        return problem_answer(args)
    return answer(event, additionalContext="\n".join(lines)) if lines else None


def stop(data: HookEvent, args: HookArgs, err: TextIO) -> HookAnswer | None:
    """Unread alerts block the stop once, with the alerts as the reason Claude continues with. Never
    while ``stop_hook_active``: Claude Code is then already continuing because of a Stop hook, and
    blocking again could loop; the alerts stay unread for the next event."""
    if data.get("stop_hook_active"):
        return None
    lines = _unread(data, args, err, STOP)
    if args.problem:
        return problem_answer(args)
    if not lines:
        return None
    reason = "\n".join(lines)
    if len(reason) > MAX_CONTEXT:
        reason = reason[: MAX_CONTEXT - 3] + "..."
    return {"decision": "block", "reason": reason}


def _unread(data: HookEvent, args: HookArgs, err: TextIO, event: str) -> list[str]:
    """The lines of the event's session's unread alerts (marked read), or none."""
    name = claude_session(data.get("session_id"))
    if name is None:
        note("no session_id in the event: nothing to do", err)
        return []
    settings = hook_settings(args, err, data)
    return [] if settings is None else alert_lines(settings, name, event, err)


def rewake(data: HookEvent, args: HookArgs, err: TextIO) -> None:
    """``hostrun hook rewake`` (installed on Stop with ``asyncRewake``: Claude Code runs it in the
    background once the main agent has stopped): wait for an alert addressed to the now idle session
    and wake it with the alert (``Rewake``: exit 2, the alert on stderr), so a job killed or a room
    freed while nobody types reaches the agent within a few seconds. One waiter per session: a newer
    one (the next Stop) replaces it, and it ends quietly when the session's next event has read the
    alerts, when the client that started it is gone, or when it has waited ``REWAKE_FOR``.

    Only in the terminal UI (``CLAUDE_CODE_ENTRYPOINT=cli``): a headless client (``claude -p``, the
    SDK) waits for every Stop hook, background ones included, before it prints its result and
    exits, so a waiter there would hold every ``-p`` run for the whole ``REWAKE_FOR``; and nobody
    is idle at a headless prompt to be woken. The Stop that ends a woken turn
    (``stop_hook_active``) arms a waiter again: it wakes only on a new unread alert, so it cannot
    loop, and without it the session went unwatched after its first wake. Never for a subagent."""
    if data.get("agent_id") or os.environ.get(ENTRYPOINT_ENV) != INTERACTIVE:
        return
    name = claude_session(data.get("session_id"))
    if name is None:
        note("no session_id in the event: nothing to do", err)
        return
    settings = hook_settings(args, err, data)
    if settings is None:
        return
    client = _client()
    if client is None:
        return  # already gone (or never known): nobody to wake
    import time

    from dispatch.hooks import hookstate

    marker = os.path.join(hookstate.ensure(), f"rewake-{name}.pid")
    me = f"{os.getpid()}\n"
    with open(marker, "w", encoding="utf-8") as fh:  # the newest waiter of this session
        fh.write(me)
    poll = float(os.environ.get(REWAKE_POLL_ENV) or REWAKE_POLL)
    until = time.monotonic() + float(os.environ.get(REWAKE_FOR_ENV) or REWAKE_FOR)
    try:
        _wait_for_alerts(settings, name, marker, me, poll, until, client, err)
    finally:
        try:
            with open(marker, encoding="utf-8") as fh:
                mine = fh.read() == me
            if mine:
                os.unlink(marker)
        except OSError:
            pass


SHELLS = frozenset(("sh", "dash", "bash", "zsh", "ksh", "busybox"))


def _client() -> tuple[int, int] | None:
    """(pid, start time) of the client that runs this hook: the nearest ancestor that is not a
    shell (Claude Code runs a hook as ``/bin/sh -c COMMAND``, and a shell may or may not exec it).
    None when it cannot be found."""
    from dispatch.core.procinfo import CannotTell, parent_of, start_time

    pid = os.getppid()
    for _ in range(8):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                comm = fh.read().strip()
        except OSError:
            return None
        if comm not in SHELLS:
            try:
                started = start_time(pid)
            except CannotTell:
                return None
            return None if started is None else (pid, started)
        parent = parent_of(pid)
        if parent is None:
            return None
        pid = parent
    return None


def _wait_for_alerts(settings: Settings, name: str, marker: str, me: str, poll: float, until: float,
                     client: tuple[int, int], err: TextIO) -> None:
    """Look for the session's alerts every ``poll`` seconds until ``until`` (``time.monotonic``),
    raising ``Rewake`` with the first found; return when a newer waiter has written ``marker`` or
    the client is gone. The client is looked at after an alert is seen and before it is marked
    read: a waiter whose client has ended leaves the alert unread, for ``hostrun alerts --unread``
    and the resumed session's SessionStart (before, it took the alert and woke nobody)."""
    import time

    from dispatch.core.procinfo import is_alive
    from dispatch.placement import alerts

    while time.monotonic() < until:
        time.sleep(poll)
        try:
            with open(marker, encoding="utf-8") as fh:
                if fh.read() != me:
                    return  # a newer Stop's waiter took over
        except OSError:
            return
        if not is_alive(*client):
            return
        try:
            pending = alerts.unread(settings, name, mark=False)
        except Exception:  # an unusable cursor: alert_lines says so when it is read for real
            pending = [{}]
        if not pending or not is_alive(*client):
            continue
        lines = alert_lines(settings, name, STOP, err)
        if lines:
            raise Rewake("\n".join(lines)[:MAX_CONTEXT])
