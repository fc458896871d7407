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

Alerts go through ``_alerts``: ``dispatch.placement.alerts.unread`` moves the session's read cursor,
so each alert reaches the agent exactly once, at whichever of these events comes first. PreToolUse
delivers none (its answer may be a denial, and a light command must stay off the cursor); a
subagent's PostToolUse delivers none either (the alerts are the main agent's to decide).

A hook must never stop an agent because of itself: bad or empty JSON, another tool, a missing
command, a broken configuration, anything unexpected: one line on stderr, no answer, exit 0.
"""

from __future__ import annotations

import os
import sys

from dispatch.hooks.session import claude_session

MYPY = False
if MYPY:
    from collections.abc import Callable, Mapping
    from typing import Any, TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.classify import Verdict

PRE_TOOL_USE, SESSION_START = "PreToolUse", "SessionStart"
POST_TOOL_USE, POST_TOOL_USE_FAILURE, STOP = "PostToolUse", "PostToolUseFailure", "Stop"
EVENTS = {"pre-tool-use": PRE_TOOL_USE, "session-start": SESSION_START, "post-tool-use": POST_TOOL_USE,
          "post-tool-use-failure": POST_TOOL_USE_FAILURE, "stop": STOP}
MODES = ("remind", "wrap", "guard")
MAX_CONTEXT = 9000  # characters of additionalContext (Claude Code caps what a hook injects)
MAX_ECHO = 2000  # characters of a command repeated in a denial (a 10 MB command gave a 10 MB answer)
MAX_ALERTS = 20  # alerts shown per delivery; older ones are counted and named where to read
MAX_ALERT_LINE = 420  # characters of one alert's line: MAX_ALERTS of them fit in MAX_CONTEXT
USAGE = ("usage: hostrun hook [pre-tool-use|session-start|post-tool-use|post-tool-use-failure|stop]"
         " [--mode remind|wrap|guard] [--config PATH] < EVENT.json")
HELP = f"""{USAGE}

Claude Code's hooks: read the event JSON on stdin, write the answer JSON on stdout.
Without EVENT, the JSON's hook_event_name says which. --mode beats [agents] mode in the config.
Always exits 0: a problem is one line on stderr, and the agent goes on. See docs/agents.md."""


class HookArgs:
    """What ``hostrun hook`` was given on its command line."""

    def __init__(self, event: str | None, mode: str | None, config: str | None) -> None:
        self.event, self.mode, self.config = event, mode, config
        self.settings: Settings | None = None  # given instead of loading (the self-test's private state)
        self.problem: str | None = None  # why the configuration could not be loaded
        self.rewake = False  # ``hostrun hook rewake``: wait for alerts while the session is idle


def _note(line: str, err: TextIO) -> None:
    try:
        err.write(f"hostrun hook: {line}\n")
        err.flush()
    except (OSError, ValueError):
        pass


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
        _note(f"internal problem, nothing done: {type(exc).__name__}: {exc}", err)
    return 0


def run(argv: list[str], text: str, err: TextIO, settings: Settings | None = None
        ) -> dict[str, Any] | None:
    """The answer to the event in ``text`` (None: no answer), saying on ``err`` why there is none
    when that is not the normal outcome. ``settings``: use these instead of loading the config."""
    try:
        args = parse_args(argv)
    except ValueError as exc:
        _note(f"{exc} ({USAGE})", err)
        return None
    args.settings = settings
    try:
        from dispatch.core.jsontext import loads

        data = loads(text) if text.strip() else None
    except ValueError as exc:
        _note(f"the event on stdin is not JSON ({exc}): nothing done", err)
        return None
    if not isinstance(data, dict):
        _note("no event on stdin (expected a JSON object): nothing done", err)
        return None
    named = data.get("hook_event_name")
    event = args.event or (named if named in EVENTS.values() else None)
    if event is None:
        _note(f"event {named!r} is not handled (only {', '.join(EVENTS.values())}): nothing done", err)
        return None
    if args.event and isinstance(named, str) and named != args.event:
        _note(f"called for {args.event} but the event is {named}: nothing done", err)
        return None
    if args.rewake:
        rewake(data, args, err)
        return None
    if event == PRE_TOOL_USE:
        return pre_tool_use(data, args, err)
    if event in (POST_TOOL_USE, POST_TOOL_USE_FAILURE):
        return post_tool_use(data, args, err, event)
    if event == STOP:
        return stop(data, args, err)
    return session_start(data, args, err)


def _project_root(data: dict[str, Any], environ: Mapping[str, str] | None = None) -> str:
    """Where the project is: ``$CLAUDE_PROJECT_DIR`` (set by Claude Code for hook commands), else
    the git top level of the event's ``cwd``."""
    env = os.environ if environ is None else environ
    root = env.get("CLAUDE_PROJECT_DIR")
    if root and os.path.isdir(root):
        return root
    cwd = os.path.abspath(_cwd(data))  # the git top level above it (rewrite.project_root, without
    path = cwd  # importing rewrite and shlex on the light path)
    while not os.path.exists(os.path.join(path, ".git")):
        parent = os.path.dirname(path)
        if parent == path:
            return cwd
        path = parent
    return path


