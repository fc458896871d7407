"""``hostrun preflight``, ``hostrun lock``, ``hostrun workdir``: whether a script would run, the
workspace lock, and work-directory ownership."""

from __future__ import annotations

import os

from dispatch.cli.common import load_config, print_lines, say, sub_parser, subaction
from dispatch.core import PROG, ExitCode, UsageError, checked_name, duration, resolve_session

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
    from dispatch.guards import script_path
    from dispatch.local import PreflightResult, Script, check, declared, report_lines

    script = declared(command)  # a malformed header: UsageError (2) naming SCRIPT:LINE
    if script is None:
        path = script_path(command)
        if path is None:
            raise UsageError(f"preflight: {command[0]!r} is not a script file (nor is its first argument)")
        first = 0 if command[0] == path else 1
        verdict = PreflightResult(Script(path, tuple(command[first + 1 :]), ()), ())
    else:
        verdict, _ = check(load_config(config), script, os.environ, force=force)
    if json_out:
        import json

        print(json.dumps(verdict.as_dict(), indent=2))
    else:
        print_lines(report_lines(verdict))
    return 0 if verdict.runs else int(ExitCode.NOT_RUN)


def _status_asked(options: list[str]) -> bool:
    """Whether ``--status`` is lock's own: before a command's first word (``lock DIR tool --status``
    without ``--`` runs ``tool --status`` under the lock)."""
    words = 0
    takes_value = False
    for word in options:
        if takes_value:
            takes_value = False
        elif word == "--status":
            return True
        elif word in ("--wait", "--config"):
            takes_value = True
        elif not word.startswith("-"):
            words += 1
            if words > 1:  # DIR, then the command
                return False
    return False


def cmd_lock(argv: list[str]) -> int:
    """``hostrun lock [--wait DUR] DIR -- CMD`` and ``hostrun lock --status DIR [--json]``."""
    explicit = "--" in argv
    options, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if explicit else (argv, [])
    p = sub_parser("lock", "Run CMD while holding DIR's workspace lock: one holder at a time; others "
                           "wait, saying who holds it. Not the memory cap: for both, "
                           "'hostrun lock DIR -- hostrun -m 4G -- CMD'. See docs/guards.md.")
    p.add_argument("--wait", metavar="DUR", help="give up after waiting DUR (e.g. 10m): exit 78, "
                                                 "the command not run (default: wait as long as it takes)")
    p.add_argument("--status", action="store_true", help="show who holds DIR's lock, run nothing")
    p.add_argument("dir", metavar="DIR", help="the directory to lock")
    # With --status there is no command: options may follow DIR (``--status DIR --json``), so no
    # positional may swallow them; anything left over is a command --status refuses below.
    showing = _status_asked(options)
    if not explicit and not showing:
        p.add_argument("command", nargs="...", metavar="CMD", help="the command (after --)")
    args, extra = p.parse_known_args(options) if showing else (p.parse_args(options), [])
    if not explicit:
        command = extra if showing else args.command
    if showing and any(word.startswith("-") for word in extra):
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
    from dispatch.guards import lock

    if args.status:
        if command or args.wait is not None:
            raise UsageError("--status takes no command and no --wait")
        data = lock.status(args.dir)
        if args.json:
            import json

            print(json.dumps(data, indent=2))
        else:
            print_lines(lock.status_lines(data))
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
    settings = load_config(args.config)
    return lock.run_locked(args.dir, command, say, settings.status_interval, wait,
                           session=resolve_session(None))


def cmd_workdir(argv: list[str]) -> int:
    """``hostrun workdir claim|list|clean``: who owns which work directory."""
    from dispatch.guards import workdirs

    picked = subaction("workdir", argv, {
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
            print_lines([f"{'claimed' if new else 'updated the claim on'} {path} for session "
                         f"{session}: {args.purpose}"])
        if explicit is None:
            say(f"no HOSTRUN_SESSION: claimed for this terminal session, {session!r}; 'workdir clean' "
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
        print_lines(workdirs.clean_lines(data))
    return 0
