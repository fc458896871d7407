"""The ``hostrun`` command: parse, call the library, render, exit. Nothing else lives here.

The run options (``hostrun [OPTIONS] -- CMD``) are parsed by ``dispatch.core.runoptions`` into a
``RunOptions`` record; where an ``--auto``/``--peer`` run goes is ``dispatch.placement.auto.place``'s call.

Errors raised by the library are translated to one ``hostrun: error: …`` line and their exit code
here, once. Heavy imports (pydantic via config validation, rich via ``dispatch.cli.render``) happen only
on the paths that need them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from dispatch import __version__
from dispatch.core.errors import HostrunError, LongJobError, UsageError
from dispatch.core.exitcodes import ExitCode, interrupted, outcome_name
from dispatch.core.runoptions import (
    GPU_AUTO,
    PROG,
    RUN_OPTIONS,
    RunOptions,
    cap_size,
    checked_name,
    duration,
    parse_run_options,
    resolve_session,
    split_command,
    whole_number,
)
from dispatch.core.settings import LOCAL

MYPY = False
if MYPY:
    import argparse
    from typing import Any, NoReturn, TypeVar

    from dispatch.core.outcome import Outcome
    from dispatch.core.request import RunRequest
    from dispatch.placement.dispatcher import Job

    T = TypeVar("T")

SUBCOMMANDS = ("run", "doctor", "codes", "ledger", "report", "dispatch", "alerts", "capacity",
               "lock", "workdir", "preflight", "history", "hook", "agents", "watch", "shims", "shared")
USAGE = (f"{PROG} [RUN OPTIONS] -- CMD [ARGS...]\n       {PROG} {{{','.join(SUBCOMMANDS[1:])}}} ...")


def _argparser(prog: str, description: str) -> argparse.ArgumentParser:
    """argparse (imported only off the hot path), but a usage error is one line and exit 2."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{message} (see '{self.prog} --help')")

    class Formatter(argparse.HelpFormatter):
        """argparse builds a formatter for every ``add_argument``, and the default one imports
        ``shutil`` (with ``bz2``, ``lzma``, ``fnmatch``: ~3 ms) for the terminal width."""

        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: int | None = None) -> None:
            super().__init__(prog, indent_increment, max_help_position,
                             _terminal_columns() - 2 if width is None else width)

    return Parser(prog=prog, description=description, formatter_class=Formatter)


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: ``$COLUMNS``, else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _print_run_help() -> None:
    p = _argparser(PROG, "Run CMD under a memory cap, booked in this host's shared ledger. "
                         f"Subcommands: {', '.join(SUBCOMMANDS[1:])} (each has --help).")
    p.usage = USAGE
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    for opt in RUN_OPTIONS:
        if opt.takes_value:
            p.add_argument(*opt.flags, dest=opt.dest, metavar=opt.metavar, help=opt.help,
                           action="append" if opt.repeat else "store")
        elif opt.optional_value:
            p.add_argument(*opt.flags, dest=opt.dest, nargs="?", help=opt.help,
                           metavar="SPEC" if opt.dest == "long_job" else "NAME")
        else:
            p.add_argument(*opt.flags, dest=opt.dest, action="store_true", help=opt.help)
    p.print_help()