def project_config(data: dict[str, Any], environ: Mapping[str, str] | None = None) -> str | None:
    """The project's ``hosts.toml``, found from the project rather than from the hook's working
    directory (which follows the agent's ``cd``): ``$CLAUDE_PROJECT_DIR`` (Claude Code sets it for
    hook commands), else the git top level of the event's ``cwd``. None: the usual search applies
    (``$HOSTRUN_CONFIG``, ``./hosts.toml``, ``~/.config/hostrun/hosts.toml``)."""
    env = os.environ if environ is None else environ
    if env.get("HOSTRUN_CONFIG"):
        return None
    candidate = os.path.join(_project_root(data, env), "hosts.toml")
    return candidate if os.path.isfile(candidate) else None


def _settings(args: HookArgs, err: TextIO, data: dict[str, Any] | None = None) -> Settings | None:
    if args.settings is not None:
        return args.settings
    from dispatch.config import load_settings
    from dispatch.core.errors import HostrunError

    explicit = args.config or (project_config(data) if data is not None else None)
    try:
        return load_settings(explicit)
    except HostrunError as exc:
        args.problem = f"hostrun's configuration is broken: {exc}"
        _note(f"configuration: {exc}: nothing done", err)
        return None


def _problem_answer(args: HookArgs, event: str) -> dict[str, Any] | None:
    """A broken configuration reaches the user, not only the debug log: a ``systemMessage`` (shown
    to the user) at the first event after the problem appears, once per problem; the hooks do
    nothing until it is fixed, and in guard mode that means heavy commands run unguarded, which is
    said too."""
    problem = args.problem
    if problem is None or not _first_time(problem):
        return None
    off = ("guard mode is OFF until it is fixed: heavy commands run without hostrun's memory cap"
           if args.mode == "guard" else "hostrun's hooks do nothing until it is fixed")
    return {"systemMessage": f"hostrun: {_short(problem, 600)}; {off} (run 'hostrun agents status')"}


def _first_time(problem: str) -> bool:
    """Whether ``problem`` has not been told yet (remembered in the user's cache, by digest, the
    last 50); a cache that cannot be used means telling it every time rather than never."""
    import hashlib

    from dispatch.hooks import hookstate

    digest = hashlib.sha256(problem.encode()).hexdigest()[:16]
    told = hookstate.load("problems-told.json")
    told = [str(d) for d in told] if isinstance(told, list) else []
    if digest in told:
        return False
    hookstate.save("problems-told.json", [*told[-49:], digest])
    return True


def _cwd(data: dict[str, Any]) -> str:
    """The event's ``cwd`` (the agent's shell directory), else this process's."""
    cwd = data.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else os.getcwd()


def _answer(event: str, **fields: Any) -> dict[str, Any]:
    output = {"hookEventName": event}
    output.update({k: v for k, v in fields.items() if v is not None})
    if isinstance(output.get("additionalContext"), str) and len(output["additionalContext"]) > MAX_CONTEXT:
        output["additionalContext"] = output["additionalContext"][: MAX_CONTEXT - 3] + "..."
    return {"hookSpecificOutput": output}


