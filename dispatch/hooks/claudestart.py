"""SessionStart (also after ``/compact``): what a compaction summary loses, told again.

The mode and what it means, the session's hostrun name, what it holds on this host (running and
queued jobs, workspace locks, claimed work directories; ``dispatch.hooks.session``) and its unread
alerts, as ``additionalContext``; and ``HOSTRUN_SESSION`` for the session's later shell commands,
through ``$CLAUDE_ENV_FILE``.
"""

from __future__ import annotations

import os

from dispatch.hooks import claudealerts
from dispatch.hooks.claudeconfig import hook_settings, problem_answer
from dispatch.hooks.claudeevent import SESSION_START, answer, event_cwd, note
from dispatch.hooks.session import claude_session

MYPY = False
if MYPY:
    from collections.abc import Callable
    from typing import TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.claudeevent import HookArgs
    from dispatch.hooks.hookshape import HookAnswer, HookEvent

MODE_LINES = {
    "remind": "before each heavy command you see every host's resources; run heavy work as "
              "`hostrun [-m CAP] -- CMD`.",
    "wrap": "heavy commands are rewritten to run through hostrun (`hostrun ... -- bash -c '...'`).",
    "guard": "heavy commands that do not run through hostrun are refused; run them as "
             "`hostrun [-m CAP] -- CMD`.",
}


def session_start(data: HookEvent, args: HookArgs, err: TextIO) -> HookAnswer | None:
    """The session's context (always answered, given a ``session_id``); each part that cannot be
    read is said so, and the rest shown."""
    from dispatch.hooks import rewrite, session

    name = claude_session(data.get("session_id"))
    if name is None:
        note("no session_id in the event: nothing to do", err)
        return None
    settings = hook_settings(args, err, data)
    if settings is None:
        return problem_answer(args)
    _export_session(name, err)
    mode = args.mode or settings.agents.mode
    cwd = event_cwd(data)
    lines = [f"hostrun ({mode} mode): {MODE_LINES[mode]} This session is hostrun session {name} "
             "($HOSTRUN_SESSION)."]
    root = rewrite.project_root(cwd)
    sections: list[tuple[str, Callable[[], list[str]]]] = [
        ("Its hostrun jobs on this host", lambda: session.jobs(settings, name)),
        ("Workspace locks it holds", lambda: session.locks(name)),
        (f"Work directories it claimed under {root}", lambda: session.workdirs(name, root))]
    for title, read in sections:
        try:
            found = read()
        except Exception as exc:  # one part unreadable: say so, show the rest
            found = [f"- could not read: {exc}"]
        if found:
            lines += [f"{title}:", *found]
    if settings.sessions.place and data.get("source") in ("startup", "resume"):
        lines += _place(settings)
    lines += claudealerts.alert_lines(settings, name, SESSION_START, err)
    return answer(SESSION_START, additionalContext="\n".join(lines))


def _place(settings: Settings) -> list[str]:
    """``[sessions] place``: this session's process tree placed into the sessions slice by a detached
    process (``dispatch.hooks.placer``); what was done, or why it cannot be, said once (at its start
    or resume, not after a compaction)."""
    from dispatch.core.errors import HostrunError
    from dispatch.local.sessions.sessionplace import ALREADY, agent_process, placeable

    pid = agent_process()
    if pid is None:
        return ["hostrun: this session's process was not found (the hook's parent, past its shell); "
                "it runs outside hostrun's sessions slice."]
    try:
        why = placeable(settings, pid)
    except HostrunError as exc:
        why = str(exc)
    if why is not None:
        return [] if why == ALREADY else [f"hostrun: {why}."]
    from dispatch.hooks import placer

    placer.start(settings.source if os.path.isfile(settings.source) else None, pid, "claude")
    return [f"hostrun: this session (pid {pid}) is booked as an agent session and moved into hostrun's "
            "sessions slice once admitted (`hostrun ledger`; its log: state_dir/sessions.log); the jobs "
            "it runs through hostrun are booked beside it."]


def _export_session(name: str, err: TextIO) -> None:
    """``export HOSTRUN_SESSION=NAME`` into ``$CLAUDE_ENV_FILE`` (sourced before each of the
    session's shell commands), once."""
    path = os.environ.get("CLAUDE_ENV_FILE")
    if not path:
        return
    import shlex

    line = f"export HOSTRUN_SESSION={shlex.quote(name)}\n"
    try:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                if line in fh.read():
                    return
        except FileNotFoundError:
            pass
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        note(f"could not write HOSTRUN_SESSION to $CLAUDE_ENV_FILE ({path}): {exc.strerror}", err)