def _sub_parser(name: str, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
    p = _argparser(f"{PROG} {name}", help_text)
    p.add_argument("--config", metavar="PATH", help="configuration file")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


class _PlainArgs:
    """What ``_plain_args`` parsed: the attributes argparse would have set."""


def _plain_args(argv: list[str], switches: Sequence[str], repeated: Sequence[str],
                single: Sequence[str] = ("config",)) -> _PlainArgs | None:
    """The exact long forms (``--json``, ``--host NAME``, ``--host=NAME``) parsed without argparse,
    whose import and parser cost ~7 ms on a command an agent may run before every heavy job. Anything
    else (help, an abbreviation, a value that looks like an option, an unknown word) gives None, and
    argparse parses it all: the answer is the same, and so are the errors."""
    flags = {name: False for name in switches}
    values: dict[str, list[str]] = {name: [] for name in (*repeated, *single)}
    i = 0
    while i < len(argv):
        word, i = argv[i], i + 1
        key, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        dest = key.replace("-", "_")
        if dest in flags and not eq:
            flags[dest] = True
            continue
        if dest not in values:
            return None
        if not eq:
            if i >= len(argv) or argv[i].startswith("-"):
                return None
            value, i = argv[i], i + 1
        values[dest].append(value)
    parsed = _PlainArgs()
    parsed.__dict__.update(flags)
    parsed.__dict__.update({name: values[name] or None for name in repeated})
    parsed.__dict__.update({name: values[name][-1] if values[name] else None for name in single})
    return parsed


def _say(line: str) -> None:
    from dispatch.core.text import printable  # a message may quote a label, a path or a peer's words

    print(f"{PROG}: {printable(line)}", file=sys.stderr, flush=True)


def _print_lines(lines: Sequence[str]) -> None:
    """Lines that quote other sessions' words (lock holders, owners, alerts): escaped first."""
    from dispatch.core.text import printable

    if lines:
        print("\n".join(printable(line) for line in lines), flush=True)


def _settings(config: str | None):  # type: ignore[no-untyped-def]
    from dispatch.config import load_settings

    return load_settings(config)


def cmd_run(argv: list[str]) -> int:
    from dispatch.core.request import RunRequest, enclosing_job

    options, command = split_command(argv)
    if "-h" in options or "--help" in options:
        _print_run_help()
        return 0
    if "--version" in options:
        print(f"{PROG} {__version__}")
        return 0
    opts = parse_run_options(options)
    if not command:
        raise UsageError(f"no command given (usage: {PROG} [OPTIONS] -- CMD [ARGS...])")
    if opts.host is not None:
        if opts.peer or opts.auto:
            raise UsageError("--host NAME says where the job runs: not with --peer or --auto")
        if opts.host != LOCAL:  # any other configured host is run on as --peer=NAME does
            opts = opts._replace(peer=opts.host)
    if (opts.tree or opts.returns or opts.stdin) and not (opts.peer or opts.auto):
        raise UsageError("--tree, --return and --stdin go with --peer or --auto")
    request = RunRequest(
        argv=command, label=opts.label, cap=opts.memory_cap, max_runtime=opts.max_runtime,
        threads=opts.threads, no_cap=opts.no_cap, session=resolve_session(opts.session),
        gpu_memory=opts.gpu_memory if isinstance(opts.gpu_memory, int) else None,
        force=opts.force, group=opts.group, when_idle=opts.when_idle,
    )
    if opts.result_file:
        from dispatch.core.outcome import check_result_path

        problem = check_result_path(opts.result_file)
        if problem is not None:  # before anything runs: the caller would lose the outcome
            raise UsageError(f"--result-file {opts.result_file}: cannot write there: {problem}")
    enclosing = enclosing_job(os.environ)
    try:
        long_rule = opts.long_job_rule and not opts.auto and enclosing is None  # --auto: its own
        if opts.gpu_memory == GPU_AUTO or long_rule:
            opts = _label_rules(command, opts, long_rule)
            request = request._replace(gpu_memory=_gpu_bytes(opts))
        if enclosing is not None:
            from dispatch.local.nested import run_inside

            outcome = run_inside(request, enclosing, keep_outcome=bool(opts.result_file),
                                 settings=lambda: _settings(opts.config), say=_say)
        elif opts.peer or opts.auto:
            return _run_elsewhere(options, command, opts, request)
        else:
            from dispatch.local.runner import run_local

            settings = _settings(opts.config)
            outcome = run_local(settings, request, _say, _peer_watch(settings, options, command, opts))
    except HostrunError as exc:
        if opts.result_file:
            _write_failure(opts.result_file, request, exc)
        raise
    return _finish(outcome, opts)


def _gpu_bytes(opts: RunOptions) -> int | None:
    assert not isinstance(opts.gpu_memory, str), "--gpu-memory auto is resolved first (_label_rules)"
    return opts.gpu_memory


def _label_rules(command: list[str], opts: RunOptions, long_rule: bool) -> RunOptions:
    """What the label's record here decides before the run: ``--gpu-memory auto``'s size (said in
    one line), and with ``long_rule`` the long-job rule's refusal (LongJobError, 244). A run nested
    in a job is not refused: the job around it was admitted as it is."""
    from dispatch.core.text import storable
    from dispatch.local.booking import default_label
    from dispatch.placement import labelrules

    settings = _settings(opts.config)
    record = labelrules.record_here(settings, storable(opts.label or default_label(command)))
    if opts.gpu_memory == GPU_AUTO:
        size, why = labelrules.gpu_memory_auto(settings, record)
        _say(why)
        opts = opts._replace(gpu_memory=size)
    if long_rule:
        refused = labelrules.long_job_here(settings, _job(command, opts), record)
        if refused is not None:
            raise LongJobError("; ".join(refused.reasons))
    return opts


def _peer_watch(settings: Any, options: list[str], command: list[str], opts: RunOptions
                ) -> Callable[[Any], None] | None:
    """While a local job waits, alert once if a peer could take it (only with peers enabled)."""
    if not settings.enable_across_machines or len(settings.hosts) < 2:
        return None  # the common case: no import of the dispatcher on the hot path
    from dispatch.placement.auto import PeerWatch

    return PeerWatch(settings, _job(command, opts), options, command, _say,
                     session=resolve_session(opts.session))


def _job(command: list[str], opts: RunOptions) -> Job:
    from dispatch.placement.auto import make_job

    return make_job(command, label=opts.label, cap=opts.memory_cap,
                    gpu_memory=_gpu_bytes(opts), expect_duration=opts.expect_duration,
                    long_job=opts.long_job)


def _run_elsewhere(options: list[str], command: list[str], opts: RunOptions,
                   request: RunRequest) -> int:
    """``--auto`` (run where the dispatcher decides) and ``--peer``: the library places, we run."""
    from dispatch.placement.sent import forget_sent, place_on_peer

    settings = _settings(opts.config)
    if opts.peer:
        from dispatch.local.booking import default_label

        placed = place_on_peer(settings, opts.peer, request.label or default_label(command),
                               opts.memory_cap, _gpu_bytes(opts), by_host=opts.host is not None)
    else:
        from dispatch.placement.auto import place

        placed = place(settings, _job(command, opts))
        for reason in placed.reasons:
            _say(f"dispatch: {reason}")
        if placed.refused is not None:
            code = ExitCode(placed.refused)
            _say(f"exit {code.value} ({code.outcome}): {code.meaning}")
            return code.value
    from dispatch.hosts.base import RunExtras

    host = placed.host
    assert host is not None
    try:
        watch = _peer_watch(settings, options, command, opts) if host.is_here else None
        return _finish(host.run(request, _say, RunExtras(tree=opts.tree, returns=opts.returns,
                                                         stdin=opts.stdin, watch=watch)), opts)
    finally:
        forget_sent(settings, placed.note)


def _finish(outcome: Outcome, opts: RunOptions) -> int:
    """Say what happened, write the result file, and return the exit code."""
    if outcome.message:
        _say(outcome.message)
    if outcome.outcome not in ("exit", "signal"):  # hostrun's own verdict, not the job's status
        try:
            code = ExitCode(outcome.exit_code)
            _say(f"exit {code.value} ({code.outcome}): {code.meaning}")
        except ValueError:
            pass
    if opts.result_file:
        from dispatch.core.outcome import write_result

        try:
            write_result(opts.result_file, outcome)
        except OSError as exc:  # the job's own exit status still stands
            _say(f"warning: could not write the result file {opts.result_file}: {exc.strerror}")
    return outcome.exit_code


def cmd_dispatch(argv: list[str]) -> int:
    """Print where a job would run, and why, without running it."""
    options, command = split_command(argv)
    json_out = "--json" in options
    options = [o for o in options if o != "--json"]
    if "-h" in options or "--help" in options:
        print(f"usage: {PROG} dispatch [--json] [RUN OPTIONS] -- CMD [ARGS...]\n\n"
              "Print where CMD would run and why (the dispatcher's rules), without running it.")
        return 0
    opts = parse_run_options(options)
    if not command:
        raise UsageError(f"no command given (usage: {PROG} dispatch [--json] [OPTIONS] -- CMD)")
    from dispatch.placement.auto import consider

    if opts.gpu_memory == GPU_AUTO:
        opts = _label_rules(command, opts, long_rule=False)
    decision = consider(_settings(opts.config), _job(command, opts))
    if json_out:
        import json

        print(json.dumps(decision.as_dict(), indent=2))
    else:
        from dispatch.cli import render

        render.decision(decision)
    return 0 if decision.action != "refuse" else int(decision.exit_code)


PREFLIGHT_USAGE = f"{PROG} preflight [--json] [--force] [--config PATH] SCRIPT [ARGS...]"


def cmd_preflight(argv: list[str]) -> int:
    """Whether SCRIPT would run, and why, from its '# admission:'/'# run-condition:' headers."""
    json_out = force = False
    config: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg in ("-h", "--help"):
            print(f"usage: {PREFLIGHT_USAGE}\n\nSay whether SCRIPT would run, and why, from the "
                  "conditions it declares ('# admission:', '# run-condition:'), without running it.\n"
                  "Exit 0: it would run; 78: it would not (an unmet condition, or nothing to do);\n"
                  "2: a malformed header. See docs/preflight.md.")
            return 0
        if arg == "--json":
            json_out = True
        elif arg == "--force":
            force = True
        elif arg == "--config" and i + 1 < len(argv):
            config = argv[i + 1]
            i += 1
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        else:
            raise UsageError(f"unrecognized arguments: {arg} (see '{PROG} preflight --help')")
        i += 1
    command = argv[i:]
    if not command:
        raise UsageError(f"no script given (usage: {PREFLIGHT_USAGE})")
    from dispatch.guards.headers import script_path
    from dispatch.local.preflight import Script, Verdict, check, declared, report_lines

    script = declared(command)  # a malformed header: UsageError (2) naming SCRIPT:LINE
    if script is None:
        path = script_path(command)
        if path is None:
            raise UsageError(f"preflight: {command[0]!r} is not a script file (nor is its first argument)")
        first = 0 if command[0] == path else 1
        verdict = Verdict(Script(path, tuple(command[first + 1 :]), ()), ())
    else:
        verdict, _ = check(_settings(config), script, os.environ, force=force)
    if json_out:
        import json

        print(json.dumps(verdict.as_dict(), indent=2))
    else:
        _print_lines(report_lines(verdict))
    return 0 if verdict.runs else int(ExitCode.NOT_RUN)


def cmd_alerts(argv: list[str]) -> int:
    p = _sub_parser("alerts", "List alerts: a job waiting long or that a peer could take now, a job "
                              "killed at its own cap or in a full slice, a peer that could not be "
                              "reached. See docs/agents.md.")
    p.add_argument("--follow", action="store_true", help="wait for new alerts and print each")
    p.add_argument("--session", metavar="NAME", type=checked_name("--session"),
                   help="only alerts for this session (and for every session); with --unread/--ack "
                        "the session whose read cursor moves (default: $HOSTRUN_SESSION)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--unread", action="store_true",
                      help="print this session's alerts not read yet, and mark them read")
    mode.add_argument("--ack", action="store_true",
                      help="mark this session's alerts read without printing them")
    args = p.parse_args(argv)
    from dispatch.placement import alerts

    settings = _settings(args.config)
    path = settings.alerts_path
    if args.unread or args.ack:
        session = resolve_session(args.session)
        if session is None:
            raise UsageError(f"--{'unread' if args.unread else 'ack'} needs a session: pass --session "
                             "NAME or set HOSTRUN_SESSION")
        if args.follow:
            raise UsageError("--follow does not go with --unread or --ack")
        records = alerts.unread(settings, session, mark=True)
        if args.ack:
            return 0
    elif args.follow:
        import json

        for record in alerts.follow(path):
            if not alerts.addressed_to(record, args.session):
                continue
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                _print_lines([_alert_line(record)])
        return 0
    else:
        records = [r for r in alerts.read_all(path) if alerts.addressed_to(r, args.session)]
    if args.json:
        import json

        print(json.dumps(records, indent=2))
    else:
        _print_lines([alerts.describe(record) if args.unread else _alert_line(record)
                      for record in records])
    return 0


def cmd_watch(argv: list[str]) -> int:
    p = _sub_parser("watch", "Follow the alert file and run CMD for each new alert (its JSON on "
                             "stdin), or print it. One per state directory; SIGTERM/SIGINT end it. "
                             "See docs/agents.md.")
    p.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                   help="run CMD (split like a shell would, run without one) per alert")
    p.add_argument("--session", metavar="NAME", type=checked_name("--session"),
                   help="only alerts for this session (and for every session)")
    args = p.parse_args(argv)
    from dispatch.placement.watchdog import parse_exec, watch

    exec_argv = parse_exec(args.exec_cmd)
    return watch(_settings(args.config), exec_argv, args.session, args.json, _say,
                 lambda line: print(line, flush=True))