def _alerts(settings: Settings, session: str, event: str, err: TextIO) -> list[str]:
    """This session's unread alerts as lines under a heading for ``event`` (none: no lines), marked
    read: each alert reaches the agent once, at the first event that asks. A cursor that cannot be
    read or written is one line on ``err`` and no alerts (they stay unread)."""
    from dispatch.placement import alerts

    try:
        found = alerts.unread(settings, session, mark=True)
    except Exception as exc:  # an unusable cursor must not stop the agent
        _note(f"could not read the alerts for {session}: {exc}", err)
        return []
    if not found:
        return []
    shown = found[-MAX_ALERTS:]
    lines = [ALERT_HEADINGS[event].format(n=len(found), s="" if len(found) == 1 else "s")]
    if len(found) > len(shown):
        lines.append(f"- ({len(found) - len(shown)} older ones: `hostrun alerts --session {session}`)")
    lines += [f"- {_short(alerts.describe(item), MAX_ALERT_LINE)}" for item in shown]
    return lines


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


# -------------------------------------------------------------------- PreToolUse
def pre_tool_use(data: dict[str, Any], args: HookArgs, err: TextIO) -> dict[str, Any] | None:
    if data.get("tool_name") != "Bash":
        _note(f"tool {data.get('tool_name')!r} is not Bash: nothing to do", err)
        return None
    tool_input = data.get("tool_input")
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if not isinstance(command, str) or not command.strip():
        _note("no tool_input.command in the event: nothing to do", err)
        return None
    settings = _settings(args, err, data)
    if settings is None:
        return _problem_answer(args, PRE_TOOL_USE)
    agents = settings.agents
    cwd = _cwd(data)
    from dispatch.hooks.classify import classify

    verdict = classify(command, cwd, extra_heavy=agents.heavy, extra_light=agents.light,
                       extra_gpu=agents.gpu)
    if not (verdict.heavy or verdict.gpu):
        return None  # light: no answer, the command runs as it is
    if data.get("agent_id") and agents.subagent_suite == "refuse":
        from dispatch.hooks.scope import full_suite

        suite = full_suite(command)
        if suite is not None:
            return _answer(PRE_TOOL_USE, permissionDecision="deny", permissionDecisionReason=(
                f"hostrun: refused: `{_short(suite)}` runs the whole test suite, which is the main "
                "agent's to run (one at a time, with the machine in view), through hostrun or not. "
                "Run the tests of what you changed (e.g. `cargo test -p CRATE`, `pytest "
                "tests/test_x.py`, `-k NAME`), or report back and let the main agent run the suite."))
    return _heavy(data, args, settings, command, cwd, verdict)


def _heavy(data: dict[str, Any], args: HookArgs, settings: Settings, command: str, cwd: str,
           verdict: Verdict) -> dict[str, Any]:
    from dispatch.hooks import rewrite

    mode = args.mode or settings.agents.mode
    session = claude_session(data.get("session_id"))
    direct = not verdict.through_hostrun
    label = rewrite.derive_label(verdict.why, cwd) if direct and mode != "remind" else None
    readings, table_text = _table(settings, label)
    context = [f"hostrun: this command is heavy: {verdict.why}.", table_text]
    if not direct or mode == "remind":
        return _answer(PRE_TOOL_USE, additionalContext="\n".join(context))
    from dispatch.hooks import table

    cap = rewrite.half_rule_cap(table.label_peak(settings, readings),
                                table.slice_limit(settings, readings))
    from dispatch.core.hostfacts import has_nvidia_gpus

    gpu = verdict.gpu and has_nvidia_gpus()
    instead = rewrite.wrapped(command, rewrite.hostrun_argv(args.config), session, label, cap, gpu)
    subagent = bool(data.get("agent_id"))
    if mode == "wrap":
        from dispatch.hooks.permissions import decide

        # As the user's own rules would have it for the original command (dispatch.hooks.permissions):
        # allowed runs without a prompt, would-prompt prompts, would-be-refused is left as it is.
        decision = decide(command, data.get("permission_mode"), _project_root(data))
        if decision == "leave":
            context.insert(1, "hostrun wrap: not rewritten: your permission rules or mode decide "
                              f"this command as it is; to cap it, run: {instead}")
            return _answer(PRE_TOOL_USE, additionalContext="\n".join(context))
        context.insert(1, f"hostrun wrap: it runs through hostrun as: {instead}")
        tool_input = dict(data["tool_input"])
        tool_input["command"] = instead
        return _answer(PRE_TOOL_USE, permissionDecision=decision,
                       permissionDecisionReason=f"hostrun wrap: heavy ({verdict.why}); runs under a "
                                                "memory cap, booked in hostrun's ledger",
                       updatedInput=tool_input, additionalContext="\n".join(context))
    escape = settings.agents.escape_env
    reason = rewrite.escape_reason(command, escape)
    from dispatch.hooks.scope import declaration, kind_of, problems

    decl = declaration(reason) if reason is not None else None
    lacking = problems(decl, kind_of(verdict.why), settings.agents.escape_min) if decl else []
    if decl is not None and not subagent and not lacking:
        said = "; ".join(f"{k}={decl.fields[k]}" for k in ("kind", "target", "extent", "reason"))
        return _answer(PRE_TOOL_USE, additionalContext="\n".join(
            [f"hostrun guard: direct run let through, as declared ({_short(said, 400)})", *context[1:]]))
    shown = instead if len(instead) <= MAX_ECHO else (
        f"{instead[:MAX_ECHO]}… ({len(instead)} characters in all, not repeated here: the same with "
        "your whole command inside `bash -c '…'`)")
    why = [f"hostrun guard: refused: `{_short(command)}` is heavy ({_short(verdict.why)}) and would "
           "run outside hostrun's memory cap. Run it through hostrun instead:", shown]
    if subagent:
        why.append("(Inside a subagent heavy work always runs through hostrun.)")
    elif decl is not None:
        why.append(f"({escape} was given, but its scope declaration has {', '.join(lacking)}: a "
                   "direct run declares kind, target, extent and reason.)")
    return _answer(PRE_TOOL_USE, permissionDecision="deny", permissionDecisionReason="\n".join(why),
                   additionalContext="\n".join(context[1:]))


def _short(command: str, limit: int = 200) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _table(settings: Settings, label: str | None) -> tuple[list[Any], str]:
    """Every host's reading and the table's text (a failure to read is said, not raised)."""
    from dispatch.core.errors import HostrunError
    from dispatch.hooks import table

    try:
        readings = table.read(settings, label)
    except (HostrunError, OSError) as exc:
        return [], f"hostrun resources: could not read: {exc}"
    peers = settings.enable_across_machines and len(settings.hosts) > 1
    return readings, table.text(settings, readings, peers)


# -------------------------------------------------------------------- SessionStart
MODE_LINES = {
    "remind": "before each heavy command you see every host's resources; run heavy work as "
              "`hostrun [-m CAP] -- CMD`.",
    "wrap": "heavy commands are rewritten to run through hostrun (`hostrun ... -- bash -c '...'`).",
    "guard": "heavy commands that do not run through hostrun are refused; run them as "
             "`hostrun [-m CAP] -- CMD`.",
}


def session_start(data: dict[str, Any], args: HookArgs, err: TextIO) -> dict[str, Any] | None:
    from dispatch.hooks import rewrite, session

    name = claude_session(data.get("session_id"))
    if name is None:
        _note("no session_id in the event: nothing to do", err)
        return None
    settings = _settings(args, err, data)
    if settings is None:
        return _problem_answer(args, SESSION_START)
    _export_session(name, err)
    mode = args.mode or settings.agents.mode
    cwd = _cwd(data)
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
    lines += _alerts(settings, name, SESSION_START, err)
    return _answer(SESSION_START, additionalContext="\n".join(lines))


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
        _note(f"could not write HOSTRUN_SESSION to $CLAUDE_ENV_FILE ({path}): {exc.strerror}", err)