def _action(name: str, argv: list[str], actions: dict[str, str], args_usage: str, title: str,
            lines: tuple[str, ...], json_for: tuple[str, ...] | None = None
            ) -> tuple[str, argparse.ArgumentParser, list[str]] | None:
    """``hostrun NAME ACTION ...``: the action, its parser (``actions[ACTION]`` is its description;
    ``--json`` for the actions in ``json_for``, all when None) and the rest of argv; None after
    printing the help (``-h``); a missing or unknown action is a UsageError naming the actions."""
    if argv and argv[0] in actions:
        action = argv[0]
        parser = _sub_parser(f"{name} {action}", actions[action],
                             json_flag=json_for is None or action in json_for)
        return action, parser, argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} {name} {{{','.join(actions)}}} {args_usage}\n\n{title}:\n"
              + "\n".join(f"  {line}" for line in lines))
        return None
    raise UsageError(f"{name}: choose one of {', '.join(actions)} (see '{PROG} {name} --help')")


def cmd_shims(argv: list[str]) -> int:
    """``hostrun shims install|uninstall|list DIR``: PATH wrappers that route heavy tool runs."""
    from dispatch.hooks import shims

    picked = _action("shims", argv, {
        "install": "Write a wrapper per tool into DIR: a heavy invocation runs through hostrun, a light "
                   "one runs the real tool (found further along PATH) directly.",
        "uninstall": "Remove hostrun's wrappers from DIR (files hostrun did not write are kept).",
        "list": "hostrun's wrappers in DIR, and the real tool each would run now.",
    }, "DIR ...", "PATH shims for agents and scripts without hooks (docs/agents.md)", (
        "install DIR [--tools a,b]   write a wrapper per tool in DIR (put DIR first on PATH)",
        "uninstall DIR               remove hostrun's wrappers from DIR, nothing else",
        "list DIR [--json]           hostrun's wrappers in DIR and the tool each one runs"),
        json_for=("list",))
    if picked is None:
        return 0
    action, p, rest = picked
    p.add_argument("dir", metavar="DIR")
    if action == "install":
        p.add_argument("--tools", metavar="A,B,...",
                       help=f"the tools to wrap (default: {','.join(shims.DEFAULT_TOOLS)})")
    args = p.parse_args(rest)
    if action == "install":
        tools = shims.parse_tools(args.tools)
        _print_lines([f"installed {path}" for path in shims.install(args.dir, tools)])
        _say(f"put {os.path.abspath(args.dir)} first on PATH (export PATH={os.path.abspath(args.dir)}"
             ":$PATH) for the commands that should go through hostrun")
        return 0
    if action == "uninstall":
        _print_lines([f"removed {path}" for path in shims.uninstall(args.dir)])
        return 0
    found = shims.listing(args.dir)
    if args.json:
        import json

        print(json.dumps(found, indent=2))
    else:
        _print_lines([f"{row['tool']}: {row['path']} -> {row['real'] or 'no real tool on PATH'}"
                      for row in found])
    return 0