# -------------------------------------------------------------------- PostToolUse, Stop
def post_tool_use(data: dict[str, Any], args: HookArgs, err: TextIO, event: str = POST_TOOL_USE
                  ) -> dict[str, Any] | None:
    """The session's unread alerts, once, as ``additionalContext``; nothing unread: no answer. Runs
    after every tool call: loads the config from its cache and the alert cursor, nothing more.

    ``PostToolUseFailure`` (a tool call that failed: a Bash command that exited non-zero, as a job
    hostrun stopped with 250, 254, 246 or 251 does) gets the same answer, so the failed call's own
    alert reaches the agent with the failure itself, not at some later call."""
    if data.get("agent_id"):
        return None  # a subagent's tool call: the alerts wait for the main agent
    lines = _unread(data, args, err, event)
    if args.problem:
        return _problem_answer(args, event)
    return _answer(event, additionalContext="\n".join(lines)) if lines else None


def _unread(data: dict[str, Any], args: HookArgs, err: TextIO, event: str) -> list[str]:
    """The lines of the event's session's unread alerts (marked read), or none."""
    name = claude_session(data.get("session_id"))
    if name is None:
        _note("no session_id in the event: nothing to do", err)
        return []
    settings = _settings(args, err, data)
    return [] if settings is None else _alerts(settings, name, event, err)


REWAKE_POLL = 1.0  # seconds between looks at the alert file while the session is idle
REWAKE_FOR = 3300.0  # the longest a waiter waits (under its installed 3600 s timeout)
REWAKE_POLL_ENV, REWAKE_FOR_ENV = "HOSTRUN_REWAKE_POLL", "HOSTRUN_REWAKE_FOR"  # tests: shorter


class Rewake(Exception):
    """The idle session has alerts: exit 2 with them on stderr (``asyncRewake`` wakes it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def rewake(data: dict[str, Any], args: HookArgs, err: TextIO) -> None:
    """``hostrun hook rewake`` (installed on Stop with ``asyncRewake``: Claude Code runs it in the
    background once the main agent has stopped): wait for an alert addressed to the now idle session
    and wake it with the alert (exit 2, the alert on stderr), so a job killed or a room freed while
    nobody types reaches the agent within a few seconds. One waiter per session: a newer one (the
    next Stop) replaces it, and it ends quietly when the session's next event has read the alerts
    or it has waited ``REWAKE_FOR``. Never while ``stop_hook_active``, nor for a subagent."""
    if data.get("stop_hook_active") or data.get("agent_id"):
        return
    name = claude_session(data.get("session_id"))
    if name is None:
        _note("no session_id in the event: nothing to do", err)
        return
    settings = _settings(args, err, data)
    if settings is None:
        return
    import time

    from dispatch.hooks import hookstate

    marker = os.path.join(hookstate.ensure(), f"rewake-{name}.pid")
    me = f"{os.getpid()}\n"
    with open(marker, "w", encoding="utf-8") as fh:  # the newest waiter of this session
        fh.write(me)
    poll = float(os.environ.get(REWAKE_POLL_ENV) or REWAKE_POLL)
    until = time.monotonic() + float(os.environ.get(REWAKE_FOR_ENV) or REWAKE_FOR)
    try:
        while time.monotonic() < until:
            time.sleep(poll)
            try:
                with open(marker, encoding="utf-8") as fh:
                    if fh.read() != me:
                        return  # a newer Stop's waiter took over
            except OSError:
                return
            lines = _alerts(settings, name, STOP, err)
            if lines:
                raise Rewake("\n".join(lines)[:MAX_CONTEXT])
    finally:
        try:
            with open(marker, encoding="utf-8") as fh:
                mine = fh.read() == me
            if mine:
                os.unlink(marker)
        except OSError:
            pass


def stop(data: dict[str, Any], args: HookArgs, err: TextIO) -> dict[str, Any] | None:
    """Unread alerts block the stop once, with the alerts as the reason Claude continues with. Never
    while ``stop_hook_active``: Claude Code is then already continuing because of a Stop hook, and
    blocking again could loop; the alerts stay unread for the next event."""
    if data.get("stop_hook_active"):
        return None
    lines = _unread(data, args, err, STOP)
    if args.problem:
        return _problem_answer(args, STOP)
    if not lines:
        return None
    reason = "\n".join(lines)
    if len(reason) > MAX_CONTEXT:
        reason = reason[: MAX_CONTEXT - 3] + "..."
    return {"decision": "block", "reason": reason}