def _alert_line(record: dict[str, Any]) -> str:
    import time as _time

    when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(record.get("time", 0)))
    return f"{when} {record.get('kind', '?')}: {record.get('message', '')}"


def _write_failure(path: str, request: RunRequest, exc: HostrunError) -> None:
    """A caller never has to guess from a number: hostrun's own refusals get a result file too."""
    from dispatch.core.outcome import Outcome, write_result
    from dispatch.local.booking import default_label

    argv = list(request.argv)
    try:
        write_result(path, Outcome(
            exit_code=int(exc.exit_code), outcome=outcome_name(exc.exit_code), host=exc.host or "local",
            label=request.label or default_label(argv), argv=argv, message=str(exc),
        ))
    except OSError as error:
        _say(f"warning: could not write the result file {path}: {error.strerror}")


def cmd_codes(argv: list[str]) -> int:
    args = _sub_parser("codes", "Print hostrun's exit-code table.").parse_args(argv)
    rows = [(c.value, c.outcome, c.meaning) for c in ExitCode]
    if args.json:
        import json

        print(json.dumps([{"code": c, "name": n, "meaning": m} for c, n, m in rows], indent=2))
        return 0
    from dispatch.cli import render

    render.codes(rows)
    return 0


def cmd_ledger(argv: list[str]) -> int:
    args = _sub_parser("ledger", "Show running jobs, the queue and the peak table.").parse_args(argv)
    from dispatch.local.booking import mark_reasons
    from dispatch.local.hostslice import live_jobs_of, outside_the_slice
    from dispatch.local.ledger import Ledger

    settings = _settings(args.config)
    ledger = Ledger(settings.state_dir, _say, live_jobs_of(settings))
    try:
        bookings, peaks = ledger.bookings(), ledger.peaks()
    finally:
        ledger.close()
    from dispatch.core.procinfo import is_alive

    # Read only: a booking whose holder is gone is shown as stale; the next admission reclaims it.
    stale = {b.id for b in bookings if not is_alive(b.pid, b.pid_start)}
    invalid = outside_the_slice(settings, bookings)
    if args.json:
        import json

        def row(b: Any) -> dict[str, Any]:
            return {**b._asdict(), "stale": b.id in stale,
                    "invalid": INVALID_CGROUP if b.id in invalid else None}

        print(json.dumps({
            "running": [row(b) for b in bookings if b.state == "running"],
            "queue": [row(b) for b in bookings if b.state == "waiting"],
            "peaks": [{**p._asdict(), "clear_mark_after": settings.clear_mark_after,
                       "marked_because": mark_reasons(p, settings.clear_mark_after)} for p in peaks],
        }, indent=2))
        return 0
    from dispatch.cli import render

    render.ledger(bookings, peaks, stale, invalid, settings.clear_mark_after)
    return 0


def _limit(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise ValueError(f"must be 0 (all) or more: {value}")
    return value


def _option_value(option: str, text: str, parse: Callable[[str], T]) -> T:
    """``text`` as ``parse`` reads it; its ValueError, which says what is wrong with the value, becomes
    the usage error (argparse's own ``type=`` would print only the parser function's name)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise UsageError(f"argument {option}: {exc}") from None


def cmd_history(argv: list[str]) -> int:
    p = _sub_parser("history", "Finished runs from this host's ledger, oldest first: start, end, "
                               "duration, host, label, session, command, cap, booking, peak, exit "
                               "code and outcome, hit-ceiling. See docs/cli.md.")
    p.add_argument("--label", metavar="LABEL", help="only runs with this label")
    p.add_argument("--host", metavar="NAME", help="only runs on this host (local, or a peer's name)")
    p.add_argument("--session", metavar="NAME", help="only runs of this session")
    p.add_argument("--since", metavar="T", help="only runs that ended since T: a duration ago (2h, "
                                                "7d) or an ISO date/time (2024-05-01T14:30)")
    p.add_argument("--limit", metavar="N", default="50",
                   help="only the latest N runs (default: %(default)s; 0: all)")
    args = p.parse_args(argv)
    from dispatch.local.history import since_time

    since = None if args.since is None else _option_value("--since", args.since, since_time)
    limit = _option_value("--limit", args.limit, _limit)
    from dispatch.local.hostslice import live_jobs_of
    from dispatch.local.ledger import Ledger

    settings = _settings(args.config)
    ledger = Ledger(settings.state_dir, _say, live_jobs_of(settings))
    try:
        runs = ledger.runs(label=args.label, host=args.host, session=args.session, since=since,
                           limit=limit)
    finally:
        ledger.close()
    if args.json:
        import json

        from dispatch.local.history import as_dict

        print(json.dumps([as_dict(r) for r in runs], indent=2))
        return 0
    from dispatch.cli import render

    render.history(runs)
    return 0


INVALID_CGROUP = "cgroup outside the slice"


def _check_hosts(settings: Any, names: list[str] | None) -> None:
    for name in names or []:
        if name not in settings.hosts:
            raise UsageError(f"--host {name}: no such host (configured: {', '.join(settings.hosts)})")


def _readings_status(settings: Any, readings: list[Any]) -> int:
    """``report``'s and ``capacity``'s exit code: 78 when this host's own report failed (e.g. a forced
    backend), else 246 when a peer's did, else 0."""
    from dispatch.hosts.kinds import host_for

    if any(not r.ok and host_for(settings, r.host).is_here for r in readings):
        return int(ExitCode.NOT_RUN)
    return 0 if all(r.ok for r in readings) else int(ExitCode.PEER_UNREACHABLE)


def cmd_report(argv: list[str]) -> int:
    args: Any = _plain_args(argv, switches=("json",), repeated=("host",))
    if args is None:
        p = _sub_parser("report", "Every configured host's memory, slice, bookings, load, GPUs and "
                                  "queue, read in parallel within the configured deadlines.")
        p.add_argument("--host", action="append", metavar="NAME", help="only this host (repeatable)")
        args = p.parse_args(argv)
    from dispatch.placement.reports import read_reports

    settings = _settings(args.config)
    _check_hosts(settings, args.host)
    readings = read_reports(settings, args.host)
    if args.json:
        import json

        print(json.dumps({"hosts": [
            {"host": r.host, "ok": r.ok, "error": r.error, "elapsed_s": round(r.elapsed, 3),
             "report": r.report} for r in readings]}, indent=2))
    else:
        from dispatch.cli import render

        render.readings(readings)
    return _readings_status(settings, readings)


def cmd_capacity(argv: list[str]) -> int:
    p = _sub_parser("capacity", "For each label in each host's own peak table: how many fit on that "
                                "host at once, the cap it should have by the half rule (worst peak <= "
                                "half the cap, rounded up to 512 MiB), and flags. See docs/capacity.md.")
    p.add_argument("--host", action="append", metavar="NAME", help="only this host (repeatable)")
    p.add_argument("--slice", metavar="SIZE", help="also show how many would fit if each host's slice "
                                                   "were SIZE (e.g. 40G)")
    args = p.parse_args(argv)
    what_if = None if args.slice is None else _option_value("--slice", args.slice, cap_size)
    from dispatch.local.capacity import host_capacity, rules
    from dispatch.placement.reports import read_reports

    settings = _settings(args.config)
    _check_hosts(settings, args.host)
    readings = read_reports(settings, args.host, peaks=True)
    hosts = [host_capacity(r.host, r.report, r.error, what_if) for r in readings]
    if args.json:
        import json

        print(json.dumps({"what_if_slice": what_if, "rules": rules(),
                          "hosts": [h.as_dict() for h in hosts]}, indent=2))
    else:
        from dispatch.cli import render

        render.capacity(hosts)
    return _readings_status(settings, readings)


def cmd_doctor(argv: list[str]) -> int:
    args = _sub_parser("doctor", "Which memory-cap backend is active, and why the others are not.",
                       ).parse_args(argv)
    from dispatch.cli.doctor import diagnose, diagnose_peers

    settings = _settings(args.config)
    data = diagnose(settings)
    data["peers"] = diagnose_peers(settings)
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return 0
    from dispatch.cli import render

    render.doctor(data)
    return 0


def cmd_lock(argv: list[str]) -> int:
    """``hostrun lock [--wait DUR] DIR -- CMD`` and ``hostrun lock --status DIR [--json]``."""
    explicit = "--" in argv
    options, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if explicit else (argv, [])
    p = _sub_parser("lock", "Run CMD while holding DIR's workspace lock: one holder at a time; others "
                            "wait, saying who holds it. Not the memory cap: for both, "
                            "'hostrun lock DIR -- hostrun -m 4G -- CMD'. See docs/guards.md.")
    p.add_argument("--wait", metavar="DUR", help="give up after waiting DUR (e.g. 10m): exit 78, "
                                                 "the command not run (default: wait as long as it takes)")
    p.add_argument("--status", action="store_true", help="show who holds DIR's lock, run nothing")
    p.add_argument("dir", metavar="DIR", help="the directory to lock")
    if not explicit:
        p.add_argument("command", nargs="...", metavar="CMD", help="the command (after --)")
    args = p.parse_args(options)
    if not explicit:
        command = args.command
    from dispatch.guards import lock

    if args.status:
        if command or args.wait is not None:
            raise UsageError("--status takes no command and no --wait")
        data = lock.status(args.dir)
        if args.json:
            import json

            print(json.dumps(data, indent=2))
        else:
            _print_lines(lock.status_lines(data))
        return 0
    if args.json:
        raise UsageError("--json goes with --status")
    if not command:
        raise UsageError(f"no command given (usage: {PROG} lock [--wait DUR] DIR -- CMD [ARGS...])")
    wait = None
    if args.wait is not None:
        try:
            wait = duration(args.wait)
        except ValueError as exc:
            raise UsageError(f"argument --wait: {exc}") from None
    settings = _settings(args.config)
    return lock.run_locked(args.dir, command, _say, settings.status_interval, wait,
                           session=resolve_session(None))


def cmd_workdir(argv: list[str]) -> int:
    """``hostrun workdir claim|list|clean``: who owns which work directory."""
    from dispatch.guards import workdirs

    picked = _action("workdir", argv, {
        "claim": "Claim DIR (created if missing) for this session: writes DIR/.hostrun-owner.",
        "list": "Every claimed directory under ROOT: owner, purpose, age, size, open by.",
        "clean": "Remove this session's claimed directories under ROOT that no process has open; "
                 "keep every other one and say why.",
    }, "...", "Work-directory ownership (docs/guards.md)", (
        "claim DIR --purpose TEXT    write DIR/.hostrun-owner for this session",
        "list [ROOT] [--json]        claimed directories: owner, age, size, open by",
        "clean [ROOT] [--dry-run]    remove this session's claimed directories that no process has "
        "open"))
    if picked is None:
        return 0
    action, p, rest = picked
    if action == "claim":
        p.add_argument("dir", metavar="DIR")
        p.add_argument("--purpose", required=True, metavar="TEXT", help="what the directory is for")
    else:
        p.add_argument("root", metavar="ROOT", nargs="?", default=".",
                       help="where to look (default: the current directory)")
        p.add_argument("--depth", type=int, default=workdirs.DEFAULT_DEPTH, metavar="N",
                       help="levels below ROOT to search (default: %(default)s)")
    if action != "list":
        p.add_argument("--session", metavar="NAME", type=checked_name("--session"),
                       help="who is asking (default: $HOSTRUN_SESSION)")
    if action == "clean":
        p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    args = p.parse_args(rest)
    import json

    if action == "claim":
        explicit = args.session or resolve_session(None)
        session = explicit or workdirs.fallback_session()
        path, owner, new = workdirs.claim(args.dir, args.purpose, session)
        if args.json:
            print(json.dumps({"path": path, "new": new, **owner.as_dict()}, indent=2))
        else:
            _print_lines([f"{'claimed' if new else 'updated the claim on'} {path} for session "
                          f"{session}: {args.purpose}"])
        if explicit is None:
            _say(f"no HOSTRUN_SESSION: claimed for this terminal session, {session!r}; 'workdir clean' "
                 f"removes it only with HOSTRUN_SESSION={session} (or --session)")
        return 0
    if action == "list":
        data = workdirs.list_claimed(args.root, args.depth, session=workdirs.explicit_session())
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            from dispatch.cli import render

            render.workdirs(data)
        return 0
    asking = args.session or resolve_session(None)
    if asking is None:
        raise UsageError("workdir clean needs to know which session is asking: set HOSTRUN_SESSION or "
                         "pass --session NAME ('workdir list' shows each directory's owner)")
    data = workdirs.clean(args.root, asking, args.depth, args.dry_run)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        _print_lines(workdirs.clean_lines(data))
    return 0


def cmd_shared(argv: list[str]) -> int:
    """``hostrun shared status|install|uninstall``: one slice and one queue for a group of users."""
    picked = _action("shared", argv, {
        "status": "Every user's bookings on this machine's shared slice.",
        "install": "As root: set up a shared slice for a group (a socket unit and its root daemon).",
        "uninstall": "As root: stop the shared slice's daemon (its running jobs are killed) and "
                     "remove its units.",
    }, "...", "A shared slice for several users (docs/backends.md#several-users-one-machine)", (
        "status [--json]                      every user's bookings on the shared slice",
        "install --group G --size SIZE        as root: one slice of SIZE for the members of G",
        "uninstall                            as root: stop the daemon, remove its units"),
        json_for=("status",))
    if picked is None:
        return 0
    action, p, rest = picked
    if action == "install":
        p.add_argument("--group", required=True, help="the group whose members share the slice")
        p.add_argument("--size", required=True, type=cap_size,
                       help="the slice's memory limit (e.g. 24G)")
        p.add_argument("--slice", default="hostrun.slice", help="the slice unit (default: %(default)s)")
    args = p.parse_args(rest)
    if action == "install":
        from dispatch.local.sharedinstall import install

        install(args.group, args.size, args.slice, _say)
        return 0
    if action == "uninstall":
        from dispatch.local.sharedinstall import uninstall

        uninstall(_say)
        return 0
    from dispatch.capping.shared import listing, listing_lines

    data = listing()
    if args.json:
        import json

        print(json.dumps(data, indent=2))
    else:
        _print_lines(listing_lines(data))
    return 0


def cmd_hook(argv: list[str]) -> int:
    """``hostrun hook EVENT``: a coding agent's hook (dispatch.hooks.claude); always exits 0."""
    from dispatch.hooks.claude import main as hook_main

    return hook_main(argv)


def cmd_agents(argv: list[str]) -> int:
    """``hostrun agents install|uninstall|status``: the hooks in Claude Code's settings."""
    from dispatch.hooks.install import main as agents_main

    return agents_main(argv, _say)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("-h", "--help"):
            _print_run_help()
            return 0
        leading: list[str] = []  # "hostrun --config X ledger" as well as "hostrun ledger --config X"
        while args and (args[0] == "--config" or args[0].startswith("--config=")):
            take = 2 if args[0] == "--config" else 1
            leading, args = leading + args[:take], args[take:]
        if args and args[0] in SUBCOMMANDS:
            name = args[0]
            # Run-style commands end in "-- CMD": their options must come before it.
            rest = leading + args[1:] if name in ("run", "dispatch", "lock", "preflight") \
                else args[1:] + leading
            if name == "run":
                return cmd_run(rest)
            handler = {"doctor": cmd_doctor, "codes": cmd_codes, "ledger": cmd_ledger,
                       "lock": cmd_lock, "workdir": cmd_workdir,
                       "report": cmd_report, "dispatch": cmd_dispatch, "alerts": cmd_alerts,
                       "capacity": cmd_capacity, "preflight": cmd_preflight,
                       "history": cmd_history, "hook": cmd_hook, "agents": cmd_agents,
                       "watch": cmd_watch, "shims": cmd_shims, "shared": cmd_shared}[name]
            return handler(rest)
        return cmd_run(leading + args)
    except HostrunError as exc:
        from dispatch.core.text import printable

        print(f"{PROG}: error: {printable(str(exc))}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        import signal

        return interrupted(signal.SIGINT)
    except BrokenPipeError:
        import signal

        return interrupted(signal.SIGPIPE)
